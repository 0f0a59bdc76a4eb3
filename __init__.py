"""nbx-tune: autotuning and certification of Triton kernels.

The package root stays light: importing `nbx_tune` loads neither torch nor triton. The
public names below are resolved on first use.
"""

__version__ = "0.1.0"

_LAZY = {
    "record": ("nbx_tune.tuner.trace.recorder", "record"),
    "serve": ("nbx_tune.kernels.serving.serve", "serve"),
    "serve_stats": ("nbx_tune.kernels.serving.serve", "stats"),
    "NbxError": ("nbx_tune.errors", "NbxError"),
    "compiled": ("nbx_tune.kernels.serving.compiled_ops", "compiled"),
    "compile_backend": ("nbx_tune.kernels.serving.compiled_ops", "compile_backend"),
    "compiled_stats": ("nbx_tune.kernels.serving.compiled_ops", "stats"),
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'nbx_tune' has no attribute {name!r}")
