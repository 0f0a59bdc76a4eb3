"""The direct launch: an op's exact call, remembered once and replayed without Triton's binding.

The first call of a public op under a key runs the op's ordinary path (checks, the config
lookup, allocations, `kernel[grid](...)` through Triton) while `remember` records what it
allocated (`empty`) and launched (kernels wrapped by `recorded`). The record becomes a
replay: a function generated for that call which allocates the same outputs and calls each
compiled kernel's launcher with the same arguments (as `CompiledKernel[grid]` does, without
its per-call device and hook lookups), tensors passed as the new call's addresses. A later call with the same key costs the key, one dict lookup
and the replay:

    def op(x, alpha):
        key = (SPEC, alpha, *launch.tensor_key(x))   # or built inline, for speed
        hit = launch.REMEMBERED.get(key)
        if hit is not None:
            return hit(x)
        return launch.remember(key, (x,), _op, x, alpha)   # _op: the ordinary path

The key must hold everything the op's launches depend on beside its inputs' addresses:
each input's shape, strides, dtype and device and its address's low 4 bits (Triton compiles
a pointer for 16-byte alignment or not, an integer for being 1 or a multiple of 16, and
both follow from these), and every other argument (scalars are written into the replay).
A record is remembered only if each tensor a kernel receives is an input at its own
address, an allocation made through `empty` (at any offset) or a `scratch` view: a copy or
a buffer made any other way would be a stale address in a replay, so such calls stay on
the ordinary path every time (a copy made for a TMA descriptor; non-contiguous inputs and
matmul's padded operands are staged by the copy kernel instead, `copy.dense`,
`matmul.stage_operands`, which a replay makes again).
Nor is it remembered under the interpreter (nothing is compiled), with no launch, with
inputs at one address, or with an argument of a kind it does not know. TMA descriptors are
rebuilt around each call's tensor.

Rules for an op's ordinary path: launch kernels wrapped by `recorded`, allocate what
kernels write through `empty` (or `scratch`, for what nothing reads), write nothing with
torch ops into an allocation or an input, and call no other public op (its replay would
not be recorded). `reload()` of the certified configs forgets every replay (`forget`), so
a new certificate is served.
"""

from __future__ import annotations

import functools
import inspect
import math
import threading
from collections import Counter

REMEMBERED: dict = {}  # key -> replay; never rebound (ops hold it), cleared in place
LIMIT = 1 << 12  # replays remembered before the memo starts over
REFUSED: Counter = Counter()  # why records were not remembered, for tests and launch_stats()

_tls = threading.local()
_signatures: dict = {}
_scratch: dict = {}  # device -> the shared buffer of `scratch`
_counters: dict = {}  # (device, stream) -> the shared buffer of `counters`
_outgrown: list = []
_scratch_lock = threading.Lock()


def tensor_key(t) -> tuple:
    """What Triton's compile and a replay depend on in one input tensor (its address aside)."""
    return (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & 15)


def forget() -> None:
    """Drop every replay (and the tally of refusals): later calls are recorded afresh."""
    REMEMBERED.clear()
    REFUSED.clear()


def through_triton(kernel, grid, args, kwargs):
    """kernel[grid](*args, **kwargs): the compiled kernel on a device, None under the
    interpreter. Tests replace it to hand out fakes of compiled kernels."""
    return kernel[grid](*args, **kwargs)


def run(kernel, grid, *args, **kwargs):
    """Launch `kernel[grid](*args, **kwargs)` through Triton, recorded if a call is being
    remembered (what `recorded(kernel)[grid](...)` does)."""
    compiled = through_triton(kernel, grid, args, kwargs)
    rec = getattr(_tls, "rec", None)
    if rec is not None:
        rec.launches.append((kernel, compiled, grid, args, kwargs))
    return compiled


class recorded:
    """A Triton kernel whose launches a call being remembered records. A family wraps each
    of its kernels once, after the definition (`_k = launch.recorded(_k)`), and launches it
    as ever, `_k[grid](...)`: the launcher's code, and so its certificates' source hash,
    stay as they were. Everything else is the kernel's (`fn`, the source hash reads it)."""

    def __init__(self, kernel):
        self.kernel, self.fn = kernel, kernel.fn

    def __getitem__(self, grid):
        return functools.partial(run, self.kernel, grid)

    def __getattr__(self, name):
        return getattr(self.kernel, name)


