"""The kernel library: Triton kernels with their specs, and the launch-time read of
certified configs. Never imports the tuner or the CLI.

    from nbx_tune.kernels import mm
    c = mm(a, b)          # the certified config of (a, b)'s seat, else the default

Public ops are resolved lazily so that `import nbx_tune.kernels` stays cheap.
"""

_OPS = {
    "mm": "nbx_tune.kernels.matmul",
    "addmm": "nbx_tune.kernels.matmul",
    "bmm": "nbx_tune.kernels.matmul",
    "baddbmm": "nbx_tune.kernels.matmul",
    "scaled_dot_product_attention": "nbx_tune.kernels.attention",
}


def __getattr__(name):
    if name in _OPS:
        import importlib

        return getattr(importlib.import_module(_OPS[name]), name)
    if name in ("launch_stats", "reload_certified"):
        from nbx_tune.kernels import certified

        return certified.launch_stats if name == "launch_stats" else certified.reload
    raise AttributeError(f"module 'nbx_tune.kernels' has no attribute {name!r}")


__all__ = sorted(_OPS) + ["launch_stats", "reload_certified"]
