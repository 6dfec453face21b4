"""Record attention and block outputs of a ViT5 forward pass (the most recent one).

Each chosen block hands its ``recorder`` the queries and keys (after QK-Norm and RoPE, grouped
heads expanded) and keeps its fused kernel for the output. :func:`summarise_attention` walks the
queries chunk by chunk with one fp32 softmax and keeps what an :class:`AttentionKeep` asks for:
the rows of chosen tokens, the attention each key receives, per-query entropy and largest weight.
No block holds ``N x N`` for more than one chunk; a full capture keeps every row. Block outputs
are the residual stream before the final norm, where high-norm artifacts are measured (Darcet et
al., arXiv 2309.16588, sec. 2.1)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from vit5.errors import InputError, Rule, rule_problems
from vit5.model.layout import TokenLayout
from vit5.model.vit import take_indices, unwrap_model

# bytes of the three fp32 [heads, chunk, keys] arrays of one query chunk (query_chunk)
CHUNK_BYTES = 64 * 2**20
CHUNK_ARRAYS = 3  # scores / probabilities, and one temporary of the reduction (entropy)

_KEEP_RULES = (
    Rule(
        "chunk",
        lambda v: isinstance(v, int) and v >= 1,
        "a positive number of query rows (null: as many as fit in CHUNK_BYTES), or null",
    ),
    Rule(
        "rows",
        lambda v: all(isinstance(i, int) and i >= 0 for i in v),
        "token indices >= 0 (a tuple), or null for every row",
    ),
    Rule(
        "mass_to",
        lambda v: all(isinstance(i, int) and i >= 0 for i in v),
        "token indices >= 0 (a tuple)",
    ),
)


@dataclass(frozen=True)
class AttentionKeep:
    """What a recording keeps of a block's attention ``A = softmax(q k^T * scale)``
    ``[B, H, N, N]`` (query rows, key columns).

    ``rows``: the query tokens whose whole row is kept (CLS, registers, chosen patches), or
    ``None`` for every row, the full matrix (:meth:`full`). ``received``: the attention each key
    receives, averaged over all N queries. ``mass_to``: key tokens whose summed attention is kept
    for every query (e.g. the registers). ``head_stats``: each query row's entropy and largest
    weight. ``inputs``: q and k themselves, for products across blocks (attention rollout).
    ``chunk``: query rows per softmax chunk; a chunk holds three ``[H, chunk, N]`` fp32 arrays;
    ``None``: as many rows as fit in :data:`CHUNK_BYTES` (:func:`query_chunk`)."""

    rows: tuple[int, ...] | None = ()
    received: bool = True
    mass_to: tuple[int, ...] = ()
    head_stats: bool = True
    inputs: bool = False
    chunk: int | None = None

    def __post_init__(self) -> None:
        values = {
            "chunk": self.chunk,
            "rows": self.rows if self.rows is not None else (),
            "mass_to": self.mass_to,
        }
        problems = rule_problems(values, _KEEP_RULES)
        if problems:
            raise InputError(f"AttentionKeep: {problems[0]}")

    @classmethod
    def full(cls, chunk: int | None = None) -> AttentionKeep:
        """Every row: the full ``[B, H, N, N]`` probabilities (memory grows as N squared)."""
        return cls(rows=None, received=False, head_stats=False, chunk=chunk)

    def chunk_for(self, heads: int, keys: int) -> int:
        """Query rows per chunk for ``heads`` heads over ``keys`` keys: ``chunk``, or fitted."""
        return self.chunk or query_chunk(heads, keys)

    @property
    def every_row(self) -> bool:
        return self.rows is None

    @property
    def needs_all_queries(self) -> bool:
        """Whether every query row must be computed (not only the kept rows)."""
        per_query = self.received or self.head_stats or bool(self.mass_to)
        return self.every_row or per_query


@dataclass
class AttentionSummary:
    """One block's attention ``A [B, H, N, M]`` as an :class:`AttentionKeep` kept it (fp32,
    detached; M = N keys without a cache). Per query q and key k:

    - ``rows [B, H, R, M]``: ``A[q, :]`` for the R tokens of ``row_index``;
    - ``received [B, H, M]``: ``(1/N) sum_q A[q, k]``, the plain mean over all N query rows
      (CLS and registers included, rows not reweighted);
    - ``mass_to [B, H, N]``: ``sum over the keep's keys k of A[q, k]``;
    - ``entropy [B, H, N]``: ``-sum_k A[q, k] ln A[q, k]`` (nats); a head's entropy is its mean;
    - ``peak [B, H, N]``: ``max_k A[q, k]``; a head's sink strength is ``received.max(-1)``;
    - ``q [B, H, N, d]``, ``k [B, H, M, d]``, ``scale``: the inputs, when kept."""

    num_queries: int
    row_index: tuple[int, ...]
    rows: torch.Tensor | None = None
    received: torch.Tensor | None = None
    mass_to: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    peak: torch.Tensor | None = None
    q: torch.Tensor | None = None
    k: torch.Tensor | None = None
    scale: float | None = None

    @property
    def is_full(self) -> bool:
        return self.row_index == tuple(range(self.num_queries))

    def row(self, token: int) -> torch.Tensor:
        """The attention row ``[B, H, M]`` of query ``token`` (kept by ``rows``)."""
        if token not in self.row_index:
            raise KeyError(
                f"the attention row of token {token} was not kept (kept: "
                f"{list(self.row_index)[:8]}): add it to AttentionKeep(rows=...)"
            )
        return self.rows[:, :, self.row_index.index(token)]

    def full(self) -> torch.Tensor:
        """The whole ``[B, H, N, M]`` probabilities (a capture with ``AttentionKeep.full()``)."""
        if not self.is_full:
            raise KeyError(
                f"this recording kept {len(self.row_index)} of {self.num_queries} attention rows, "
                "not the full matrix: record with keep=AttentionKeep.full()"
            )
        return self.rows


def query_chunk(heads: int, keys: int, budget: int = CHUNK_BYTES) -> int:
    """The most query rows whose :data:`CHUNK_ARRAYS` fp32 ``[heads, rows, keys]`` arrays fit in
    ``budget`` bytes (at least one): 227 rows at 6 heads over 4,100 keys (1024 px), 56 over
    16,385 (2048 px). Fewer rows cost only Python steps; the softmax is the same."""
    per_row = CHUNK_ARRAYS * heads * keys * 4
    return max(1, budget // per_row)


def probability_chunks(
    q: torch.Tensor,
    k: torch.Tensor,
    scale: float,
    queries: torch.Tensor,
    chunk: int,
    causal: bool = False,
) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """The one softmax of the lean recording: for each image and chunk of the query positions
    ``queries`` (int64), ``(image, positions [c], probabilities [H, c, M] fp32)``. Scores are
    ``(q * scale) k^T`` in fp32, softmax over the keys; ``causal``: the queries are the last N of
    the M keys, and a query sees keys up to its own position."""
    num_keys = k.shape[2]
    offset = num_keys - q.shape[2]
    key_positions = torch.arange(num_keys, device=q.device)
    for image in range(q.shape[0]):
        keys = k[image].float().transpose(-2, -1)  # [H, d, M]
        for start in range(0, len(queries), chunk):
            positions = queries[start : start + chunk]
            scores = (q[image][:, positions].float() * scale) @ keys  # [H, c, M]
            if causal:
                hidden = key_positions[None] > positions[:, None] + offset
                scores.masked_fill_(hidden, float("-inf"))
            probs = scores.softmax(dim=-1)
            del scores
            yield image, positions, probs


def _check_inputs(q: torch.Tensor, k: torch.Tensor) -> None:
    """One clear error for q and k that do not pair up."""
    if q.dim() != 4 or k.dim() != 4:
        raise InputError(
            f"q and k must be [B, heads, N, head_dim], got {tuple(q.shape)} and {tuple(k.shape)}"
        )
    paired = (q.shape[0], q.shape[1], q.shape[3]) == (k.shape[0], k.shape[1], k.shape[3])
    if not paired:
        raise InputError(
            f"q {tuple(q.shape)} and k {tuple(k.shape)} differ in batch, heads or head_dim: "
            "expand grouped key heads to the query heads first (repeat_interleave on dim 1)"
        )


def summarise_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    scale: float,
    keep: AttentionKeep,
    *,
    causal: bool = False,
) -> AttentionSummary:
    """What ``keep`` asks for of ``A = softmax(q k^T * scale)``, from ``q [B, H, N, d]`` and
    ``k [B, H, M, d]`` (after QK-norm and RoPE, grouped heads expanded; M = N without a cache),
    without ever holding ``A`` for more than one query chunk (:func:`probability_chunks`);
    :class:`AttentionSummary` documents each array. ``causal``: the queries are the last N of
    the M keys and see keys up to their own position (a causal mask, as the attention's)."""
    _check_inputs(q, k)
    queries = _queries(q.shape[2], keep, q.device)
    chunk = keep.chunk_for(q.shape[1], k.shape[2])
    chunks = probability_chunks(q, k, scale, queries, chunk, causal)
    out = _reduce(chunks, q.shape[:3], k.shape[2], keep, q.device)
    if keep.inputs:
        out.q = q.detach().float()
        out.k = k.detach().float()
        out.scale = scale
    return out


def summarise_probabilities(probs: torch.Tensor, keep: AttentionKeep) -> AttentionSummary:
    """The same summary as :func:`summarise_attention` of probabilities already computed,
    ``[B, H, N, M]`` (a full capture, a model's own eager attention), chunk by chunk."""
    b = probs.shape[0]
    queries = _queries(probs.shape[2], keep, probs.device)
    chunk = keep.chunk_for(probs.shape[1], probs.shape[3])
    chunks = (
        (image, positions, probs[image][:, positions].float())
        for image in range(b)
        for positions in queries.split(chunk)
    )
    return _reduce(chunks, probs.shape[:3], probs.shape[3], keep, probs.device)


def _queries(n: int, keep: AttentionKeep, device: torch.device) -> torch.Tensor:
    """The query positions to compute: all N, or only the kept rows."""
    if keep.needs_all_queries:
        return torch.arange(n, device=device)
    return torch.tensor(keep.rows, dtype=torch.long, device=device)


def _reduce(
    chunks: Iterator[tuple[int, torch.Tensor, torch.Tensor]],
    shape: Sequence[int],
    num_keys: int,
    keep: AttentionKeep,
    device: torch.device,
) -> AttentionSummary:
    """Fold ``(image, positions, probabilities [H, c, M])`` chunks of ``[B, H, N]`` queries
    into what ``keep`` asks for (fp32 sums)."""
    b = shape[0]
    h = shape[1]
    n = shape[2]
    row_index = tuple(range(n)) if keep.every_row else keep.rows
    for kind, tokens, count in (("rows", row_index, n), ("mass_to", keep.mass_to, num_keys)):
        if max(tokens, default=-1) >= count:
            raise InputError(
                f"AttentionKeep {kind} names token {max(tokens)}, but there are {count}"
            )
    out = AttentionSummary(num_queries=n, row_index=row_index)
    out.rows = torch.empty(b, h, len(row_index), num_keys, device=device)
    per_query = torch.zeros(b, h, n, device=device)
    if keep.received:
        out.received = torch.zeros(b, h, num_keys, device=device)
    if keep.mass_to:
        out.mass_to = per_query.clone()
        mass_keys = torch.tensor(keep.mass_to, dtype=torch.long, device=device)
    if keep.head_stats:
        out.entropy = per_query.clone()
        out.peak = per_query.clone()
    # where each kept row goes in out.rows, by query position (-1: not kept)
    slot = torch.full((n,), -1, dtype=torch.long, device=device)
    kept = torch.tensor(row_index, dtype=torch.long, device=device)
    slot[kept] = torch.arange(len(row_index), device=device)
    for image, positions, probs in chunks:
        found = slot[positions]
        wanted = found >= 0
        out.rows[image][:, found[wanted]] = probs[:, wanted]
        if keep.received:
            out.received[image] += probs.sum(dim=1)
        if keep.mass_to:
            out.mass_to[image][:, positions] = probs[..., mass_keys].sum(dim=-1)
        if keep.head_stats:
            out.peak[image][:, positions] = probs.amax(dim=-1)
            out.entropy[image][:, positions] = torch.special.entr(probs).sum(dim=-1)
    if keep.received:
        out.received /= n
    return out


def received_from(
    q: torch.Tensor,
    k: torch.Tensor,
    scale: float,
    weights: torch.Tensor,
    chunk: int | None = None,
) -> torch.Tensor:
    """``sum_q weights[b, q] A[b, h, q, :]`` ``[B, H, M]``: a row vector times each head's
    attention, chunk by chunk over the queries with :func:`probability_chunks` (attention
    rollout walks the blocks backwards with it); ``chunk`` None: :func:`query_chunk`."""
    b = q.shape[0]
    h = q.shape[1]
    n = q.shape[2]
    out = torch.zeros(b, h, k.shape[2], device=q.device)
    queries = torch.arange(n, device=q.device)
    weights = weights.float()
    chunk = chunk or query_chunk(h, k.shape[2])
    for image, positions, probs in probability_chunks(q, k, scale, queries, chunk):
        out[image] += weights[image, positions] @ probs
    return out


Recorder = Callable[[torch.Tensor, torch.Tensor, float, bool], None]
"""``recorder(q, k, scale, causal)``, which an attention module calls when it is set."""


def summariser(store: dict[int, AttentionSummary], block: int, keep: AttentionKeep) -> Recorder:
    """A recorder that summarises block ``block``'s attention into ``store``."""

    def summarise(q: torch.Tensor, k: torch.Tensor, scale: float, causal: bool = False) -> None:
        with torch.no_grad():
            store[block] = summarise_attention(q, k, scale, keep, causal=causal)

    return summarise


@dataclass
class Recording:
    """What :func:`record` captured in the last forward pass (tensors detached, on the model's
    device): an :class:`AttentionSummary` and the output tokens of each recorded block."""

    depth: int
    attention_layers: list[int]
    token_layers: list[int]
    layout: TokenLayout | None = None
    summaries: dict[int, AttentionSummary] = field(default_factory=dict)
    tokens: dict[int, torch.Tensor] = field(default_factory=dict)  # [B, N, C] block outputs

    @property
    def attentions(self) -> dict[int, torch.Tensor]:
        """Full probabilities ``[B, heads, N, N]`` (fp32) by block, of a full capture."""
        return {i: summary.full() for i, summary in self.summaries.items()}

    def attention(self, layer: int) -> torch.Tensor:
        """Attention probabilities ``[B, heads, N, N]`` of block ``layer`` (negative counts
        from the end), of a full capture."""
        return self.summary(layer).full()

    def summary(self, layer: int) -> AttentionSummary:
        """What was kept of block ``layer``'s attention (negative counts from the end)."""
        return _get(self.summaries, self._index(layer), "attention")

    def block_output(self, layer: int) -> torch.Tensor:
        """Block ``layer``'s output tokens ``[B, N, C]`` before the final norm (negative allowed)."""
        return _get(self.tokens, self._index(layer), "token")

    def patch_norms(self, layer: int) -> torch.Tensor:
        """L2 norm of each patch token at ``layer`` as a map ``[B, h, w]``."""
        layout = self._layout()
        norms = layout.patches(self.block_output(layer)).float().norm(dim=-1)
        return layout.to_grid(norms)

    def cls_attention(self, layer: int) -> torch.Tensor:
        """Raw CLS-to-patch attention at ``layer`` as maps ``[B, heads, h, w]`` (not
        renormalised); the CLS row must have been kept."""
        layout = self._layout()
        if layout.cls_index is None:
            raise ValueError("this model has no CLS token")
        row = self.summary(layer).row(layout.cls_index)
        return layout.to_grid(layout.patches(row, dim=-1))

    def _index(self, layer: int) -> int:
        # out of range is an error, not a wrap-around
        return take_indices(self.depth, [layer])[0]

    def _layout(self) -> TokenLayout:
        if self.layout is None:
            raise RuntimeError(
                "nothing recorded yet: run the model inside `with vit5.record(model) as rec:`"
            )
        return self.layout


def _get(store: dict, layer: int, kind: str):
    if layer not in store:
        raise KeyError(
            f"no {kind} recorded for block {layer}: recorded {sorted(store)} (pass layers=... to record)"
        )
    return store[layer]


def _keeper(store: dict[int, torch.Tensor], i: int) -> Callable[..., None]:
    def keep(module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        store[i] = output.detach()

    return keep


@contextmanager
def record(
    model: nn.Module,
    layers: int | Sequence[int] | None = None,
    attention: bool = True,
    tokens: bool = True,
    token_layers: int | Sequence[int] | None = None,
    keep: AttentionKeep | None = None,
) -> Iterator[Recording]:
    """Record attention of ``layers`` and outputs of ``token_layers`` (:func:`take_indices`;
    default all). ``keep``: what is kept of each block's attention (default: the full
    ``[B, heads, N, N]`` probabilities, :meth:`AttentionKeep.full`)."""
    vit = unwrap_model(model)
    depth = len(vit.blocks)
    keep = keep or AttentionKeep.full()
    rec = Recording(
        depth=depth,
        attention_layers=take_indices(depth, layers) if attention else [],
        token_layers=take_indices(depth, token_layers) if tokens else [],
    )

    def on_patches(module, inputs, output) -> None:
        rec.layout = vit.token_layout((output.shape[-2], output.shape[-1]))

    handles = [vit.patch_embed.register_forward_hook(on_patches)]
    for i in rec.token_layers:
        handles.append(vit.blocks[i].register_forward_hook(_keeper(rec.tokens, i)))
    for i in rec.attention_layers:
        vit.blocks[i].attn.recorder = summariser(rec.summaries, i, keep)
    try:
        yield rec
    finally:
        for handle in handles:
            handle.remove()
        for i in rec.attention_layers:
            vit.blocks[i].attn.recorder = None