def empty(shape, dtype, device, strides=None):
    """torch.empty(shape, dtype=dtype, device=device) (torch.empty_strided with `strides`),
    made again by a replay."""
    import torch

    if strides is None:
        t = torch.empty(shape, dtype=dtype, device=device)
    else:
        t = torch.empty_strided(shape, strides, dtype=dtype, device=device)
    rec = getattr(_tls, "rec", None)
    if rec is not None:
        rec.allocs.append(t)
    return t


def scratch(shape, dtype, device):
    """A tensor for what a kernel writes and nothing reads, the op included (a logsumexp, a
    norm's statistics): a view of one buffer per device shared by every call, which saves
    a replay an allocation. Concurrent writes to it are harmless for that reason. Outgrown
    buffers are kept, never freed: replays (and CUDA graphs captured from them) hold their
    addresses as constants."""
    import torch

    nbytes = math.prod(shape) * dtype.itemsize
    buf = _shared(_scratch, device, nbytes, 512, lambda size: torch.empty(size, dtype=torch.uint8, device=device))
    rec = getattr(_tls, "rec", None)
    if rec is not None:
        rec.scratch.add(buf.untyped_storage().data_ptr())
    return buf[:nbytes].view(dtype).view(shape)


def _shared(table: dict, key, n: int, least: int, make):
    """table[key], made by make(size) with at least n elements (doubling when outgrown)."""
    buf = table.get(key)
    if buf is not None and buf.numel() >= n:
        return buf
    with _scratch_lock:
        buf = table.get(key)
        if buf is None or buf.numel() < n:
            if buf is not None:
                _outgrown.append(buf)
            buf = table[key] = make(max(n, least, 0 if buf is None else 2 * buf.numel()))
    return buf


def _stream_of(device) -> int:
    """The device's current stream, as the raw handle Triton launches on (0 off CUDA)."""
    if getattr(device, "type", None) != "cuda":
        return 0
    import torch

    return torch._C._cuda_getCurrentRawStream(device.index if device.index is not None else torch.cuda.current_device())


def _counters_buffer(n: int, device):
    import torch

    return _shared(_counters, (device, _stream_of(device)), n, 1024,
                   lambda size: torch.zeros(size, dtype=torch.int32, device=device))


def counters(n: int, device):
    """n int32 counters at zero, which the kernels using them leave at zero (the last of a
    tile's programs resets its count): one buffer per device and stream, shared by every
    call on that stream, whose launches run in order (two streams never share one). A replay
    looks up its stream's buffer on every call (`_counters_at`); it makes nothing."""
    buf = _counters_buffer(n, device)
    rec = getattr(_tls, "rec", None)
    if rec is not None:
        rec.counters[buf.untyped_storage().data_ptr()] = (n, device)
    return buf[:n]


def _counters_at(n: int, device) -> int:
    """The address of `counters(n, device)` on the current stream."""
    return _counters_buffer(n, device).data_ptr()


def note_miss(counter, label) -> None:
    """The config lookup of a call being remembered served an uncertified seat: its replay
    counts the miss on every call too (certified.launch_stats)."""
    rec = getattr(_tls, "rec", None)
    if rec is not None:
        rec.misses.append((counter, label))


def guard(check) -> None:
    """The call being remembered depends on more than its key: its replay calls `check()`
    first, which raises where the ordinary path would (certified.config_for: a seat serve()
    hands to torch)."""
    rec = getattr(_tls, "rec", None)
    if rec is not None and check not in rec.guards:
        rec.guards.append(check)


def remember(key, inputs: tuple, slow, *args):
    """slow(*args), the op's ordinary path, recorded; remembered under key as a replay taking
    `inputs` (the tensors among args, in order; None where an optional one is absent) when
    it can be (module docstring). Returns what slow returned."""
    if getattr(_tls, "rec", None) is not None:  # inside another op's record: that one records
        return slow(*args)
    rec = _Record(inputs)
    _tls.rec = rec
    try:
        result = slow(*args)
    finally:
        _tls.rec = None
    replay, why = rec.replay(result)
    if replay is None:
        REFUSED[why] += 1
        return result
    if rec.guards:
        replay = _guarded(replay, tuple(rec.guards))
    if len(REMEMBERED) >= LIMIT:
        REMEMBERED.clear()
    REMEMBERED[key] = replay
    return result


def _guarded(replay, checks):
    def guarded(*inputs):
        for check in checks:
            check()
        return replay(*inputs)

    guarded.source, guarded.values = replay.source, replay.values  # what `listing` reads
    return guarded


# ----------------------------------------------------------------------------- records

