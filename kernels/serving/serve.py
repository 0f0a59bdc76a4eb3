"""`nbx_tune.serve()`: run a program's aten ops on the certified kernels.

    with nbx_tune.serve():          # or @nbx_tune.serve() on a function
        logits = model(input_ids)
        print(nbx_tune.serve_stats())

Routing is the kernel library's own data: every registered spec's `serve_ops()` names the
aten ops it runs and how (`KernelSpec.serve_ops`). On entering, each such op gets a kernel
for the device's dispatch key (CUDA; CPU under TRITON_INTERPRET=1) through a
`torch.library` override that sits in front of torch's own kernel, which it keeps
(`torch.library.get_kernel`) to fall back on. So it works wherever the dispatcher runs: under
`torch.inference_mode()`, `no_grad`, and inside CUDA-graph capture; ops no kernel covers
never reach Python. On leaving, the overrides are destroyed and torch's kernels are back.

A call falls through to torch, counted with its reason, when the op's function raises
`KernelError` (a dtype, layout or argument it does not serve; a seat whose torch baseline
on this GPU is faster: kernels/runtime/torch_rule.py; eager, outside a CUDA graph's
capture, one where torch finishes sooner counting host time: kernels/runtime/eager_rule.py,
whose host times serve() measures per op, `host_clocks()`) or anything else. Torch ops
that a kernel calls itself (allocations, copies, a `.contiguous()`) go straight to torch.
Per call the override costs a thread-local read and two writes, the miss tally read twice
and one count (lab/serve_eager_profile/cpu_overhead.py measures it).
The overrides are process-wide while any serve() is active (the dispatcher has no
per-thread table): ops of other threads are served too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field

import torch

from nbx_tune.errors import KernelError, TorchFaster
from nbx_tune.kernels.runtime import certified, eager_rule
from nbx_tune.kernels.serving.fusions import engine as fusions

log = logging.getLogger("nbx_tune")


@dataclass
class OpStats:
    certified: int = 0  # launches on a certified config
    default: int = 0  # launches on the declared default config (a miss)
    torch: Counter = field(default_factory=Counter)  # fell through to torch: reason -> calls

    def to_dict(self) -> dict:
        return {"certified": self.certified, "default": self.default,
                "torch": sum(self.torch.values()), "reasons": dict(self.torch)}


_stats: dict[str, OpStats] = {}
_clocks: dict = {}  # aten op -> its eager_rule.HostClock: what its calls cost the host, served and torch
# busy: inside a served function, whose own torch calls go to torch (every thread starts
# outside); the config read sends a seat torch is faster at back to torch while it is set.
_tls = certified.SERVING
_lock = threading.Lock()
_active = 0
_library = None
_routes: dict | None = None  # aten op -> (OpOverload, function, kernel name)
_routes_from = 0  # how many specs the routes were read from: a plugin loaded later adds routes


def dispatch_key() -> str:
    """CPU under Triton's interpreter (the kernels run on CPU tensors), else CUDA (also ROCm's)."""
    return "CPU" if os.environ.get("TRITON_INTERPRET") == "1" else "CUDA"


def _overload(op: str):
    """`aten.add.Tensor` -> torch.ops.aten.add.Tensor, `aten.mm` -> torch.ops.aten.mm.default;
    any namespace alike (`nbx_tune.rotary`, the library's own ops: kernels/serving/custom_ops.py)."""
    parts = op.split(".")
    if len(parts) not in (2, 3):
        return None
    try:
        packet = getattr(getattr(torch.ops, parts[0]), parts[1], None)
    except AttributeError:  # torch.ops.<ns> exists for any name; a missing op raises
        return None
    if packet is None:
        return None
    return getattr(packet, parts[2] if len(parts) == 3 else "default", None)


def routes() -> dict:
    """aten op -> (OpOverload, function, kernel): what serve() overrides, from the registry."""
    global _routes, _routes_from
    from nbx_tune.kernels.runtime.registry import all_specs

    specs = all_specs()
    if _routes is None or _routes_from != len(specs):
        found = {}
        for spec in specs.values():
            for op, fn in spec.serve_ops().items():
                overload = _overload(op.removesuffix(".default"))
                if overload is None:
                    log.warning("nbx-tune: %s serves %s, which this torch does not have", spec.name, op)
                    continue
                found[op.removesuffix(".default")] = (overload, fn, spec.name)
        _routes, _routes_from = found, len(specs)
    return _routes


def _tensor_slots(overload) -> tuple[int, ...]:
    return tuple(i for i, a in enumerate(overload._schema.arguments)
                 if not a.kwarg_only and str(a.type) in ("Tensor", "Optional[Tensor]"))


def _wrapped(value, like):
    """The 0-d tensor torch would have made of a Python number next to `like`: the dispatcher
    hands a wrapped number to Python as the number, and torch's kernel wants the tensor. Its
    dtype keeps torch's promotion: the tensor's own where the number's kind is no higher,
    else the default float dtype (a float with an integer tensor) or int64."""
    if isinstance(value, bool):
        dt = torch.bool
    elif isinstance(value, int):
        dt = torch.int64 if like is None or like.dtype == torch.bool else like.dtype
    elif isinstance(value, float):
        dt = like.dtype if like is not None and (like.is_floating_point() or like.is_complex()) \
            else torch.get_default_dtype()
    else:
        dt = torch.complex128
    return torch.scalar_tensor(value, dtype=dt, device="cpu")


_NUMBERS = (int, float, complex)


def _torch_args(slots, args):
    for i in slots:  # a loop, not any(<generator>): torch's calls pay it (a kernel's own, fall-throughs)
        if i < len(args) and isinstance(args[i], _NUMBERS):
            break
    else:
        return args
    like = next((a for a in args if isinstance(a, torch.Tensor)), None)
    return tuple(_wrapped(a, like) if i in slots and isinstance(a, _NUMBERS) else a
                 for i, a in enumerate(args))


def _reason(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    msg = text[0] if text else ""
    if isinstance(e, KernelError):
        return msg[:200]
    return f"{type(e).__name__}: {msg}"[:200]


_NEEDS_GRAD = "autograd: a composite op with inputs that require grad (served kernels are forward only)"


def _make_kernel(op: str, fn, original, slots, composite: bool, keyset):
    """The override of one op. Registered without the dispatcher's keyset (passing it costs
    each call a Python object): torch's kernel for this key is called with `keyset`, the
    backend key alone, which is what the dispatcher hands a backend kernel
    (tests/test_serve_host.py checks it does)."""
    stats = _stats.setdefault(op, OpStats())
    clock = _clocks.setdefault(op, eager_rule.HostClock())
    tls = _tls
    pending = fusions.pending  # the list itself (settle changes it in place): a local read per call

    def kernel(*args, **kwargs):
        if tls.busy:  # a kernel's own torch call: straight to torch
            return original.call_boxed(keyset, *_torch_args(slots, args), **kwargs)
        # Autograd sits above a plain op's kernel and records its backward either way; a
        # composite (SDPA) is replaced whole, so with grad wanted torch's own decomposition runs.
        if composite and torch.is_grad_enabled() and any(
                isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            stats.torch[_NEEDS_GRAD] += 1
            return original.call_boxed(keyset, *_torch_args(slots, args), **kwargs)
        if pending:  # model code imported under the context: swap it before it runs on
            fusions.settle()
        if clock.wanted and not eager_rule.capturing():  # a seat asked for this op's host times
            return _timed(clock, kernel, args, kwargs)
        misses = (certified._state or certified.state()).misses
        before = misses.total
        tls.busy = clock
        try:
            out = fn(*args, **kwargs)
        except TorchFaster as e:  # a seat torch is faster at (kernels/runtime/eager_rule.py)
            stats.torch[e.args[0]] += 1
            return original.call_boxed(keyset, *_torch_args(slots, args), **kwargs)
        except Exception as e:  # not served: torch runs it, and the reason is counted
            why = _reason(e)
            if not stats.torch[why] and not isinstance(e, KernelError):
                log.warning("nbx-tune: serve: %s fell through to torch: %s", op, why)
            stats.torch[why] += 1
            return original.call_boxed(keyset, *_torch_args(slots, args), **kwargs)
        finally:
            tls.busy = False
        if misses.total == before:
            stats.certified += 1
        else:
            stats.default += 1
        return out

    return kernel


def _timed(clock, kernel, args, kwargs):
    """One call of an op whose host cost is being measured (eager_rule.HostClock): the side
    with fewer samples runs, through the override's own code, and is timed if it reached a
    seat's check (which made it take that side)."""
    side = clock.turn()
    clock.force, clock.hit, clock.wanted = side, False, False
    try:
        t0 = time.perf_counter()
        out = kernel(*args, **kwargs)
        ms = (time.perf_counter() - t0) * 1e3
    finally:
        hit, clock.force = clock.hit, None
        clock.wanted = not clock.ready
    if hit:
        clock.add(side, ms)
    return out


def host_clocks() -> dict:
    """aten op -> its eager host cost per call under serve() (ms), served and torch, where
    measured (kernels/runtime/eager_rule.py)."""
    return {op: dict(zip(("served_ms", "torch_ms"), c.host_ms())) for op, c in sorted(_clocks.items()) if c.ready}


def _install() -> None:
    global _library
    if not hasattr(torch.library, "get_kernel"):
        raise KernelError(f"serve() needs torch >= 2.9 (torch.library.get_kernel); this is {torch.__version__}")
    key = dispatch_key()
    keyset = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key))
    libs = {}  # namespace -> its IMPL library
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Overriding a previously registered kernel": meant
            for op, (overload, fn, _) in routes().items():
                lib = libs.get(overload.namespace) or libs.setdefault(
                    overload.namespace, torch.library.Library(overload.namespace, "IMPL"))
                name = overload._schema.name.split("::", 1)[1]
                if overload._overloadname not in ("", "default"):
                    name += "." + overload._overloadname
                original = torch.library.get_kernel(overload, key)
                composite = torch._C._dispatch_has_kernel_for_dispatch_key(
                    overload.name(), torch._C.DispatchKey.CompositeImplicitAutograd)
                lib.impl(name, _make_kernel(op, fn, original, _tensor_slots(overload), composite, keyset), key)
    except BaseException:
        for lib in libs.values():
            lib._destroy()
        raise
    _library = list(libs.values())
    from nbx_tune.kernels.serving import compiled_ops

    compiled_ops.install_pass()  # a model compiled inside serve() places the certified kernels


def _uninstall() -> None:
    global _library
    if _library is not None:
        for lib in _library:
            lib._destroy()
        _library = None
        from nbx_tune.kernels.serving import compiled_ops

        compiled_ops.remove_pass()


class serve(contextlib.ContextDecorator):
    """Run the body's aten ops on the certified kernels (a context manager and a decorator).
    Nested and repeated uses share one set of overrides; the last to leave removes them.
    With `fuse` (default: on unless NBX_TUNE_FUSE=0) model code that is a known pattern of
    several ops runs as the one op a kernel serves (`fusions/`: transformers' RMS norm)."""

    def __init__(self, fuse: bool | None = None):
        self.fuse = fusions.enabled_by_default() if fuse is None else fuse
        self._depth = 0  # this object's entries not yet exited (a decorator re-enters it)

    def __enter__(self):
        global _active
        from nbx_tune.kernels import _find_device

        _find_device()  # no GPU: the interpreter, as at every entry point (or one line why not)
        with _lock:
            if _active == 0:
                _install()
            _active += 1
            self._depth += 1
        if self.fuse:
            fusions.acquire()
        return self

    def __exit__(self, *exc):
        global _active
        with _lock:
            if self._depth == 0:  # exited more often than entered: a no-op, nothing to undo
                log.warning("nbx-tune: serve() exited without a matching enter: ignored")
                return False
            self._depth -= 1
        if self.fuse:
            fusions.release()
        with _lock:
            _active -= 1
            if _active == 0:
                _uninstall()
        return False

    @staticmethod
    def stats() -> dict:
        return stats()


def active() -> bool:
    return _active > 0


def stats() -> dict:
    """Per aten op: launches served on a certified config, on the default config (a miss),
    and calls that fell through to torch, with the reasons."""
    return {op: s.to_dict() for op, s in sorted(_stats.items())
            if s.certified or s.default or s.torch}


def reset_stats() -> None:
    """Zero the counts (in place: installed kernels keep their OpStats), fusions' too."""
    for s in _stats.values():
        s.certified = s.default = 0
        s.torch.clear()
    fusions.reset_stats()


def format_stats(data: dict | None = None, fused: dict | None = None) -> str:
    """The stats as a short text table (what `nbx-tune run` prints at exit); with `data` (a
    `stats()` taken earlier), `fused` is the `fusions.stats()` taken with it."""
    if data is None:
        data, fused = stats(), fusions.stats()
    if not data:
        return "nbx-tune serve: no launch of a served op"
    width = max(len(op) for op in data)
    lines = [f"{'op':<{width}}  {'certified':>9}  {'default':>7}  {'torch':>5}  why torch"]
    tot = Counter()
    for op, s in data.items():
        why = "; ".join(f"{r} ({n})" for r, n in sorted(s["reasons"].items(), key=lambda kv: -kv[1]))
        lines.append(f"{op:<{width}}  {s['certified']:>9}  {s['default']:>7}  {s['torch']:>5}  {why}")
        tot.update(certified=s["certified"], default=s["default"], torch=s["torch"])
    lines.append(f"{'total':<{width}}  {tot['certified']:>9}  {tot['default']:>7}  {tot['torch']:>5}")
    if fused:
        lines.append("fused: " + ", ".join(f"{name} ({n} calls)" for name, n in fused.items()))
    return "\n".join(lines)
