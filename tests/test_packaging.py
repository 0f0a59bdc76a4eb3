"""The wheel: pyproject's explicit package list holds every package of the product, so an
installed nbx-tune imports what the repository does (the CLI imports tuner.inductor at start)."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("cli", "kernels", "migrations", "oracles", "profiles", "testing", "tuner")


def test_every_package_of_the_product_is_in_the_wheel():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"nbx_tune." + ".".join(p.parent.relative_to(ROOT).parts)
             for top in PRODUCT for p in (ROOT / top).rglob("__init__.py")}
    assert found - listed == set()