def listing(replay) -> str:
    """A replay's source with its values (ints, shapes, labels: closure constants) written
    in, as the call it was recorded from had them: for reading and for tests."""
    import re

    return re.sub(r"\bn\d+\b", lambda m: repr(replay.values[m.group(0)]) if m.group(0) in replay.values
                  else m.group(0), replay.source)


_CODE: dict = {}  # replay source -> its compiled code: one per launch structure, not per shape


def _compiled(src: str):
    code = _CODE.get(src)
    if code is None:
        if len(_CODE) >= LIMIT:
            _CODE.clear()
        code = _CODE[src] = compile(src, "<nbx_tune replay>", "exec")
    return code


class _Refused(Exception):
    """A record that cannot become a replay (the message says why)."""


def _tensor_types():
    import torch

    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:  # Triton before 3.4
        TensorDescriptor = ()
    return torch.Tensor, TensorDescriptor


def _bound(kernel, args, kwargs) -> list:
    """Every argument of the kernel in its order, constexprs and defaults included: what
    `CompiledKernel[grid]` takes. Launch options (num_warps, ...) are not arguments."""
    sig = _signatures.get(kernel)
    if sig is None:
        sig = _signatures[kernel] = inspect.signature(kernel.fn)
    named = {k: v for k, v in kwargs.items() if k in sig.parameters}
    bound = sig.bind(*args, **named)
    bound.apply_defaults()
    return list(bound.arguments.values())


def _with_base(desc, base):
    """A copy of a TensorDescriptor around another tensor (its checks were passed by the
    first; the key holds everything they read)."""
    new = object.__new__(type(desc))
    new.__dict__.update(desc.__dict__)
    new.base = base
    return new


