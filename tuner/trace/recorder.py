"""Record the aten ops a PyTorch program dispatches, as a trace v1 (see `trace.py`).

    with nbx_tune.record("trace.tsv"):
        model(x)

`Recorder` watches the dispatcher (a `TorchDispatchMode`), merges identical launches into
one row with a count and keeps the rows in memory; `record(path)` writes them with
`write_trace` when the body exits cleanly, and writes nothing if it raises.
`trace_command` runs a whole Python program under the recorder in a child process.

What goes in a row (which ops, how dtypes, shapes and params are written, what is skipped)
and the recorder's limits are specified in docs/trace-format.md.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, autograd_would_have_decomposed
from torch.utils._pytree import tree_leaves

from nbx_tune.errors import TraceError
from nbx_tune.kernels.serving.fusions import engine as fusions
from nbx_tune.kernels.serving import gemma_ops  # noqa: F401  (defines the torch ops _WHOLE names)
from nbx_tune.kernels.copy import layout_params as copy_layout_params
from nbx_tune.kernels.matmul import operand_major
from nbx_tune.kernels.trace import Params, TraceRow, read_trace, write_trace

# Ops that compute nothing and move no data, beyond what `OpOverload.is_view` and the
# `inplace_view` tag catch: a view the schema does not mark as one, metadata queries, a
# backend choice, checks, and allocations without a fill.
_SKIPPED = frozenset({
    "aten._unsafe_view", "aten._fused_sdp_choice", "aten.sym_size", "aten.sym_stride",
    "aten.sym_numel", "aten.sym_storage_offset", "aten.size", "aten.stride", "aten.numel",
    "aten.dim", "aten.storage_offset", "aten.is_contiguous", "aten.is_strides_like_format",
    "aten.is_non_overlapping_and_dense", "aten.is_same_size", "aten._assert_tensor_metadata",
    "aten._assert_async", "aten.record_stream", "aten.empty", "aten.empty_like",
    "aten.empty_strided", "aten.empty_permuted", "aten.new_empty", "aten.new_empty_strided",
    "aten.resize_",
})

# Arguments that say where or how a tensor is stored, or which backend may run an op, not
# what is computed.
_NEVER_WRITTEN = frozenset({"device", "layout", "pin_memory", "memory_format", "generator",
                            "cudnn_enabled"})

# The dtype torch gives a Python number it wraps into a 0-d tensor.
_WRAPPED_DTYPE = {bool: "bool", int: "int64", float: "float64", complex: "complex128"}

_FORBIDDEN = {"\t": "a tab", ",": "a comma", "\n": "a newline", "\r": "a carriage return"}

_Key = tuple  # (op, dtypes, shapes, params items)

_COMPOSITE = torch._C.DispatchKey.CompositeImplicitAutograd


def op_name(func: torch._ops.OpOverload) -> str:
    """`aten.mm` for the default overload, `aten.add.Tensor` for any other."""
    return func.name().replace("::", ".")


def _skipped(func: torch._ops.OpOverload) -> bool:
    base = ".".join(op_name(func).split(".")[:2])  # without the overload
    return func.is_view or torch.Tag.inplace_view in func.tags or base in _SKIPPED


def _has_composite(func: torch._ops.OpOverload) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), _COMPOSITE)


def _bound(func, args, kwargs) -> Iterator[tuple[torch._C.Argument, object, bool]]:
    """(schema argument, value, passed) for every argument, in schema order."""
    for i, arg in enumerate(func._schema.arguments):
        if not arg.kwarg_only and i < len(args):
            yield arg, args[i], True
        elif arg.name in kwargs:
            yield arg, kwargs[arg.name], True
        else:
            yield arg, arg.default_value if arg.has_default_value() else None, False


def _tensor_kind(schema_type) -> str | None:
    """"one" for Tensor and Tensor?, "many" for any list of them (Tensor[], Tensor?[], ...)."""
    text = str(schema_type)
    if text in ("Tensor", "Optional[Tensor]"):
        return "one"
    return "many" if "Tensor" in text else None


def _tensor_sig(value) -> tuple[str, tuple[int, ...]]:
    if isinstance(value, torch.Tensor):
        return str(value.dtype).removeprefix("torch."), tuple(int(d) for d in value.shape)
    return _WRAPPED_DTYPE[type(value)], ()


def _text(value) -> str:
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "x".join(_text(v) for v in value) if value else "()"
    return str(value)  # int, bool, str, None, SymInt


def _checked(op: str, name: str, text: str) -> str:
    for ch, what in _FORBIDDEN.items():
        if ch in text:
            raise TraceError(f"trace: {op}: parameter {name}={text!r} contains {what}, "
                             "which trace v1 cannot hold")
    if not text:
        raise TraceError(f"trace: {op}: parameter {name} is an empty string, "
                         "which trace v1 cannot hold")
    return text


def _same(value, default) -> bool:
    norm = lambda v: tuple(v) if isinstance(v, (list, tuple)) else v  # noqa: E731
    return norm(value) == norm(default)


def describe(func: torch._ops.OpOverload, args, kwargs) -> _Key:
    """The row key of one launch: op, tensor dtypes and shapes, params."""
    op = op_name(func)
    dtypes: list[str] = []
    shapes: list[tuple[int, ...]] = []
    params: dict[str, str] = {}

    def add(value):
        dt, shape = _tensor_sig(value)
        dtypes.append(dt)
        shapes.append(shape)

    for arg, value, passed in _bound(func, args, kwargs):
        kind = _tensor_kind(arg.type)
        if kind == "one":
            if value is None:
                params[arg.name] = "None"
            else:
                add(value)
        elif kind == "many":
            entries = list(value or ())
            for v in tree_leaves(entries):
                if v is not None:
                    add(v)
            if any(v is None for v in entries):
                params[arg.name] = "x".join("None" if v is None else "Tensor" for v in entries)
        elif arg.name in _NEVER_WRITTEN or not passed:
            continue
        elif not (arg.has_default_value() and _same(value, arg.default_value)):
            params[arg.name] = _checked(op, arg.name, _text(value))
    if op in _MATRIX_OPERANDS:
        layout = "".join(operand_major(args[i] if i < len(args) else None) for i in _MATRIX_OPERANDS[op])
        if layout != "nn":
            params["layout"] = layout
    return op, tuple(dtypes), tuple(shapes), tuple(params.items())


# The products whose seat depends on how their matrices are stored (kernels/matmul.py: the
# alignment a launch reads off the strides): which arguments, and `layout` says `t` for
# one stored transposed (a linear layer's W.t()), since a row's shapes cannot.
_MATRIX_OPERANDS = {"aten.mm": (0, 1), "aten.bmm": (0, 1), "aten.addmm": (1, 2), "aten.baddbmm": (1, 2)}
# The copies whose seat depends on the strides of their input and output (kernels/copy.py:
# flat or strided), which a row's shapes cannot say: the row says it (`layout_params`).
_COPIES = ("aten.clone", "aten._to_copy")


class Recorder:
    """Counts every launch dispatched while it is active; `rows` are the merged launches.

    `with Recorder() as rec: model(x)`, then `rec.rows`, or `rec.write(path)`.
    """

    def __init__(self, fuse: bool | None = None):
        self._counts: dict[_Key, int] = {}  # insertion order: first launch first
        self._paused = 0
        self._modes = contextlib.ExitStack()
        # The fusions serve() makes (kernels/serving/fusions/), so the trace holds the ops it serves.
        self.fuse = fusions.enabled_by_default() if fuse is None else fuse
        self.fused: dict[str, int] = {}  # fusion -> calls swapped in while recording

    def __enter__(self) -> "Recorder":
        if self.fuse:
            fusions.acquire()
            self._modes.callback(fusions.release)
            before = fusions.stats()
            self._modes.callback(lambda: self._fused_since(before))
        self._modes.enter_context(_WholeOps(self))
        self._modes.enter_context(_Dispatches(self))
        return self

    def __exit__(self, *exc) -> None:
        self._modes.close()

    def _fused_since(self, before: dict) -> None:
        self.fused = {k: n - before.get(k, 0) for k, n in fusions.stats().items() if n > before.get(k, 0)}

    @property
    def fusion_note(self) -> str:
        """The trace's comment on fusions: a trace recorded with them holds the ops serve()
        runs with them, one without holds torch's."""
        if not self.fuse:
            return "fusions: off (the model's own ops, as torch runs them)"
        if not self.fused:
            return "fusions: on, none applied"
        return "fusions: " + ", ".join(f"{k} x{n}" for k, n in self.fused.items()) + " (kernels/serving/fusions/)"

    def count(self, key: _Key) -> None:
        self._counts[key] = self._counts.get(key, 0) + 1

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    @property
    def is_paused(self) -> bool:
        return self._paused > 0

    @property
    def rows(self) -> tuple[TraceRow, ...]:
        return tuple(TraceRow(op, dtypes, shapes, Params(dict(params)), count)
                     for (op, dtypes, shapes, params), count in self._counts.items())

    @property
    def launches(self) -> int:
        return sum(self._counts.values())

    def write(self, path: str | Path, comments: Iterable[str] = ()) -> None:
        write_trace(path, self.rows, [*comments, self.fusion_note])


