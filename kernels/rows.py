"""What a trace row is: the input a kernel spec reads (`KernelSpec.problem_from_row`) and
builds its example rows from. The file format, its parser and writer live in
`nbx_tune.kernels.trace`; the data lives here so that kernels never import the tuner.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

Shape = tuple[int, ...]


class Params(Mapping[str, str]):
    """Non-tensor arguments by schema name, raw text, with typed readers."""

    def __init__(self, items: Mapping[str, str]):
        self._d = dict(items)

    def __getitem__(self, k):
        return self._d[k]

    def __iter__(self):
        return iter(self._d)

    def __len__(self):
        return len(self._d)

    def __repr__(self):
        return f"Params({self._d!r})"

    def __hash__(self):
        return hash(tuple(sorted(self._d.items())))

    def __eq__(self, other):
        return isinstance(other, Params) and self._d == other._d

    def ints(self, name: str, default: tuple[int, ...] | None = None) -> tuple[int, ...] | None:
        """A list param (`2x2`) or a single int, as a tuple; raises ValueError on bad text."""
        raw = self._d.get(name)
        if raw is None or raw == "None":
            return default
        return () if raw == "()" else tuple(int(p) for p in raw.split("x"))

    def int(self, name: str, default: int | None = None) -> int | None:
        raw = self._d.get(name)
        if raw is None or raw == "None":
            return default
        return int(raw)

    def float(self, name: str, default: float | None = None) -> float | None:
        raw = self._d.get(name)
        if raw is None or raw == "None":
            return default
        return float(raw)

    def bool(self, name: str, default: bool | None = None) -> bool | None:
        raw = self._d.get(name)
        if raw is None or raw == "None":
            return default
        if raw in ("True", "true", "1"):
            return True
        if raw in ("False", "false", "0"):
            return False
        raise ValueError(f"{name}={raw!r} is not a boolean")

    def str(self, name: str, default: str | None = None) -> str | None:
        raw = self._d.get(name)
        return default if raw is None or raw == "None" else raw

    def text(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self._d.items())


@dataclass(frozen=True)
class TraceRow:
    op: str
    dtypes: tuple[str, ...]
    shapes: tuple[Shape, ...]
    params: Params
    count: int
    line: int = field(default=0, compare=False)

    @property
    def base_op(self) -> str:
        """The op without its overload: `aten.add.Tensor` -> `aten.add`."""
        parts = self.op.split(".")
        return ".".join(parts[:2])

    def key(self) -> tuple:
        return (self.op, self.dtypes, self.shapes, tuple(self.params.items()))


def numel(shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def format_shape(shape: Iterable[int]) -> str:
    shape = tuple(shape)
    return "x".join(str(d) for d in shape) if shape else "()"


def make_row(op: str, dtypes, shapes, params: Mapping[str, str] | None = None, count: int = 1) -> TraceRow:
    return TraceRow(op, tuple(dtypes), tuple(tuple(s) for s in shapes), Params(params or {}), count)