class _Record:
    def __init__(self, inputs):
        self.inputs = inputs
        self.allocs: list = []
        self.launches: list = []
        self.misses: list = []
        self.scratch: set = set()  # storages of `scratch` buffers: addresses that never change
        self.counters: dict = {}  # storages of `counters` buffers -> (n, device): one per stream
        self.guards: list = []  # called before each replay (guard)

    def replay(self, result):
        """(replay, None) or (None, why)."""
        try:
            return self._generate(result), None
        except _Refused as e:
            return None, str(e)

    def _generate(self, result):
        import torch

        Tensor, Descriptor = _tensor_types()
        if not self.launches:
            raise _Refused("no launch")
        names: dict = {}  # object id -> name in the generated closure
        consts: dict = {}

        def bind(obj, stem):
            key = id(obj)
            if key not in names:
                names[key] = f"{stem}{len(consts)}"
                consts[names[key]] = obj
            return names[key]

        def value(v):
            """An int, a float, a tuple of ints or a label, as a constant of the closure, not
            a literal: the source then depends on the launches' structure only, not on the
            shapes, so a call at a new length reuses compiled code (`_compiled`)."""
            key = ("value", type(v), repr(v) if isinstance(v, float) else v)  # -0.0 is not 0.0
            if key not in names:
                names[key] = f"n{len(consts)}"
                consts[names[key]] = v
            return names[key]

        params = [f"i{k}" for k in range(len(self.inputs))]
        body: list[str] = []
        ptr_of_input: dict = {}
        for k, t in enumerate(self.inputs):
            if t is not None and not isinstance(t, Tensor):
                raise _Refused("an input that is not a tensor")
        by_ptr: dict = {}
        for k, t in enumerate(self.inputs):
            if t is not None:
                by_ptr.setdefault(t.data_ptr(), []).append(k)
        alloc_storage = {}
        for j, a in enumerate(self.allocs):
            if a.data_ptr() % 16:
                raise _Refused("an allocation off 16-byte alignment")
            alloc_storage[a.untyped_storage().data_ptr()] = j
            body.append(f"a{j} = {self._alloc_expr(a, bind, value)}")
            body.append(f"q{j} = a{j}.data_ptr()")

        def input_ptr(k):
            if k not in ptr_of_input:
                ptr_of_input[k] = f"p{k}"
                body.insert(0, f"p{k} = i{k}.data_ptr()")
            return ptr_of_input[k]

        def resolve(t):
            """('alloc', j, byte offset), ('input', k, 0), ('scratch', address, 0) or
            ('counters', (n, device), 0)."""
            storage = t.untyped_storage().data_ptr()
            j = alloc_storage.get(storage)
            if j is not None:
                return "alloc", j, t.data_ptr() - self.allocs[j].data_ptr()
            if storage in self.scratch:
                return "scratch", t.data_ptr(), 0
            if storage in self.counters:
                return "counters", self.counters[storage], 0
            ks = by_ptr.get(t.data_ptr(), ())
            if len(ks) != 1:
                raise _Refused("a tensor argument at no input's address" if not ks
                               else "inputs at one address")
            return "input", ks[0], 0

        def pointer(t):
            kind, n, off = resolve(t)
            if kind == "scratch":
                return value(n)
            if kind == "counters":  # the current stream's buffer, looked up per call
                return f"{bind(_counters_at, 'f')}({value(n[0])}, {bind(n[1], 'v')})"
            base = input_ptr(n) if kind == "input" else f"q{n}"
            return base if off == 0 else f"{base} + {value(off)}"

        def literal(v):
            if v is None or isinstance(v, (bool, str)):
                return repr(v)
            if isinstance(v, int):
                return value(int(v))
            if isinstance(v, float):
                return value(v) if math.isfinite(v) else bind(v, "c")
            if _is_constant(v):
                return bind(v, "c")
            raise _Refused(f"an argument of type {type(v).__name__}")

        for n, (kernel, compiled, grid, args, kwargs) in enumerate(self.launches):
            if compiled is None:
                raise _Refused("nothing compiled (the interpreter)")
            if callable(grid):
                raise _Refused("a grid function")
            grid3 = tuple(int(g) for g in (*grid, 1, 1)[:3])
            # Triton 3.6 raised IndexError on a 2-tuple grid here: always three.
            runner = bind(compiled[grid3], "r")
            lean = _lean_launcher(compiled)
            out = []
            for v in _bound(kernel, args, kwargs):
                if isinstance(v, Tensor):
                    out.append(pointer(v))
                elif Descriptor and isinstance(v, Descriptor):
                    kind, k, off = resolve(v.base)
                    if kind != "input":
                        raise _Refused("a descriptor of no input")
                    # Held without its tensor: a replay must not keep a call's operand alive.
                    out.append(f"{bind(_with_base, 'f')}({bind(_with_base(v, None), 'd')}, i{k})")
                else:
                    out.append(literal(v))
            args_src = ", ".join(out)
            if lean is None:
                body.append(f"{runner}({args_src})")
            else:
                # What CompiledKernel[grid] does, less its per-call lookups: the compiled
                # launcher on the current stream, while no launch hook (a profiler) is set;
                # where this Triton's C launch is known, that without its Python wrapper.
                run, function, meta, hooks, stream, device = (bind(x, "l") for x in lean)
                head = f"{value(grid3[0])}, {value(grid3[1])}, {value(grid3[2])}, {stream}({device}()), {function}"
                body.append(f"if {_no_hooks_expr(lean[3], hooks, bind)}:")
                c = _c_launch(compiled)
                if c is None:
                    body.append(f"    {run}({head}, {meta}, None, None, None, {args_src})")
                elif c[1] == "flat":  # Triton 3.6: scratch pointers, then the launcher's arguments
                    fn, _, coop, pdl = c
                    body.append(f"    {bind(fn, 'l')}({head}, {coop!r}, {pdl!r}, None, None, {meta}, None, None, "
                                f"None, {args_src})")
                else:  # "packed", Triton 3.9: the kernel's arguments as one tuple, with its signature
                    fn, _, coop, pdl, annotations, signature = c
                    body.append(f"    {bind(fn, 'l')}({head}, {coop!r}, {pdl!r}, {meta}, None, None, None, None, "
                                f"None, {bind(annotations, 'l')}, {bind(signature, 'l')}, ({args_src},))")
                body.append("else:")
                body.append(f"    {runner}({args_src})")
        for counter, label in self.misses:
            body.append(f"{bind(counter, 'm')}[{value(label)}] += 1")
        body.append(f"return {self._result_expr(result, Tensor, value)}")
        src = (f"def make({', '.join(consts)}):\n"
               f"    def replay({', '.join(params)}):\n"
               + "".join(f"        {line}\n" for line in body)
               + "    return replay\n")
        scope = {"torch": torch}
        exec(_compiled(src), scope)
        fn = scope["make"](**consts)
        fn.source = src
        fn.values = {k: v for k, v in consts.items() if k[0] == "n"}
        return fn

    def _alloc_expr(self, a, bind, value) -> str:
        # torch.empty_like is the cheapest allocation where an input has the same layout
        # (it keeps a dense input's strides); empty_strided otherwise, one signature to parse.
        for k, t in enumerate(self.inputs):
            if (t is not None and t.shape == a.shape and t.stride() == a.stride() and t.dtype == a.dtype
                    and t.device == a.device and t.is_contiguous()):
                return f"torch.empty_like(i{k})"
        return (f"torch.empty_strided({value(tuple(a.shape))}, {value(tuple(a.stride()))}, "
                f"dtype={bind(a.dtype, 't')}, device={bind(a.device, 'v')})")

    def _result_expr(self, result, Tensor, value) -> str:
        if isinstance(result, tuple):
            return "(" + "".join(f"{self._result_expr(r, Tensor, value)}, " for r in result) + ")"
        if not isinstance(result, Tensor):
            raise _Refused("a result that is not a tensor")
        for j, a in enumerate(self.allocs):
            if result is a:
                return f"a{j}"
        for k, t in enumerate(self.inputs):
            if result is t:
                return f"i{k}"
        for j, a in enumerate(self.allocs):
            if result.data_ptr() == a.data_ptr() and result.is_contiguous() and result.numel() == a.numel():
                return f"a{j}.view({value(tuple(result.shape))})"
        raise _Refused("a result that is neither an input nor an allocation")


