"""timm's RandAugment as an albumentations step, for the ViT-5 / DeiT-III fine-tuning recipe.

albumentations has no RandAugment with timm's policy strings (``rand-m9-mstd0.5-inc1``: 2 ops,
magnitude 9 with std 0.5, increasing-severity op set), and the fine-tune results were produced with
timm's PIL implementation. So this step round-trips the (already OpenCV-decoded, RGB uint8) array
through PIL and calls :func:`timm.data.rand_augment_transform` unchanged.

Randomness: timm draws from Python's ``random`` and NumPy's global RNG, not from the albumentations
generator. DataLoader workers seed both from the loader's generator; in the main process seed them
yourself (``accelerate.utils.set_seed`` does).
"""

from __future__ import annotations

from typing import Any

import albumentations as A
import numpy as np
from PIL import Image
from timm.data import rand_augment_transform


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

    def apply(self, img: np.ndarray, **params: Any) -> np.ndarray:
        return np.asarray(self._randaugment(Image.fromarray(img)))

    def get_transform_init_args_names(self) -> tuple[str, ...]:
        return ("policy", "size", "mean")
