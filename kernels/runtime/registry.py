"""Which kernel serves which trace op: the built-in families plus users' plugins.

A plugin is any importable module or object that provides `KernelSpec` instances: named
on the CLI (`--plugin my_pkg.my_kernels`) or declared by an installed package under the
entry-point group `nbx_tune.kernels`. A module provides its specs as `SPECS` (a sequence)
or `SPEC` (one); an entry point may also name a spec object directly.
"""

from __future__ import annotations

import importlib
import threading
from importlib.metadata import entry_points

from nbx_tune.errors import KernelError
from nbx_tune.kernels import _OPS
from nbx_tune.kernels.spec import KernelSpec

# The built-in families: the modules that hold the public ops (kernels/__init__.py), in
# that order; one list, so a new family is registered by adding its ops there.
BUILTIN_MODULES = tuple(dict.fromkeys(_OPS.values()))
ENTRY_POINT_GROUP = "nbx_tune.kernels"


def _builtin(module: str) -> bool:
    """A family's module, or a module of a family's package (`kernels/matmul/spec.py`)."""
    return module in BUILTIN_MODULES or module.rpartition(".")[0] in BUILTIN_MODULES


_specs: dict[str, KernelSpec] = {}
_by_op: dict[str, KernelSpec] = {}
_loaded = False
_loading = False
_LOAD_LOCK = threading.RLock()
_plugin_paths: set[str] = set()


def _specs_of(obj, origin: str) -> list[KernelSpec]:
    if isinstance(obj, KernelSpec):
        return [obj]
    if isinstance(obj, type) and issubclass(obj, KernelSpec):
        return [obj()]
    found = getattr(obj, "SPECS", None)
    if found is None and getattr(obj, "SPEC", None) is not None:
        found = [obj.SPEC]
    if not found:
        raise KernelError(f"plugin {origin}: provides no kernel (expected SPECS, SPEC or a KernelSpec)")
    out = []
    for s in found:
        if not isinstance(s, KernelSpec):
            raise KernelError(f"plugin {origin}: {s!r} is not a KernelSpec")
        out.append(s)
    return out


def register(spec: KernelSpec, origin: str = "") -> None:
    if not spec.name or not spec.ops or not spec.key:
        raise KernelError(f"kernel {spec.name or spec!r} ({origin}): needs a name, trace ops and a launch key")
    old = _specs.get(spec.name)
    if old is not None and old is not spec:
        raise KernelError(f"kernel name {spec.name!r} ({origin}) is already registered")
    for op in spec.ops:
        other = _by_op.get(op)
        if other is not None and other is not spec:
            builtin = [k for k in (other, spec) if _builtin(type(k).__module__)]
            if len(builtin) == 1:  # whichever came first, the plugin is the one to blame
                plugin = spec if builtin[0] is other else other
                raise KernelError(f"plugin kernel {plugin.name!r} ({type(plugin).__module__}) claims op {op}, "
                                  f"which the built-in kernel {builtin[0].name!r} serves; a plugin serves "
                                  "ops no built-in kernel does")
            raise KernelError(f"op {op} of kernel {spec.name!r} ({origin}) is already served by {other.name!r}")
    _specs[spec.name] = spec
    for op in spec.ops:
        _by_op[op] = spec


def plugin_modules(load: bool = True) -> list[str]:
    """Modules providing the registered kernels that are not built in: what a worker
    process imports to see the same kernels as its parent. load=False: only those
    registered so far, importing nothing (a worker loads the built-in kernels and the
    entry points itself)."""
    if load:
        _ensure_loaded()
    mods = {type(s).__module__ for s in _specs.values()} | set(_plugin_paths)
    return sorted(m for m in mods if not _builtin(m) and m != "__main__")


def load_plugin(path: str) -> list[KernelSpec]:
    """Import `module` or `module:attr` and register the kernels it provides."""
    _ensure_loaded()  # the built-ins first, so that a clash names the plugin
    module_name, _, attr = path.partition(":")
    try:
        obj = importlib.import_module(module_name)
        if attr:
            obj = getattr(obj, attr)
    except Exception as e:  # the user's module: any failure is theirs to see, on one line
        raise KernelError(f"plugin {path}: cannot import: {type(e).__name__}: {e}") from None
    specs = _specs_of(obj, path)
    for s in specs:
        register(s, path)
    _plugin_paths.add(path)
    return specs


def _ensure_loaded() -> None:
    # Under a lock, and marked loaded only when done: a second thread asking meanwhile (a
    # process of many workers) waits for the whole registry instead of reading it half
    # filled. The loading thread itself may ask again while importing (re-entrant).
    global _loaded, _loading
    if _loaded:
        return
    with _LOAD_LOCK:
        if _loaded or _loading:
            return
        _loading = True
        try:
            for m in BUILTIN_MODULES:
                for s in _specs_of(importlib.import_module(m), m):
                    register(s, m)
            for ep in entry_points(group=ENTRY_POINT_GROUP):
                try:
                    obj = ep.load()
                except Exception as e:
                    raise KernelError(f"plugin entry point {ep.name} ({ep.value}): cannot load: "
                                      f"{type(e).__name__}: {e}") from None
                for s in _specs_of(obj, f"entry point {ep.name}"):
                    register(s, ep.value)
        finally:
            _loaded, _loading = True, False


def all_specs() -> dict[str, KernelSpec]:
    _ensure_loaded()
    return dict(_specs)


def get_spec(name: str) -> KernelSpec:
    _ensure_loaded()
    try:
        return _specs[name]
    except KeyError:
        raise KernelError(f"unknown kernel {name!r}; known: {', '.join(sorted(_specs))}") from None


def spec_for_op(op: str) -> KernelSpec | None:
    """The kernel serving a trace op: the exact overload first (`aten.add.Tensor`), then
    the op's base name (`aten.mm` serves `aten.mm.default`)."""
    _ensure_loaded()
    spec = _by_op.get(op)
    if spec is None:
        base = ".".join(op.split(".")[:2])
        spec = _by_op.get(base)
    return spec
