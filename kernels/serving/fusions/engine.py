"""Fusions: model code whose few torch ops are one op the kernel library serves.

transformers' Llama computes an RMS norm in eight launches (a cast, pow, mean, add, rsqrt,
mul, a cast back, mul by the weight), its rotary embedding in five per tensor, and SwiGLU's
activation in two; GPT-2's gelu_new takes eight. Each is one op here (`F.rms_norm`,
`torch.ops.nbx_tune.rotary_qk`, `.silu_mul`, `F.gelu(approximate="tanh")`), which serve() runs
on a kernel; so are a decoder layer's residual add and the norm after attention
(`.add_rms_norm`, GPT-2's `.add_layer_norm`), the rotary embedding's cos and sin tables
(`.rope_cos_sin`, nine launches once a forward) and a KV cache's two cats (`.cat_kv`); a
layer's last add computes the norm the next layer starts with (hand_off.py). While a
fusion context is active (serve() and the trace recorder enter one), code that is exactly a
known pattern is swapped for code that calls the one op: a module class's `forward` (or,
behind decorators that wrap it, the function in the innermost wrapper's closure, the
decorators kept), a function a model module calls by its global name, or a method of a class
that is not a module (transformers' DynamicLayer.update). Leaving restores the original.

The match is on the syntax tree of the source against the pattern's (decorators,
annotations, docstrings and layout aside), on what the global names it uses are bound to
(`torch` is torch), and on the helpers it calls being their patterns too, so a variant is
never swapped: Gemma's RMS norm scales by (1 + weight) and does not match. Classes (and the
functions of their module) defined while a context is active, as a program importing
transformers under `nbx-tune run` or `trace` defines them, are noted as the classes are
created (`nn.Module.__init_subclass__`) and checked once their module is imported
(`settle`). A swapped forward runs the original with grad enabled (fusions serve inference,
under no_grad or inference_mode) and wherever the one op would not give the pattern's result
(another dtype, another layout). `NBX_TUNE_FUSE=0` turns fusions off
for serve() and the recorder.
"""

from __future__ import annotations

import ast
import inspect
import math
import os
import sys
import textwrap
import threading
import weakref
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from types import CodeType, FunctionType, ModuleType
from typing import Callable

import torch
import torch.nn.functional as F

from nbx_tune.kernels.serving import custom_ops, hand_off

ENV_FUSE = "NBX_TUNE_FUSE"

# What a pattern's global names must be bound to in the model's module.
_GLOBALS = {"torch": torch, "nn": torch.nn, "F": F, "math": math}


def enabled_by_default() -> bool:
    """Fusions are on unless NBX_TUNE_FUSE is 0, false, no or off."""
    return os.environ.get(ENV_FUSE, "1").strip().lower() not in ("0", "false", "no", "off")


def shape_of(source: str) -> str | None:
    """A function's source as its syntax tree, without what does not run: decorators,
    annotations, the docstring, comments, layout and line numbers."""
    try:
        node = ast.parse(textwrap.dedent(source)).body[0]
    except (SyntaxError, IndexError):
        return None
    if not isinstance(node, ast.FunctionDef):
        return None
    node.decorator_list, node.returns = [], None
    for arg in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs,
                node.args.vararg, node.args.kwarg):
        if arg is not None:
            arg.annotation = None
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        node.body = body[1:]
    return ast.dump(node)


