"""Any model the tools accept, vit5 or timm: what it is (:mod:`vit5.introspect.describe`). The
loader, which turns a model spec into a model and its description, is
:mod:`vit5.introspect.load`; importing this package does not import it."""

from vit5.introspect.describe import (
    SUPPORTED,
    TEST_REGISTERS_ATTR,
    ModelInfo,
    Preprocessing,
    describe,
    patch_size_of,
    preprocessing_of,
)

__all__ = [
    "SUPPORTED",
    "TEST_REGISTERS_ATTR",
    "ModelInfo",
    "Preprocessing",
    "describe",
    "patch_size_of",
    "preprocessing_of",
]