class _Dispatches(TorchDispatchMode):
    """Counts each op that reaches the dispatcher, as eager autograd would run it."""

    def __init__(self, recorder: Recorder):
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # Calls made from here are below the torch-function level: keep `_WholeOps` out.
        with torch._C.DisableTorchFunction():
            return self._dispatch(func, args, kwargs or {})

    def _dispatch(self, func, args, kwargs):
        if self.recorder.is_paused:
            return func(*args, **kwargs)
        if fusions.pending:  # as serve() does: model code imported while recording
            fusions.settle()
        # Under inference_mode the autograd key, where composite ops decompose, is skipped:
        # run the C++ decomposition here (with this mode active again) to record what eager
        # autograd runs. Not `func.decompose`: it prefers Python decompositions written for
        # tracing, which differ from eager (a dropout in eval clones its input).
        if _has_composite(func) and autograd_would_have_decomposed(func, tree_leaves((args, kwargs))):
            with self:
                return func._op_dk(_COMPOSITE, *args, **kwargs)
        key = None if _skipped(func) else describe(func, args, kwargs)
        out = func(*args, **kwargs)
        if key is not None and key[0] in _COPIES and isinstance(out, torch.Tensor):
            key = (*key[:3], key[3] + tuple(copy_layout_params(args[0], out).items()))
        if key is not None:
            self.recorder.count(key)
        return out