@dataclass(frozen=True)
class Pattern:
    """A function as the model library writes it; `helpers` are the module-level functions
    it calls, which must be their own patterns in the model's module."""

    source: str
    helpers: tuple[tuple[str, "Pattern"], ...] = ()

    @cached_property
    def code(self) -> CodeType:
        """The pattern compiled, for a cheap first test of names."""
        namespace = dict(_GLOBALS)
        exec(compile(self.source, "<nbx_tune pattern>", "exec", dont_inherit=True), namespace)
        return next(v for k, v in namespace.items() if k not in _GLOBALS and k != "__builtins__").__code__

    @cached_property
    def shape(self) -> str | None:
        return shape_of(self.source)

    @cached_property
    def verdicts(self) -> weakref.WeakKeyDictionary:
        """function -> whether its source has this pattern's syntax: read once a function."""
        return weakref.WeakKeyDictionary()

    def matches(self, fn) -> bool:
        """`fn` is this pattern. Compiled code would be a cheaper test, but the compiler's
        choices differ between builds of one Python: the source decides."""
        if not isinstance(fn, FunctionType):
            return False
        ref, code = self.code, fn.__code__
        if (code.co_names, code.co_varnames, code.co_argcount) != (ref.co_names, ref.co_varnames, ref.co_argcount):
            return False  # cheap first: most functions differ here
        if any(fn.__globals__.get(n, _GLOBALS[n]) is not _GLOBALS[n] for n in code.co_names if n in _GLOBALS):
            return False
        known = self.verdicts
        if fn not in known:  # reading the source is the cost of a context's entry: once a function
            try:
                source = inspect.getsource(fn)
            except Exception:  # no source to read (OSError, TypeError, a stale line cache): never swapped unseen
                source = None
            known[fn] = source is not None and shape_of(source) == self.shape
        return known[fn] and all(helper.matches(fn.__globals__.get(name)) for name, helper in self.helpers)


@dataclass(frozen=True)
class Fusion:
    name: str       # how the stats name it
    op: str         # the op the pattern becomes
    pattern: Pattern
    make: Callable[[Callable], Callable]  # the original -> the fused code
    function: str | None = None  # a module-level function's name; None: a class's forward
    method: str | None = None  # "Class.method" of a class that is not a module (a KV cache's)


_calls: Counter = Counter()  # fusion name -> calls that ran the one op


def _class_forward(kind: type):
    """The forward a module class runs, as written: a swapped one's original."""
    for k in kind.__mro__:
        fn = k.__dict__.get("forward")
        if fn is not None:
            return _originals.get(fn, fn)
    return None


def _called_plainly(module) -> bool:
    """Calling `module` runs its class's forward and nothing else: no hooks, no forward of the
    instance's own (accelerate's offloading sets one), so a fusion may skip the call."""
    hooks = torch.nn.modules.module
    return not (module._forward_hooks or module._forward_pre_hooks or "forward" in module.__dict__
                or hooks._global_forward_hooks or hooks._global_forward_pre_hooks)


_norm_types: dict[type, bool] = {}


def is_rms_norm(module) -> bool:
    """`module` is an RMS norm of the RMS_NORM pattern (a weight of one dim), called plainly."""
    kind = type(module)
    if kind not in _norm_types:
        from nbx_tune.kernels.serving.fusions.llama import RMS_NORM  # the pattern imports this module

        _norm_types[kind] = RMS_NORM.pattern.matches(_class_forward(kind))
    return _norm_types[kind] and _called_plainly(module)


def is_layer_norm(module) -> bool:
    """`module` is torch's LayerNorm over one dim with a weight and a bias, called plainly."""
    return (isinstance(module, torch.nn.LayerNorm) and _class_forward(type(module)) is torch.nn.LayerNorm.forward
            and len(module.normalized_shape) == 1 and module.weight is not None and module.bias is not None
            and _called_plainly(module))


def _fusable(x, residual, *affine) -> bool:
    """The one op gives the pattern's result: one shape and dtype, a 1-d affine of that dtype."""
    return x.shape == residual.shape and residual.dtype == x.dtype and all(
        t.dtype == x.dtype and t.dim() == 1 for t in affine)


def _add_and_hand_off(layer, norm_attr: str, residual, out):
    """A layer's last residual add, `residual + out`, and where one op gives it, the norm
    that reads the sum next, handed to it (kernels/serving/hand_off.py): the next layer's first norm
    (`norm_attr` on it), or the model's final norm where its forward takes a hand-off."""
    after, norm = hand_off.successor(layer, norm_attr)
    if norm is None or not _called_plainly(layer) or (after is not None and not _called_plainly(after)) \
            or (after is None and type(norm).__dict__.get("forward") not in _originals):
        return residual + out
    if is_rms_norm(norm) and _fusable(out, residual, norm.weight):
        _calls["add_rms_norm"] += 1
        normed, total = custom_ops.add_rms_norm(out, residual, norm.weight, norm.variance_epsilon)
    elif is_layer_norm(norm) and _fusable(out, residual, norm.weight, norm.bias):
        _calls["add_layer_norm"] += 1
        normed, total = custom_ops.add_layer_norm(out, residual, norm.weight, norm.bias, norm.eps)
    else:
        return residual + out
    hand_off.hand(norm, total, normed)
    return total



