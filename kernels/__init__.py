"""The kernel library: Triton kernels with their specs, and the launch-time read of
certified configs. Never imports the tuner or the CLI.

    from nbx_tune.kernels import mm
    c = mm(a, b)          # the certified config of (a, b)'s seat, else the default

Public ops are resolved lazily so that `import nbx_tune.kernels` stays cheap. On a machine
with no GPU the first op looked up switches to Triton's CPU interpreter (and logs it).
"""

import logging
import sys
import types

_OPS = {
    "mm": "nbx_tune.kernels.matmul",
    "addmm": "nbx_tune.kernels.matmul",
    "bmm": "nbx_tune.kernels.matmul",
    "baddbmm": "nbx_tune.kernels.matmul",
    "scaled_dot_product_attention": "nbx_tune.kernels.attention",
    "masked_attention": "nbx_tune.kernels.masked_attention",
    "conv2d": "nbx_tune.kernels.conv",
    "conv1d": "nbx_tune.kernels.conv",
    "softmax": "nbx_tune.kernels.softmax",
    "log_softmax": "nbx_tune.kernels.softmax",
    "layer_norm": "nbx_tune.kernels.norms",
    "rms_norm": "nbx_tune.kernels.norms",
    "group_norm": "nbx_tune.kernels.norms",
    "relu": "nbx_tune.kernels.elementwise",
    "gelu": "nbx_tune.kernels.elementwise",
    "silu": "nbx_tune.kernels.elementwise",
    "sigmoid": "nbx_tune.kernels.elementwise",
    "tanh": "nbx_tune.kernels.elementwise",
    "exp": "nbx_tune.kernels.elementwise",
    "log": "nbx_tune.kernels.elementwise",
    "neg": "nbx_tune.kernels.elementwise",
    "rsqrt": "nbx_tune.kernels.elementwise",
    "sqrt": "nbx_tune.kernels.elementwise",
    "sin": "nbx_tune.kernels.elementwise",
    "cos": "nbx_tune.kernels.elementwise",
    "pow": "nbx_tune.kernels.elementwise",
    "add": "nbx_tune.kernels.elementwise",
    "sub": "nbx_tune.kernels.elementwise",
    "rsub": "nbx_tune.kernels.elementwise",
    "mul": "nbx_tune.kernels.elementwise",
    "div": "nbx_tune.kernels.elementwise",
    "maximum": "nbx_tune.kernels.elementwise",
    "minimum": "nbx_tune.kernels.elementwise",
    "sum": "nbx_tune.kernels.reduce",
    "mean": "nbx_tune.kernels.reduce",
    "amax": "nbx_tune.kernels.reduce",
    "amin": "nbx_tune.kernels.reduce",
    "all": "nbx_tune.kernels.all_any",
    "any": "nbx_tune.kernels.all_any",
    "_to_copy": "nbx_tune.kernels.copy",
    "clone": "nbx_tune.kernels.copy",
    "copy_": "nbx_tune.kernels.copy",
    "cat": "nbx_tune.kernels.copy",
    "embedding": "nbx_tune.kernels.embed",
    "arange": "nbx_tune.kernels.fill",
    "full": "nbx_tune.kernels.fill",
    "zeros": "nbx_tune.kernels.fill",
    "ones": "nbx_tune.kernels.fill",
    "fill_": "nbx_tune.kernels.fill",
    "zero_": "nbx_tune.kernels.fill",
    "batch_norm": "nbx_tune.kernels.batchnorm",
    "_native_batch_norm_legit_no_training": "nbx_tune.kernels.batchnorm",
    "max_pool2d_with_indices": "nbx_tune.kernels.pool",
    "rotary": "nbx_tune.kernels.rope",
    "rotary_qk": "nbx_tune.kernels.rope",
    "rope_cos_sin": "nbx_tune.kernels.rope",
    "silu_mul": "nbx_tune.kernels.swiglu",
    "add_rms_norm": "nbx_tune.kernels.residual_norm",
    "add_layer_norm": "nbx_tune.kernels.residual_norm",
    "cat_kv": "nbx_tune.kernels.kv_cache",
    "gelu_mul": "nbx_tune.kernels.gelu_mul",
    "softcap": "nbx_tune.kernels.softcap",
    "score_softmax": "nbx_tune.kernels.score_softmax",
    "offset_rms_norm": "nbx_tune.kernels.offset_rms_norm",
    "topk": "nbx_tune.kernels.topk",
    "sort": "nbx_tune.kernels.topk",
    "index": "nbx_tune.kernels.index",
    "index_nd": "nbx_tune.kernels.index_nd",
    "index_put_": "nbx_tune.kernels.index",
    "index_put": "nbx_tune.kernels.index",
    "gather": "nbx_tune.kernels.index",
    "cumsum": "nbx_tune.kernels.scan",
    "histc": "nbx_tune.kernels.histc",
    "floor_divide": "nbx_tune.kernels.floor_divide",
    "stack": "nbx_tune.kernels.stack",
    "moe_experts": "nbx_tune.kernels.moe",
    "gt": "nbx_tune.kernels.compare",
    "ge": "nbx_tune.kernels.compare",
    "lt": "nbx_tune.kernels.compare",
    "le": "nbx_tune.kernels.compare",
    "eq": "nbx_tune.kernels.compare",
    "ne": "nbx_tune.kernels.compare",
    "bitwise_and": "nbx_tune.kernels.compare",
    "bitwise_or": "nbx_tune.kernels.compare",
    "bitwise_xor": "nbx_tune.kernels.compare",
    "bitwise_not": "nbx_tune.kernels.compare",
    "logical_and": "nbx_tune.kernels.compare",
    "logical_or": "nbx_tune.kernels.compare",
    "logical_xor": "nbx_tune.kernels.compare",
    "logical_not": "nbx_tune.kernels.compare",
    "where": "nbx_tune.kernels.select",
}


class _Package(types.ModuleType):
    """`softmax` names both a public op and the module that holds it; importing the module
    would set the package's attribute to the module, and `from nbx_tune.kernels import
    softmax` would then give the module. A submodule never shadows a public op here."""

    def __setattr__(self, name, value):
        if name in _OPS and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def _find_device() -> None:
    """With no GPU and no TRITON_INTERPRET, use Triton's CPU interpreter, as every entry
    point does (profiles/detect.use_interpreter_without_gpu), and say so once."""
    from nbx_tune.profiles import use_interpreter_without_gpu

    use_interpreter_without_gpu(logging.getLogger("nbx_tune").warning)


def __getattr__(name):
    if name in _OPS:
        import importlib

        _find_device()
        op = getattr(importlib.import_module(_OPS[name]), name)
        globals()[name] = op  # resolved once: `kernels.mm(...)` in a loop pays no import lookup
        return op
    if name in ("launch_stats", "reload_certified"):
        from nbx_tune.kernels.runtime import certified

        return certified.launch_stats if name == "launch_stats" else certified.reload
    raise AttributeError(f"module 'nbx_tune.kernels' has no attribute {name!r}")


__all__ = sorted(_OPS) + ["launch_stats", "reload_certified"]
