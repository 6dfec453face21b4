"""The package layering, read from the source: layers <- model <- weights <- introspect <- train / eval /
viz / bench / study; data alone; the command line (vit5/cli) on top of everything.

Arrows point to what a part may import. A new import that breaks the layering (viz reaching into
train, layers importing timm, anything importing the top-level scripts) fails here with the file
and the import named.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import vit5

PACKAGE = Path(vit5.__file__).parent

# subpackage -> the vit5 subpackages it may import ("" is the vit5 package root)
LIBRARY = {
    "",
    "layers",
    "model",
    "weights",
    "introspect",
    "reference",
    "data",
    "train",
    "eval",
    "viz",
    "study",
    "bench",
}
ALLOWED_INTERNAL = {
    "layers": set(),
    "reference": set(),
    "data": set(),
    "model": {"layers"},
    "weights": {"layers", "model"},
    "introspect": {"layers", "model", "weights"},
    "train": {"", "layers", "model", "weights", "data"},
    "eval": {"", "layers", "model", "weights", "introspect", "data"},
    "viz": {
        "",
        "layers",
        "model",
        "weights",
        "introspect",
        "data",
        "eval",
    },  # eval: the register ablation's kNN probe
    "study": {"", "layers", "model", "weights", "introspect", "data", "train", "viz"},
    "bench": {"", "layers", "model", "weights", "introspect", "reference", "data", "train"},
    "cli": LIBRARY,  # on top: every command line, nothing imports it
}
# single modules of a higher layer a subpackage may import: the one evaluation pass of a classifier
ALLOWED_MODULES = {
    "eval": {"vit5.train.loop"},
    "bench": {"vit5.viz.collect", "vit5.viz.images", "vit5.viz.runner"},  # the recording benchmark
}
# leaf modules every subpackage may import (they import nothing from vit5 but each other): the user-error
# base class, crash-safe files and locks, which process prints, device and memory checks, the figure style,
# the CSV, JSON and table writers, files read as typed schemas
LEAF_MODULES = {"errors", "files", "runtime", "plotstyle", "outputs", "schema"}
# third-party packages the pure-torch layers may use (flash-attn is optional, imported lazily)
LAYERS_THIRD_PARTY = {"torch", "flash_attn"}
TOP_LEVEL_SCRIPTS = {"train", "eval", "viz"}


def imports_of(path: Path) -> list[str]:
    """Absolute module names imported by ``path`` (relative imports resolved against its package)."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = parts if path.name == "__init__.py" else parts[:-1]
    if package[-1:] == ["__init__"]:
        package = package[:-1]
    modules = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                modules.append(".".join(base + ([node.module] if node.module else [])))
            else:
                modules.append(node.module or "")
    return modules


def subpackage_files(name: str) -> list[Path]:
    return sorted((PACKAGE / name).rglob("*.py"))


def test_imports_resolve_relative_paths_correctly():
    assert "vit5.layers.norm" in imports_of(
        PACKAGE / "layers" / "attention.py"
    )  # from .norm import ...
    assert any(
        m.startswith("vit5.layers") for m in imports_of(PACKAGE / "model" / "vit.py")
    )  # from ..layers


@pytest.mark.parametrize("name", sorted(ALLOWED_INTERNAL))
def test_subpackage_imports_only_what_the_layering_allows(name):
    assert (PACKAGE / name).is_dir(), f"vit5/{name} is missing: update ALLOWED_INTERNAL"
    offenders = []
    for path in subpackage_files(name):
        for module in imports_of(path):
            top, *rest = module.split(".")
            if module in ALLOWED_MODULES.get(name, set()):
                continue
            if top == "vit5":
                target = rest[0] if rest else ""
                if target != name and target not in ALLOWED_INTERNAL[name] | LEAF_MODULES:
                    offenders.append(f"{path.relative_to(PACKAGE)} imports {module}")
            elif top in TOP_LEVEL_SCRIPTS:
                offenders.append(
                    f"{path.relative_to(PACKAGE)} imports the top-level script {module}"
                )
    assert not offenders, "\n".join(offenders)


def test_layers_are_pure_torch():
    offenders = [
        f"{path.relative_to(PACKAGE)} imports {module}"
        for path in subpackage_files("layers")
        for module in imports_of(path)
        if (top := module.split(".")[0]) not in sys.stdlib_module_names
        and top not in LAYERS_THIRD_PARTY | {"vit5", "__future__"}
    ]
    assert not offenders, "\n".join(offenders)


def test_leaf_modules_import_only_each_other():
    offenders = []
    for name in sorted(LEAF_MODULES):
        for module in imports_of(PACKAGE / f"{name}.py"):
            top, *rest = module.split(".")
            if top == "vit5" and rest[:1] != [] and rest[0] not in LEAF_MODULES or module == "vit5":
                offenders.append(f"{name}.py imports {module}")
    assert not offenders, "\n".join(offenders)


def test_every_subpackage_is_covered():
    subpackages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert subpackages == set(ALLOWED_INTERNAL), "add the new subpackage to ALLOWED_INTERNAL"


def test_every_error_class_outside_train_is_a_user_error():
    """A user-facing error prints as one ``error:`` line only if it is a Vit5Error (the command lines
    catch that class): every ``class ...Error`` defined outside vit5/train must derive from it."""
    import importlib

    from vit5.errors import Vit5Error

    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[1] in ("train", "reference") or parts[-1] == "__main__":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Error"):
                cls = getattr(
                    importlib.import_module(".".join(parts).removesuffix(".__init__")), node.name
                )
                if not issubclass(cls, Vit5Error):
                    offenders.append(f"{path.relative_to(PACKAGE)}: {node.name}")
    assert not offenders, "\n".join(offenders)


def test_only_the_command_line_parses_arguments_and_nothing_imports_it():
    """Every parser lives in vit5/cli (the official checkpoints' pickled ``argparse.Namespace`` is data
    that the checkpoint reader allows, not a parser)."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "cli" or rel == Path("__main__.py"):
            continue
        if "ArgumentParser" in path.read_text():
            offenders.append(f"{rel} builds an argparse parser")
        for module in imports_of(path):
            if module == "vit5.cli" or module.startswith("vit5.cli."):
                offenders.append(f"{rel} imports {module}")
    assert not offenders, "\n".join(offenders)


# the modules of vit5/weights, each importing only those before it (export stands apart): the release
# catalogue sits below the checkpoint reader, publishing above the factory
WEIGHTS_ORDER = ("convert", "catalog", "checkpoint", "factory", "publish")


def test_the_weights_modules_import_downwards_and_never_inside_a_function():
    offenders = []
    for path in subpackage_files("weights"):
        if path.stem == "__init__":
            continue
        allowed = (
            set(WEIGHTS_ORDER[: WEIGHTS_ORDER.index(path.stem)])
            if path.stem in WEIGHTS_ORDER
            else set()
        )
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            for module in names:
                parts = module.split(".")
                if parts[:2] != ["vit5", "weights"]:
                    continue
                target = parts[2] if len(parts) > 2 else node.names[0].name
                if target not in allowed:
                    offenders.append(f"weights/{path.name} imports vit5.weights.{target}")
                if node not in tree.body:
                    offenders.append(
                        f"weights/{path.name}:{node.lineno} imports {module} inside a block"
                    )
    assert not offenders, "\n".join(offenders)
