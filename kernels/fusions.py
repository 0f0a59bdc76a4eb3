"""Fusions: model code whose few torch ops are one op the kernel library serves.

transformers' Llama computes an RMS norm in eight launches (a cast, pow, mean, add,
rsqrt, mul, a cast back, mul by the weight); `F.rms_norm` is one, which serve() runs on the
RMS-norm kernel. While a fusion context is active (serve() and the trace recorder enter
one), a module class whose `forward` is, in compiled code, exactly a known pattern gets a
forward that calls the one op instead; leaving restores the original.

The match is on the syntax tree of the forward's source against the pattern's (decorators,
annotations, docstrings and layout aside), and on `torch` meaning torch, so a variant is
never swapped: Gemma's RMS norm scales by (1 + weight) and does not match.
Classes defined while a context is active (a program importing transformers under
`nbx-tune run` or `trace`) are checked as they are created (`nn.Module.__init_subclass__`).
The swapped forward falls back to the original wherever the one op would not give the
pattern's result dtype. `NBX_TUNE_FUSE=0` turns fusions off for serve() and the recorder.
"""

from __future__ import annotations

import ast
import inspect
import os
import textwrap
import threading
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from types import CodeType, FunctionType
from typing import Callable

import torch
import torch.nn.functional as F

ENV_FUSE = "NBX_TUNE_FUSE"


def enabled_by_default() -> bool:
    """Fusions are on unless NBX_TUNE_FUSE is 0, false, no or off."""
    return os.environ.get(ENV_FUSE, "1").strip().lower() not in ("0", "false", "no", "off")


@dataclass(frozen=True)
class Fusion:
    name: str       # how the stats name it
    op: str         # the op the pattern becomes
    source: str     # the pattern: a `forward` as the model library writes it
    make: Callable[[Callable], Callable]  # the original forward -> the fused one

    @cached_property
    def code(self) -> CodeType:
        """The pattern compiled, for a cheap first test of names."""
        namespace: dict = {"torch": torch}
        exec(compile(self.source, f"<nbx_tune fusion {self.name}>", "exec", dont_inherit=True), namespace)
        return namespace["forward"].__code__

    @cached_property
    def shape(self) -> str | None:
        return shape_of(self.source)


_calls: Counter = Counter()  # fusion name -> calls that ran the one op


def _rms_norm(original: Callable) -> Callable:
    def forward(self, hidden_states):
        weight = self.weight
        if hidden_states.dtype != weight.dtype or weight.dim() != 1:
            return original(self, hidden_states)  # the pattern promotes to the weight's dtype
        _calls["rms_norm"] += 1
        return F.rms_norm(hidden_states, weight.shape, weight, self.variance_epsilon)

    return forward


# transformers' LlamaRMSNorm.forward, shared by the models whose norm is "copied from" it
# (Qwen2, Mistral, ...): the norm in float32, cast back, then scaled in the input's dtype.
RMS_NORM = Fusion("rms_norm", "aten.rms_norm", '''
def forward(self, hidden_states):
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return self.weight * hidden_states.to(input_dtype)
''', _rms_norm)

FUSIONS: tuple[Fusion, ...] = (RMS_NORM,)


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


def matches(fn, fusion: Fusion) -> bool:
    """`fn` is the fusion's pattern: the same syntax, `torch` meaning torch. Compiled code
    would be a cheaper test, but the compiler's choices differ between builds of one Python."""
    if not isinstance(fn, FunctionType) or fn.__globals__.get("torch") is not torch:
        return False
    ref = fusion.code
    code = fn.__code__
    if (code.co_names, code.co_varnames, code.co_argcount) != (ref.co_names, ref.co_varnames, ref.co_argcount):
        return False  # cheap first: most forwards differ here
    try:
        source = inspect.getsource(fn)
    except Exception:  # no source to read (OSError, TypeError, a stale line cache): never swapped unseen
        return False
    return shape_of(source) == fusion.shape


_lock = threading.RLock()
_active = 0
_swapped: dict[type, tuple[Callable, Callable, Fusion]] = {}  # class -> (original, fused, fusion)
_hook_saved = None


def _consider(cls: type) -> None:
    fn = cls.__dict__.get("forward")
    if fn is None or cls in _swapped:
        return
    for fusion in FUSIONS:
        if matches(fn, fusion):
            fused = fusion.make(fn)
            fused.__qualname__ = f"{cls.__qualname__}.forward"
            fused.__doc__ = f"{cls.__qualname__}.forward fused into {fusion.op} by nbx-tune."
            fused.__wrapped__ = fn
            setattr(cls, "forward", fused)
            _swapped[cls] = (fn, fused, fusion)
            return


def _subclasses(root: type):
    seen, stack = set(), [root]
    while stack:
        for sub in type.__subclasses__(stack.pop()):
            if sub not in seen:
                seen.add(sub)
                stack.append(sub)
                yield sub


def _init_subclass(cls, **kwargs):
    super(torch.nn.Module, cls).__init_subclass__(**kwargs)
    with _lock:
        if _active:
            _consider(cls)


def acquire() -> None:
    """Swap every matching module class loaded now, and those defined until `release`."""
    global _active, _hook_saved
    with _lock:
        _active += 1
        if _active > 1:
            return
        _hook_saved = torch.nn.Module.__dict__.get("__init_subclass__")
        torch.nn.Module.__init_subclass__ = classmethod(_init_subclass)
        for cls in list(_subclasses(torch.nn.Module)):
            _consider(cls)


def release() -> None:
    """The last release gives every swapped class its own forward back."""
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
        for cls, (original, fused, _) in _swapped.items():
            if cls.__dict__.get("forward") is fused:  # unless someone replaced it since
                setattr(cls, "forward", original)
        _swapped.clear()


def swapped() -> dict[str, str]:
    """`module.Class.forward` -> the op it now calls, for the classes swapped now."""
    with _lock:
        return {f"{cls.__module__}.{cls.__qualname__}.forward": fusion.op
                for cls, (_, _, fusion) in _swapped.items()}


def stats() -> dict[str, int]:
    """Fusion name -> calls that ran its one op (since the last `reset_stats`)."""
    return {name: n for name, n in sorted(_calls.items()) if n}


def reset_stats() -> None:
    _calls.clear()
