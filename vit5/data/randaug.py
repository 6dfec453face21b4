"""timm's RandAugment (``rand-m9-mstd0.5-inc1``, the ViT-5 / DeiT-III fine-tuning policy) as an
albumentations step: the array goes through PIL into :func:`timm.data.rand_augment_transform` unchanged.
It draws from Python's ``random`` and NumPy's global RNG (seeded per worker; in the main process by
``set_seed``).
"""

from __future__ import annotations

from typing import Any

import albumentations as A
import numpy as np
from PIL import Image
from timm.data import auto_augment, rand_augment_transform


class TimmRandAugment(A.ImageOnlyTransform):
    """``timm.data.rand_augment_transform(policy)`` on an RGB uint8 image, with timm ``create_transform``'s
    hyper-parameters: translation ``0.45 * min(size)`` px, fill = the normalisation mean, bicubic."""

    def __init__(
        self, policy: str, size: tuple[int, int], mean: tuple[float, float, float], p: float = 1.0
    ) -> None:
        super().__init__(p=p)
        self.policy, self.size, self.mean = policy, size, mean
        hparams = {
            "translate_const": int(min(size) * 0.45),
            "img_mean": tuple(min(255, round(255 * m)) for m in mean),
            "interpolation": Image.BICUBIC,
        }
        self._randaugment = rand_augment_transform(policy, hparams)
        for op in self._randaugment.ops:
            if op.aug_fn is auto_augment.posterize:
                op.aug_fn = posterize

    def apply(self, img: np.ndarray, **params: Any) -> np.ndarray:
        return np.asarray(self._randaugment(Image.fromarray(img)))

    def get_transform_init_args_names(self) -> tuple[str, ...]:
        return ("policy", "size", "mean")


def posterize(img: Image.Image, bits_to_keep: int, **kwargs: Any) -> Image.Image:
    """timm's posterize, keeping 0 bits as Pillow < 13 did (a black image) where Pillow 13 raises ``bits
    must be between or equal to 1 and 8`` (RandAugment's increasing posterize at magnitude 10)."""
    if bits_to_keep <= 0:
        return Image.new(img.mode, img.size)
    return auto_augment.posterize(img, bits_to_keep, **kwargs)