# The fusions known, in the order they are tried: set by the package (fusions/__init__.py)
# from the pattern modules, which import this one.
FUSIONS: tuple[Fusion, ...] = ()


def underlying(obj, name: str):
    """The function behind a module-level name: itself, or the one a wrapper module calls
    (transformers wraps functions such as apply_rotary_pos_emb in an nn.Module that a
    kernel hub may replace; its forward calls the function it closes over)."""
    if isinstance(obj, FunctionType):
        return obj
    if isinstance(obj, torch.nn.Module):
        forward = type(obj).__dict__.get("forward")
        for cell in getattr(forward, "__closure__", None) or ():
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if isinstance(value, FunctionType) and value.__name__ == name:
                return value
    return None


def _decorated(fn):
    """(the function decorators' wrappers call in the end, the closure cell of the innermost
    wrapper that holds it), or (None, None): transformers wraps decoder layers' forward in
    kwarg-renaming decorators, which are kept; the function in the cell is swapped."""
    cell = None
    while True:
        inner = getattr(fn, "__wrapped__", None)
        if not isinstance(fn, FunctionType) or not isinstance(inner, FunctionType):
            return (fn, cell) if cell is not None else (None, None)
        for c in fn.__closure__ or ():
            try:
                if c.cell_contents is inner:
                    cell = c
                    break
            except ValueError:  # an empty cell
                continue
        else:
            return None, None  # a wrapper that does not call what it names: left alone
        fn = inner


_lock = threading.RLock()
_active = 0
# (id of a class, module or closure cell, attribute) -> (that owner, original, fused, fusion,
# where); by id, as cells cannot be hashed (the owner, held here, keeps its id)
_swapped: dict[tuple[int, str], tuple[object, object, Callable, Fusion, str]] = {}
_originals: dict[Callable, object] = {}  # fused -> original, while swapped
_hook_saved = None


def _swap(owner, attr: str, original, one_op: Callable, fusion: Fusion, where: str) -> None:
    def fused(*args, **kwargs):
        # A reference taken while swapped (`from m import f` in a module imported then)
        # outlives the context: outside one it is the original again. With grad wanted the
        # original runs too: serve()'s kernels are forward only, the model's ops have a backward.
        # Under torch.compile the original is traced: Inductor fuses it (compiled_ops.py).
        return (one_op if _active and not torch.is_grad_enabled() and not torch.compiler.is_compiling()
                else original)(*args, **kwargs)

    fused.__qualname__ = getattr(original, "__qualname__", attr)
    fused.__doc__ = f"{where} fused into {fusion.op} by nbx-tune."
    fused.__wrapped__ = original
    setattr(owner, attr, fused)
    _swapped[(id(owner), attr)] = (owner, original, fused, fusion, where)
    _originals[fused] = original


def _consider_class(cls: type) -> None:
    fn = cls.__dict__.get("forward")
    if fn is None or (id(cls), "forward") in _swapped:
        return
    where = f"{cls.__module__}.{cls.__qualname__}.forward"
    inner, cell = _decorated(fn)
    for fusion in FUSIONS:
        if fusion.function is not None or fusion.method is not None:
            continue
        if fusion.pattern.matches(fn):
            _swap(cls, "forward", fn, fusion.make(fn), fusion, where)
            return
        if cell is not None and fusion.pattern.matches(inner):
            _swap(cell, "cell_contents", inner, fusion.make(inner), fusion, where)
            return


def _consider_module(module) -> None:
    namespace = getattr(module, "__dict__", None)
    if not isinstance(module, ModuleType) or not isinstance(namespace, dict):
        return
    for fusion in FUSIONS:
        if fusion.method is not None:
            _consider_method(module, namespace, fusion)
            continue
        name = fusion.function
        if name is None or (id(module), name) in _swapped or name not in namespace:
            continue
        original = namespace[name]
        if fusion.pattern.matches(underlying(original, name)):
            _swap(module, name, original, fusion.make(original), fusion, f"{module.__name__}.{name}")


