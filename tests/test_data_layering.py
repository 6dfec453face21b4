"""vit5.data stands alone: only the standard library and its declared third-party packages."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import vit5.data

# webdataset: the vit5[wds] extra (vit5.data.shards)
ALLOWED_THIRD_PARTY = {
    "torch",
    "torchvision",
    "numpy",
    "cv2",
    "albumentations",
    "sklearn",
    "PIL",
    "webdataset",
    "tqdm",  # progress of a long preload
}


def imported_modules(path: Path) -> list[str]:
    modules = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: use absolute imports"
            modules.append(node.module or "")
    return modules


def test_data_package_imports_nothing_else_from_vit5():
    package = Path(vit5.data.__file__).parent
    offenders = []
    for path in sorted(package.rglob("*.py")):
        for module in imported_modules(path):
            top = module.split(".")[0]
            allowed = (
                top in sys.stdlib_module_names
                or top in ALLOWED_THIRD_PARTY
                or module == "__future__"
                or module == "timm.data"
                or module == "vit5.data"
                or module.startswith("vit5.data.")
                # leaf modules: the user-error base, crash-safe files, the one JSON/CSV writer
                or module in ("vit5.errors", "vit5.files", "vit5.outputs")
            )
            if not allowed:
                offenders.append(f"{path.relative_to(package)}: {module}")
    assert not offenders, offenders
