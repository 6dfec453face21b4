"""timm's RandAugment as an albumentations step, for the ViT-5 / DeiT-III fine-tuning recipe.

albumentations has no RandAugment with timm's policy strings (``rand-m9-mstd0.5-inc1``: 2 ops,
magnitude 9 with std 0.5, increasing-severity op set), and the fine-tune results were produced with
timm's PIL implementation. So this step round-trips the (already OpenCV-decoded, RGB uint8) array
through PIL and calls :func:`timm.data.rand_augment_transform` unchanged.

Pillow compatibility: with ``mstd`` the magnitude is sampled, clipped to 0..10, and at 10 the
increasing posterize asks to keep 0 bits. Pillow < 13 then clears every bit (a black image);
Pillow 13 raises ``ValueError: bits must be between or equal to 1 and 8`` and would stop a training
run. The posterize ops are therefore given :func:`posterize`, which keeps the old result for 0 bits
on every Pillow the dependency range allows.

Randomness: timm draws from Python's ``random`` and NumPy's global RNG, not from the albumentations
generator. DataLoader workers seed both from the loader's generator; in the main process seed them
yourself (``accelerate.utils.set_seed`` does).
"""

from __future__ import annotations

from typing import Any

import albumentations as A
import numpy as np
from PIL import Image
from timm.data import auto_augment, rand_augment_transform


class TimmRandAugment(A.ImageOnlyTransform):
    """Apply ``timm.data.rand_augment_transform(policy)`` to an RGB uint8 image.

    Hyper-parameters follow timm's ``create_transform`` (which DeiT-III / ViT-5 use): translation
    ``0.45 * min(size)`` pixels, fill colour = the normalisation mean in 0..255, bicubic resampling.
    """

    def __init__(
        self,
        policy: str,
        size: tuple[int, int],
        mean: tuple[float, float, float],
        p: float = 1.0,
    ) -> None:
        super().__init__(p=p)
        self.policy = policy
        self.size = size
        self.mean = mean
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
    """timm's posterize, where keeping 0 bits gives what Pillow < 13 gave: every bit cleared (black)."""
    if bits_to_keep <= 0:
        return Image.new(img.mode, img.size)
    return auto_augment.posterize(img, bits_to_keep, **kwargs)
