"""The hand-off between decoder layers: a layer's last residual add, fused with the norm the
next layer (or the model, after its last layer) starts with.

A decoder layer ends with `residual + mlp_out` and the next one begins by normalizing that
sum: two launches, where one op (`add_rms_norm`, `add_layer_norm`) gives both the sum and its
norm. A layer cannot see its successor, so its fused forward asks `successor(layer)` for the
norm that reads its output next. The answer comes from the model's own loop, read once a
model: the frames above the layer's first call hold the module whose forward runs it, and
its forward must be, in its syntax tree, exactly

    for layer in self.<list>[...]:          # or `for i, layer in enumerate(self.<list>...)`
        h = layer(h, <arguments without h>)
    h = self.<norm>(h)                      # optional: the model's final norm

so nothing of the model's runs between one layer's return and the next one's first norm.
The layer hands the norm it computed to that norm (`hand`); the next layer (or the final
norm's fused forward) takes it (`take`) only if it is given the very tensor the sum was
returned as, unchanged since (its version, outside inference mode), and no hook runs
between (checked at the hand-off). Anything else and it normalizes as usual: a wrong link
costs one output written for nothing, never a wrong value. The link is made before the
first layer's first add, so every call of a model takes the same path.
"""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
import weakref

import torch

# id(layer) -> weak references to (it, the next layer or None, the norm that reads its output
# next or None)
_links: dict[int, tuple] = {}
# code of a model's forward -> [(attribute of the layer list, attribute of the final norm or None)]
_loops: dict = {}
# id(norm) -> (a weak reference to the norm, the sum handed, its version or None, the norm of the sum)
_handed: dict[int, tuple] = {}
FRAMES = 16  # how far up a layer's first call looks for the loop that runs it


def _name(node, name: str | None = None) -> bool:
    return isinstance(node, ast.Name) and (name is None or node.id == name)


def _self_attr(node) -> str | None:
    """`self.x` -> "x"."""
    return node.attr if isinstance(node, ast.Attribute) and _name(node.value, "self") else None


def _layer_list(iterable, target) -> tuple[str, str] | None:
    """(the list's attribute, the loop variable) of `for layer in self.x[...]` or
    `for i, layer in enumerate(self.x[...])`, else None."""
    if isinstance(iterable, ast.Call) and _name(iterable.func, "enumerate") and len(iterable.args) == 1 \
            and not iterable.keywords and isinstance(target, ast.Tuple) and len(target.elts) == 2:
        iterable, target = iterable.args[0], target.elts[1]
    if isinstance(iterable, ast.Subscript):
        iterable = iterable.value
    attr = _self_attr(iterable)
    return (attr, target.id) if attr is not None and _name(target) else None


def _mentions(node, name: str) -> bool:
    return any(_name(n, name) for n in ast.walk(node))


def loops_of(code) -> list[tuple[str, str | None]]:
    """The layer loops of a forward (see the module's docstring), read from its source."""
    if code not in _loops:
        found = []
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(code)))
        except Exception:  # no source to read: no loop is known
            tree = None
        for block in (ast.walk(tree) if tree is not None else ()):
            body = getattr(block, "body", None)
            if not isinstance(body, list):
                continue
            for i, stmt in enumerate(body):
                if not isinstance(stmt, ast.For) or stmt.orelse or len(stmt.body) != 1:
                    continue
                names, call = _layer_list(stmt.iter, stmt.target), stmt.body[0]
                if names is None or not isinstance(call, ast.Assign) or len(call.targets) != 1 \
                        or not _name(call.targets[0]) or not isinstance(call.value, ast.Call):
                    continue
                h, c = call.targets[0].id, call.value
                if not (_name(c.func, names[1]) and c.args and _name(c.args[0], h)) \
                        or any(_mentions(a, h) for a in c.args[1:]) or any(_mentions(k, h) for k in c.keywords):
                    continue
                final = None
                nxt = body[i + 1] if i + 1 < len(body) else None
                if isinstance(nxt, ast.Assign) and len(nxt.targets) == 1 and _name(nxt.targets[0], h) \
                        and isinstance(nxt.value, ast.Call) and not nxt.value.keywords \
                        and len(nxt.value.args) == 1 and _name(nxt.value.args[0], h):
                    final = _self_attr(nxt.value.func)
                found.append((names[0], final))
        _loops[code] = found
    return _loops[code]


def _ref(module):
    """A weak reference (a link must not keep a deleted model alive), or None."""
    return None if module is None else weakref.ref(module)


def _module(owner, attr: str | None):
    found = getattr(owner, attr, None) if attr is not None else None
    return found if isinstance(found, torch.nn.Module) else None


def _link(layer, norm_attr: str) -> None:
    """Link every layer of the list whose loop runs `layer` to the norm that reads its output
    next: the next layer's `norm_attr` where it is of the same class, the final norm after
    the last. Found in the frames above this call; none found: `layer` has no successor."""
    _links[id(layer)] = (weakref.ref(layer), None, None)
    frame = sys._getframe(1)
    for _ in range(FRAMES):
        if frame is None:
            return
        owner = frame.f_locals.get("self")
        if isinstance(owner, torch.nn.Module) and owner is not layer:
            for list_attr, final in loops_of(frame.f_code):
                layers = getattr(owner, list_attr, None)
                if isinstance(layers, torch.nn.ModuleList) and any(m is layer for m in layers):
                    chain = list(layers)
                    for a, b in zip(chain, chain[1:]):
                        norm = _module(b, norm_attr) if type(b) is type(a) else None
                        _links[id(a)] = (weakref.ref(a), _ref(b if norm is not None else None), _ref(norm))
                    _links[id(chain[-1])] = (weakref.ref(chain[-1]), None, _ref(_module(owner, final)))
                    return
        frame = frame.f_back


def successor(layer, norm_attr: str):
    """(the next layer, or None for the model's final norm; the norm that reads `layer`'s
    output next, or None where none is known). `norm_attr`: that norm's attribute on a
    layer of `layer`'s class."""
    link = _links.get(id(layer))
    if link is None or link[0]() is not layer:
        _link(layer, norm_attr)
        link = _links[id(layer)]
    return (link[1] and link[1]()), (link[2] and link[2]())


def hand(norm, total: torch.Tensor, normed: torch.Tensor) -> None:
    """`normed` is `norm(total)`, for the next call of `norm` on `total` to take."""
    version = None if total.is_inference() else total._version
    _handed[id(norm)] = (weakref.ref(norm), total, version, normed)


def take(norm, x: torch.Tensor):
    """`norm(x)`, if it was handed with x unchanged since; else None."""
    got = _handed.pop(id(norm), None)
    if got is None or got[0]() is not norm or got[1] is not x:
        return None
    if got[2] is not None and x._version != got[2]:  # x is the sum handed: its kind is known
        return None
    return got[3]


def clear() -> None:
    """Forget every link and hand-off (the last fusion context left)."""
    _links.clear()
    _handed.clear()
