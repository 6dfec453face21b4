"""Key/value cache for causal decoding: the rotated keys and values of past tokens make a step O(n). It is
preallocated and holds only the ``num_kv_heads`` heads, so it is exactly
``2 * layers * num_kv_heads * head_dim * max_tokens * batch * bytes_per_element`` (GQA shrinks it)."""

from __future__ import annotations

import torch


class LayerKVCache:
    """One layer's view of a :class:`KVCache`: appends new keys/values and returns all so far."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.keys = keys  # [B, n_kv, max_tokens, head_dim], a view into the shared store
        self.values = values
        self.length = 0

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``k, v [B, n_kv, n, head_dim]`` after the cached tokens; return keys/values so far."""
        start, end = self.length, self.length + k.shape[-2]
        if end > self.keys.shape[-2]:
            raise RuntimeError(
                f"KV cache is full: {start} tokens cached, {k.shape[-2]} more do not fit in "
                f"max_tokens={self.keys.shape[-2]}; create the cache with a larger max_tokens"
            )
        if k.shape[:2] != self.keys.shape[:2] or k.shape[-1] != self.keys.shape[-1]:
            raise ValueError(
                f"keys of shape {tuple(k.shape)} do not fit a cache of "
                f"[batch, n_kv_heads, tokens, head_dim] = {tuple(self.keys.shape)}"
            )
        self.keys[:, :, start:end] = k
        self.values[:, :, start:end] = v
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]


class KVCache:
    """Preallocated keys and values of ``num_layers`` layers; pass ``cache.layers[i]`` to block ``i``."""

    def __init__(
        self,
        num_layers: int,
        batch_size: int,
        num_kv_heads: int,
        head_dim: int,
        max_tokens: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        shape = (num_layers, batch_size, num_kv_heads, max_tokens, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.layers = [LayerKVCache(self.keys[i], self.values[i]) for i in range(num_layers)]

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes

    @property
    def length(self) -> int:
        """Tokens cached so far (by the last layer to be updated)."""
        return self.layers[-1].length