def _hooks_idle(hook) -> bool:
    """No launch hook to call: None (older Triton) or an empty HookChain (newer Triton,
    where the knob is never None)."""
    return hook is None or not getattr(hook, "calls", True)


def _no_hooks(knobs) -> bool:
    return _hooks_idle(knobs.launch_enter_hook) and _hooks_idle(knobs.launch_exit_hook)


def _no_hooks_expr(knobs, name: str, bind) -> str:
    """A replay's test for `_no_hooks(knobs)`, inline where the hooks are chains (newer
    Triton): the chains it was made with are still the knobs' and still empty (a hook
    added, or a knob set to something else, takes the full path), at no call's cost."""
    enter, exit_ = knobs.launch_enter_hook, knobs.launch_exit_hook
    if not (isinstance(getattr(enter, "calls", None), list) and isinstance(getattr(exit_, "calls", None), list)):
        return f"{bind(_no_hooks, 'l')}({name})"
    e, x = bind(enter, "l"), bind(exit_, "l")
    return (f"not {e}.calls and not {x}.calls and {name}.launch_enter_hook is {e} "
            f"and {name}.launch_exit_hook is {x}")


def _c_launch(compiled):
    """The C launch under a compiled kernel's Python launcher (`CudaLauncher.__call__`, whose
    per-call work is scratch allocation only), as (launch, form, cooperative, pdl[, arg
    annotations, signature]), for the two Triton releases whose call it matches: 3.6 ("flat")
    and 3.9 ("packed"). None for any other, for kernels that need scratch memory or a
    tensor-descriptor wrapper, and for anything else: the replay then calls the launcher."""
    import triton

    run = getattr(compiled, "run", None)
    if type(run).__name__ != "CudaLauncher" or getattr(run, "gsan_enabled", False):
        return None
    fn = getattr(run, "launch", None)
    if type(fn).__name__ != "builtin_function_or_method" or run.global_scratch_size or run.profile_scratch_size:
        return None
    coop, pdl = bool(run.launch_cooperative_grid), bool(run.launch_pdl)
    version = triton.__version__.split("+")[0].split(".")[:2]
    if version == ["3", "6"] and not hasattr(run, "arg_annotations"):
        return fn, "flat", coop, pdl
    if version == ["3", "9"] and hasattr(run, "arg_annotations") and hasattr(run, "kernel_signature"):
        return fn, "packed", coop, pdl, run.arg_annotations, run.kernel_signature
    return None


def _lean_launcher(compiled):
    """(run, function, packed_metadata, hooks, get_stream, get_device) of a compiled kernel
    whose launcher takes the arguments CompiledKernel[grid] passes it (Triton 3.2 to 3.9:
    grid, stream, function, metadata, launch metadata, enter and exit hooks, arguments),
    or None: the replay then calls CompiledKernel[grid]."""
    try:
        from triton import knobs
        from triton.runtime import driver

        import torch

        active = driver.active
        device = active.get_current_device
        if device is torch.cuda.current_device:  # its lazy-init check is done: a kernel compiled
            device = torch._C._cuda_getDevice
        parts = (compiled.run, compiled.function, compiled.packed_metadata, knobs.runtime,
                 active.get_current_stream, device)
    except Exception:  # another Triton, or no GPU driver
        return None
    return parts if all(callable(p) for p in (parts[0], parts[4], parts[5])) else None


def _is_constant(v) -> bool:
    """Triton constexprs and dtypes, torch dtypes: values a kernel is compiled for, passed as they are."""
    import torch
    import triton.language as tl

    return isinstance(v, (tl.constexpr, tl.dtype, torch.dtype))
