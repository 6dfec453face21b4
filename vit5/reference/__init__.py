"""Independent reference implementations (the official ViT-5 code's way), for parity tests and benchmarks."""

from vit5.reference.official_vit5 import OfficialViT5

__all__ = ["OfficialViT5"]
