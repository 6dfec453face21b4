"""Data pipeline for ViT-5: OpenCV decoding, ImageFolder, DeiT-III transforms, digits, RA sampler.

Stands alone: depends on torch, numpy, OpenCV, albumentations, timm.data and scikit-learn, never on
other ``vit5`` subpackages.
"""

from vit5.data.decode import BadImageError, decode_image

__all__ = [
    "BadImageError",
    "decode_image",
]
