"""Trace format v1: one distinct launch of an op per line, tab-separated.

    # nbx-tune trace v1
    op	dtypes	shapes	params	count
    aten.mm	float16,float16	512x4096;4096x11008		32

A malformed line is a `TraceError` naming the file, the line number and the column; the
parser reads the whole file before anything is returned, so a caller never acts on half of
it. `write_trace` is the one writer (the recorder uses it) and never leaves a partial file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from nbx_tune.errors import TraceError
from nbx_tune.kernels.rows import Params, Shape, TraceRow, format_shape, make_row  # noqa: F401
from nbx_tune.files import write_atomic

MAGIC = "# nbx-tune trace v1"
MAX_INT = 2 ** 63 - 1  # what a database integer holds
HEADER = ("op", "dtypes", "shapes", "params", "count")

# torch's dtype names, as `str(torch.float16).removeprefix("torch.")` writes them.
KNOWN_DTYPES = frozenset({
    "float16", "bfloat16", "float32", "float64", "complex32", "complex64", "complex128",
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool",
    "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
    "float4_e2m1fn_x2", "qint8", "quint8", "qint32", "quint4x2", "quint2x4",
})

_OP = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

@dataclass(frozen=True)
class Trace:
    path: str
    rows: tuple[TraceRow, ...]

    @property
    def launches(self) -> int:
        return sum(r.count for r in self.rows)


# ----------------------------------------------------------------------------- parsing


def _fail(path, line, col, problem):
    where = f"{path}: line {line}"
    if col is not None:
        where += f": column {col + 1} ({HEADER[col]})"
    raise TraceError(f"{where}: {problem}")


def _parse_shape(text: str, path, line) -> Shape:
    if text == "()":
        return ()
    if not text:
        _fail(path, line, 2, "empty shape (write () for a 0-d tensor)")
    dims = []
    for d in text.split("x"):
        if not d.isdigit() or not d.isascii():
            _fail(path, line, 2, f"dim {d!r} in {text!r} is not a non-negative integer")
        if int(d) > MAX_INT:
            _fail(path, line, 2, f"dim {d} in {text!r} is over 2^63 - 1")
        dims.append(int(d))
    return tuple(dims)


def parse_line(text: str, path: str, line: int) -> TraceRow:
    cols = text.split("\t")
    if len(cols) != len(HEADER):
        _fail(path, line, None, f"expected {len(HEADER)} tab-separated columns "
              f"({', '.join(HEADER)}), found {len(cols)}")
    op, dtypes_s, shapes_s, params_s, count_s = cols
    if not _OP.match(op):
        _fail(path, line, 0, f"{op!r} is not an op name like aten.mm or aten.add.Tensor")
    dtypes: tuple[str, ...] = tuple(dtypes_s.split(",")) if dtypes_s else ()
    for dt in dtypes:
        if dt not in KNOWN_DTYPES:
            _fail(path, line, 1, f"unknown dtype {dt!r}")
    shapes = tuple(_parse_shape(s, path, line) for s in shapes_s.split(";")) if shapes_s else ()
    if len(shapes) != len(dtypes):
        _fail(path, line, 2, f"{len(shapes)} shapes for {len(dtypes)} dtypes (one shape per tensor)")
    params = {}
    if params_s:
        for item in params_s.split(","):
            name, eq, value = item.partition("=")
            if not eq or not _NAME.match(name):
                _fail(path, line, 3, f"{item!r} is not name=value")
            if name in params:
                _fail(path, line, 3, f"parameter {name!r} given twice")
            if value == "":
                _fail(path, line, 3, f"parameter {name!r} has an empty value")
            params[name] = value
    if not count_s.isdigit() or not count_s.isascii() or int(count_s) <= 0:
        _fail(path, line, 4, f"count {count_s!r} is not a positive integer")
    if int(count_s) > MAX_INT:
        _fail(path, line, 4, f"count {count_s} is over 2^63 - 1")
    return TraceRow(op, dtypes, shapes, Params(params), int(count_s), line)


def parse_trace_text(text: str, path: str = "<trace>") -> Trace:
    rows: dict[tuple, TraceRow] = {}
    header_seen = False
    total = 0
    text = text.removeprefix("\ufeff")  # a byte-order mark, as some editors write
    for lineno, raw in enumerate(text.split("\n"), start=1):
        line = raw[:-1] if raw.endswith("\r") else raw
        if not line.strip() or line.startswith("#"):
            continue
        if not header_seen:
            if tuple(line.split("\t")) != HEADER:
                _fail(path, lineno, None, "expected the header line 'op\\tdtypes\\tshapes\\tparams\\tcount'")
            header_seen = True
            continue
        row = parse_line(line, path, lineno)
        total += row.count
        if total > MAX_INT:
            _fail(path, lineno, 4, "the counts add up to more than 2^63 - 1 launches")
        # The same launch on two lines is one row with the counts added.
        k = row.key()
        if k in rows:
            prev = rows[k]
            row = TraceRow(prev.op, prev.dtypes, prev.shapes, prev.params, prev.count + row.count, prev.line)
        rows[k] = row
    if not header_seen:
        _fail(path, 1, None, "no header line 'op\\tdtypes\\tshapes\\tparams\\tcount' (is this a trace v1 file?)")
    return Trace(path, tuple(rows.values()))


def read_trace(path: str | Path) -> Trace:
    p = Path(path)
    if p.exists() and not p.is_file():  # /dev/zero, a FIFO, a directory: never read whole
        raise TraceError(f"{p}: not a regular file")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise TraceError(f"{p}: cannot read: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise TraceError(f"{p}: line {line}: not UTF-8 (byte {data[e.start]:#04x})") from None
    return parse_trace_text(text, str(p))


# ----------------------------------------------------------------------------- writing


def format_row(op: str, dtypes: Iterable[str], shapes: Iterable[Iterable[int]],
               params: Mapping[str, str], count: int) -> str:
    return "\t".join((
        op,
        ",".join(dtypes),
        ";".join(format_shape(s) for s in shapes),
        ",".join(f"{k}={v}" for k, v in params.items()),
        str(count),
    ))


def write_trace(path: str | Path, rows: Iterable[TraceRow], comments: Iterable[str] = ()) -> None:
    """Write a trace atomically: a temporary file beside `path`, renamed over it when whole."""
    path = Path(path)
    lines = [MAGIC] + [f"# {c}" for c in comments] + ["\t".join(HEADER)]
    lines += [format_row(r.op, r.dtypes, r.shapes, r.params, r.count) for r in rows]
    body = "\n".join(lines) + "\n"
    # Round-trip before writing: a row the parser would refuse is never written.
    parse_trace_text(body, str(path))
    write_atomic(path, body, TraceError)