_redispatch = getattr(torch.overrides, "redispatch_function", None)


def _entry_points(op: torch._ops.OpOverloadPacket, *functions) -> dict:
    return {f: op.default for f in (op, op.default, *functions)}


# Composite ops that pick a device backend inside (SDPA: flash or efficient attention on
# CUDA, flash_for_cpu on the CPU, the math decomposition on meta; batch_norm: cudnn for
# float32 on CUDA; rms_norm: _fused_rms_norm on CUDA, its decomposition elsewhere), by
# every function that enters them.
_WHOLE = {
    **_entry_points(torch.ops.aten.scaled_dot_product_attention, F.scaled_dot_product_attention),
    **_entry_points(torch.ops.aten.batch_norm, F.batch_norm),
    **_entry_points(torch.ops.aten.rms_norm, F.rms_norm, torch.rms_norm),
    # the library's own composites (kernels/serving/custom_ops.py): one row each, as serve() runs them
    **_entry_points(torch.ops.nbx_tune.rotary),
    **_entry_points(torch.ops.nbx_tune.rotary_qk),
    **_entry_points(torch.ops.nbx_tune.silu_mul),
    **_entry_points(torch.ops.nbx_tune.add_rms_norm),
    **_entry_points(torch.ops.nbx_tune.add_layer_norm),
    **_entry_points(torch.ops.nbx_tune.rope_cos_sin),
    **_entry_points(torch.ops.nbx_tune.cat_kv),
    **_entry_points(torch.ops.nbx_tune.moe_experts),
    # and Gemma's (kernels/serving/gemma_ops.py)
    **_entry_points(torch.ops.nbx_tune.gelu_mul),
    **_entry_points(torch.ops.nbx_tune.softcap),
    **_entry_points(torch.ops.nbx_tune.score_softmax),
    **_entry_points(torch.ops.nbx_tune.offset_rms_norm),
}


def _masked_sdpa_row(op, args, kwargs):
    """SDPA with a mask serve() computes instead of reading (kernels/masked_attention/pattern.py):
    the row of the launch serve() makes, or None."""
    from nbx_tune.kernels.masked_attention.ops import sdpa_launch_row

    return sdpa_launch_row(**{a.name: v for a, v, _ in _bound(op, args, kwargs)})