def _consider_method(module, namespace: dict, fusion: Fusion) -> None:
    """A method of a class the module defines (not one it imports), if it is the pattern."""
    cls_name, name = fusion.method.split(".")
    cls = namespace.get(cls_name)
    if not isinstance(cls, type) or cls.__module__ != module.__name__ or (id(cls), name) in _swapped:
        return
    original = cls.__dict__.get(name)
    if fusion.pattern.matches(original):
        _swap(cls, name, original, fusion.make(original), fusion, f"{module.__name__}.{cls_name}.{name}")


def _targets() -> list[str]:
    """The module-level names fusions look for: functions, and classes that are not modules."""
    return [f.function or f.method.split(".")[0] for f in FUSIONS if f.function or f.method]


def _consider_modules() -> None:
    """Every loaded module (none being imported) that defines a name of `_targets()`."""
    names = _targets()
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if isinstance(namespace, dict) and any(n in namespace for n in names) \
                and not _importing(module):  # one being imported: its classes' creation will tell
            _consider_module(module)


def _subclasses(root: type):
    seen, stack = set(), [root]
    while stack:
        for sub in type.__subclasses__(stack.pop()):
            if sub not in seen:
                seen.add(sub)
                stack.append(sub)
                yield sub


def _importing(module) -> bool:
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


# Classes created while their module was being imported, judged once it has been (`settle`):
# until then a class decorator may still change a forward, and a module function may be
# handed to one (transformers' use_kernelized_func checks what it is given).
pending: list[type] = []


def _init_subclass(cls, **kwargs):
    super(torch.nn.Module, cls).__init_subclass__(**kwargs)
    with _lock:
        if not _active:
            return
        module = sys.modules.get(cls.__module__)
        if _importing(module):
            pending.append(cls)
        else:
            _consider_class(cls)
            _consider_module(module)


def settle() -> None:
    """Judge the pending classes whose module has been imported since, and that module's
    functions, then every module imported since for the other targets (a KV cache's class
    is no module: its creation notes nothing). serve()'s overrides and the recorder call it
    on an op while `pending` is not empty: the first op of a model imported under a context
    settles it."""
    with _lock:
        waiting = []
        for cls in pending:
            module = sys.modules.get(cls.__module__)
            if _active and _importing(module):
                waiting.append(cls)
            elif _active:
                _consider_class(cls)
                _consider_module(module)
        if _active and len(waiting) < len(pending):
            _consider_modules()
        pending[:] = waiting


def acquire() -> None:
    """Swap every matching class and function loaded now, and those defined until `release`."""
    global _active, _hook_saved
    with _lock:
        _active += 1
        if _active > 1:
            return
        _hook_saved = torch.nn.Module.__dict__.get("__init_subclass__")
        torch.nn.Module.__init_subclass__ = classmethod(_init_subclass)
        for cls in list(_subclasses(torch.nn.Module)):
            _consider_class(cls)
        _consider_modules()


def release() -> None:
    """The last release gives every swapped class and module its own code back."""
    global _active, _hook_saved
    with _lock:
        _active -= 1
        if _active > 0:
            return
        if _hook_saved is None:
            del torch.nn.Module.__init_subclass__
        else:
            torch.nn.Module.__init_subclass__ = _hook_saved
        _hook_saved = None
        pending.clear()
        hand_off.clear()
        for (_, attr), (owner, original, fused, _, _) in _swapped.items():
            current = owner.cell_contents if attr == "cell_contents" else getattr(owner, "__dict__", {}).get(attr)
            if current is fused:  # unless someone replaced it since
                setattr(owner, attr, original)
        _swapped.clear()
        _originals.clear()


def swapped() -> dict[str, str]:
    """`module.Class.forward` or `module.function` -> the op it now calls, swapped now."""
    with _lock:
        return {where: fusion.op for _, _, _, fusion, where in _swapped.values()}


def stats() -> dict[str, int]:
    """Fusion name -> calls that ran its one op (since the last `reset_stats`)."""
    return {name: n for name, n in sorted(_calls.items()) if n}


def reset_stats() -> None:
    _calls.clear()
