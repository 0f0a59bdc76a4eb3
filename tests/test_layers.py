"""docs/architecture.md's table of layers and what each may import, checked against the code
(read as syntax trees; nothing is imported). A lazy import is one inside a function."""

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STDLIB = set(sys.stdlib_module_names) | {"__future__"}


def imports(folder: str):
    """(module, file, lazy) for every import in the folder's Python files."""
    out = []
    for path in sorted((ROOT / folder).rglob("*.py")) if folder else [ROOT / "errors.py", ROOT / "settings.py", ROOT / "files.py"]:
        tree = ast.parse(path.read_text(), str(path))
        lazy = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                for n in ast.walk(f)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                parts = name.split(".")
                top = ".".join(parts[:2]) if parts[0] == "nbx_tune" else parts[0]
                out.append((top, path.relative_to(ROOT).as_posix(), id(node) in lazy))
    return out


# folder -> (what it may import at module level, what it may import only lazily)
RULES = {
    "": ({"platformdirs"}, set()),
    "oracles": ({"numpy", "nbx_tune.oracles"}, set()),
    "profiles": ({"yaml", "nbx_tune.errors", "nbx_tune.profiles"}, {"triton", "torch"}),
    "kernels": ({"numpy", "triton", "torch", "nbx_tune", "nbx_tune.errors", "nbx_tune.kernels",
                 "nbx_tune.oracles", "nbx_tune.profiles", "nbx_tune.settings", "nbx_tune.files"}, {"sqlalchemy"}),
}


@pytest.mark.parametrize("folder", sorted(RULES))
def test_each_layer_imports_only_what_the_architecture_allows(folder):
    eager, lazy_only = RULES[folder]
    bad = [(m, f, "lazily" if lz else "at import") for m, f, lz in imports(folder)
           if m not in STDLIB and m not in eager and not (lz and m in lazy_only)]
    assert bad == []


def test_the_tuner_never_imports_the_cli_and_the_kernels_never_the_tuner():
    assert [(m, f) for m, f, _ in imports("tuner") if m == "nbx_tune.cli"] == []
    assert [(m, f) for m, f, _ in imports("kernels") if m in ("nbx_tune.tuner", "nbx_tune.cli")] == []


def test_no_product_layer_imports_the_testing_helpers():
    product = ("", "oracles", "profiles", "kernels", "tuner", "cli", "migrations")
    assert [(m, f) for folder in product for m, f, _ in imports(folder) if m == "nbx_tune.testing"] == []