class _WholeOps(TorchFunctionMode):
    """Counts the ops of `_WHOLE` as one op each, before they pick a device backend.

    Recorded whole, a trace made on meta or the CPU is the one a GPU run gives. This has to
    happen at the torch-function level: in grad mode autograd decomposes a composite op
    before the dispatch mode sees it. Any other function runs with this mode still active
    (`redispatch_function`, torch >= 2.13), so SDPA called inside a Python-level function
    such as `F.multi_head_attention_forward` is seen too; older torch runs it unwatched.
    """

    def __init__(self, recorder: Recorder):
        super().__init__()
        self.recorder = recorder
        self._watched: set = set()  # Python-level functions now running with this mode on

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.recorder.is_paused:
            return func(*args, **kwargs)
        op = _WHOLE.get(func)
        if op is None:
            return self._run(func, types, args, kwargs)
        if inspect.isfunction(func):  # a Python wrapper (F.batch_norm): its names are the schema's
            key = describe(op, (), inspect.signature(func).bind(*args, **kwargs).arguments)
        else:
            key = describe(op, args, kwargs)
        with self.recorder.paused():
            if op is torch.ops.aten.scaled_dot_product_attention.default:
                key = _masked_sdpa_row(op, args, kwargs) or key
            out = func(*args, **kwargs)
            if op is torch.ops.aten.scaled_dot_product_attention.default and out.is_meta \
                    and out.dim() == 4:
                # Meta runs the math path, whose output is contiguous; CUDA's flash and
                # efficient kernels return (batch, seq, heads, dim) memory order (the CPU's
                # when the query is in that order, as in most models). Mimic CUDA, so the
                # copy a model makes after SDPA (or does not) is the one a GPU run makes.
                out = out.transpose(1, 2).contiguous().transpose(1, 2)
        self.recorder.count(key)
        return out

    def _run(self, func, types, args, kwargs):
        """Run `func`; a Python-level one with this mode kept on, to see the calls it makes.

        Builtins make their calls in C++, out of sight anyway. A function already watched
        (`Tensor.unflatten` comes back through its C base method) runs plainly the second time.
        """
        if _redispatch is None or not inspect.isfunction(func) or func in self._watched:
            return func(*args, **kwargs)
        self._watched.add(func)
        try:
            with self:
                return _redispatch(func, types, args, kwargs)
        finally:
            self._watched.discard(func)


def check_writable(path: str | Path) -> None:
    """Raise TraceError unless a trace can be written at `path`; creates nothing."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise TraceError(f"{path}: cannot write: is a directory")
    if not directory.is_dir():
        raise TraceError(f"{path}: cannot write: no directory {directory}")
    # Create and remove a probe beside it: permission bits alone lie for root and ACLs.
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=directory)
    except OSError as e:
        raise TraceError(f"{path}: cannot write: {e.strerror or e}") from None
    os.close(fd)
    os.unlink(probe)


@contextlib.contextmanager
def record(path: str | Path, comments: Iterable[str] = (), fuse: bool | None = None) -> Iterator[Recorder]:
    """Record the body's ops; write `path` when the body exits cleanly, nothing if it raises.
    `fuse` as serve()'s: the trace holds the ops serve() will run."""
    check_writable(path)
    with Recorder(fuse) as rec:
        yield rec
    rec.write(path, comments)


# ----------------------------------------------------------------------------- commands

# A Python interpreter by name: python, python3, python3.12, python3.13t, python.exe.
_PYTHON = re.compile(r"^python(\d+(\.\d+)?t?)?(\.exe)?$")
_OPTS_WITH_VALUE = ("-W", "-X")

USAGE = "nbx-tune trace -o trace.tsv -- python SCRIPT.py ARGS... (or python -m MODULE ARGS...)"


@dataclass(frozen=True)
class TraceSummary:
    path: Path
    rows: int
    launches: int


@dataclass(frozen=True)
class _Program:
    python: str         # the interpreter's path
    options: list[str]  # the interpreter's own options, kept
    target: list[str]   # SCRIPT | -m MODULE | -c CODE
    args: list[str]
    label: str          # how messages name the program


def _split_python_args(name: str, python: str, rest: list[str]) -> _Program:
    """`python [options] (SCRIPT | -m MODULE | -c CODE) ARGS...` into its parts.

    `name` is the interpreter as the user wrote it (for messages), `python` its path.
    """
    options: list[str] = []
    i = 0
    while i < len(rest):
        a = rest[i]
        if a in ("-m", "-c"):
            if i + 1 == len(rest):
                raise TraceError(f"trace: {a} needs an argument; usage: {USAGE}")
            label = rest[i + 1] if a == "-m" else f"{name} -c"
            return _Program(python, options, [a, rest[i + 1]], rest[i + 2:], label)
        if a == "-" or a.startswith("-m") or a.startswith("-c"):
            raise TraceError(f"trace: cannot trace {name} {a}: give a script file, "
                             f"-m MODULE or -c CODE as separate words; usage: {USAGE}")
        if a.startswith("-"):
            take = 2 if a in _OPTS_WITH_VALUE else 1
            options += rest[i:i + take]
            i += take
            continue
        if not Path(a).is_file():
            raise TraceError(f"trace: script {a} not found")
        return _Program(python, options, [a], rest[i + 1:], a)
    raise TraceError(f"trace: {name} was given no script; usage: {USAGE}")


def _program(argv: list[str]) -> _Program:
    if not argv or not argv[0]:
        raise TraceError(f"trace: no command to run; usage: {USAGE}")
    exe, rest = argv[0], argv[1:]
    if exe.endswith(".py"):  # a script named directly runs under this interpreter
        return _split_python_args(sys.executable, sys.executable, argv)
    found = shutil.which(exe)
    if found is None:
        raise TraceError(f"trace: command {exe} not found")
    if not _PYTHON.match(Path(exe).name):
        raise TraceError(f"trace: {exe} is not a Python interpreter; the recorder runs inside "
                         f"Python: {USAGE}")
    return _split_python_args(exe, found, rest)


def _child_failure(prog: _Program, returncode: int, status: Path) -> TraceError:
    """The one-line reason a child run gave no trace."""
    if not status.exists():
        return TraceError(f"trace: {prog.python} could not start the recorder (is nbx-tune "
                          "installed for that Python?); no trace written")
    raised = status.read_text(encoding="utf-8")
    if raised:
        return TraceError(f"trace: {prog.label} raised {raised}; no trace written")
    if returncode < 0:
        return TraceError(f"trace: {prog.label} was killed by signal {-returncode}; no trace written")
    return TraceError(f"trace: {prog.label} exited with status {returncode}; no trace written")


def trace_command(output: Path, argv: list[str]) -> TraceSummary:
    """Run `python SCRIPT ARGS...` with the recorder active; write `output` if it succeeds.

    The command is rewritten to `python [options] -m nbx_tune.tuner.trace.recorder_main --out TMP
    --status TMP -- SCRIPT ARGS...` (see `recorder_main`): the program runs in its own
    process under the interpreter it names, with the recorder around all of it. The child
    writes its rows to a private temporary directory; only a clean exit makes this process
    write `output`, so a failure leaves no file there.
    """
    output = Path(output)
    prog = _program(list(argv))
    check_writable(output)
    with tempfile.TemporaryDirectory(prefix="nbx-tune-trace-") as tmp:
        rows_file, status = Path(tmp) / "rows.tsv", Path(tmp) / "status"
        cmd = [prog.python, *prog.options, "-m", "nbx_tune.tuner.trace.recorder_main",
               "--out", str(rows_file), "--status", str(status), "--", *prog.target, *prog.args]
        returncode = subprocess.run(cmd).returncode
        if returncode != 0:
            raise _child_failure(prog, returncode, status)
        if not rows_file.exists():
            raise TraceError(f"trace: {prog.label} exited before the recorder could write "
                             "its rows (os._exit?); no trace written")
        rows = read_trace(rows_file).rows
        # The child's own comments (`# fusions: ...`, docs/trace-format.md) are kept.
        child = [ln[2:] for ln in rows_file.read_text(encoding="utf-8").splitlines()[1:]
                 if ln.startswith("# ")]
    command = shlex.join(argv).replace("\n", "\\n").replace("\r", "\\r")
    write_trace(output, rows, comments=[f"command: {command}", *child])
    return TraceSummary(output, len(rows), sum(r.count for r in rows))
