"""Batch normalization in inference: `aten.batch_norm` with training=False and
`aten._native_batch_norm_legit_no_training`, with the running statistics.

y = (x - mean[c]) * rsqrt(var[c] + eps) * weight[c] + bias[c] over a contiguous (N, C, *)
input. One stream over the elements (memory-bound, as an element-wise op): element i's
channel is (i // S) % C for S the spatial size, and the four per-channel values are
gathered (they stay in cache: C values each). Computed in fp32, stored in x's dtype.

Launch key: the element count on the `elements` ladder; whether weight and bias are given
is a flag (`affine`). The dtype signature is (x, statistics): an fp16/bf16 input may carry
fp32 statistics, as cuDNN allows.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from nbx_tune.errors import KernelError
from nbx_tune.kernels.runtime import launch
from nbx_tune.kernels.runtime.certified import config_for
from nbx_tune.kernels.copy import block_start, dense
from nbx_tune.kernels.helpers import FLOATS, torch_dtypes
from nbx_tune.kernels.rows import format_shape, numel
from nbx_tune.kernels.spec import Config, KernelSpec, KeyDim, NotServable, Problem, seat_flags
from nbx_tune.oracles import batch_norm as oracle

TORCH_DTYPES = torch_dtypes(*FLOATS)
_NAMES = {v: k for k, v in TORCH_DTYPES.items()}
INDEX_LIMIT = 2**31 - 2**17


@triton.jit
def _batch_norm_kernel(x_ptr, y_ptr, mean_ptr, var_ptr, w_ptr, b_ptr, n, C, S, eps,
                       AFFINE: tl.constexpr, INT64: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    offs = block_start(tl.program_id(0), BLOCK_SIZE, INT64) + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    c = (offs // S) % C
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    mean = tl.load(mean_ptr + c, mask=mask, other=0.0).to(tl.float32)
    var = tl.load(var_ptr + c, mask=mask, other=1.0).to(tl.float32)
    y = (x - mean) * tl.rsqrt(var + eps)
    if AFFINE:
        w = tl.load(w_ptr + c, mask=mask, other=1.0).to(tl.float32)
        b = tl.load(b_ptr + c, mask=mask, other=0.0).to(tl.float32)
        y = y * w + b
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


_batch_norm_kernel = launch.recorded(_batch_norm_kernel)  # its calls are replayed (kernels/runtime/launch.py)


def launch_batch_norm(x, y, mean, var, weight, bias, eps: float, config: Config) -> None:
    """y = batch_norm(x) for contiguous x and y of shape (N, C, *); weight and bias both
    tensors or both None."""
    n, C = x.numel(), x.shape[1]
    S = n // (x.shape[0] * C)
    grid = (triton.cdiv(n, config["BLOCK_SIZE"]),)
    affine = weight is not None
    _batch_norm_kernel[grid](x, y, mean, var, weight if affine else mean, bias if affine else mean,
                             n, C, S, float(eps), AFFINE=affine, INT64=n > INDEX_LIMIT, **config.kwargs)


def _c(block, warps):
    return Config.make(BLOCK_SIZE=block, num_warps=warps, num_stages=1)


CONFIGS = (_c(512, 4), _c(1024, 4), _c(2048, 8), _c(4096, 8), _c(8192, 16))
DEFAULTS = (_c(1024, 4),)

_OPS = ("aten.batch_norm", "aten._native_batch_norm_legit_no_training")


class BatchNormSpec(KernelSpec):
    name = "batch_norm"
    ops = _OPS
    key = (KeyDim("N", "elements"),)
    dtypes = tuple(TORCH_DTYPES)
    description = "batch normalization in inference, with the running statistics"

    config_space = CONFIGS
    default_configs = DEFAULTS

    def source_parts(self):
        return (_batch_norm_kernel, block_start, launch_batch_norm)

    def problem_from_row(self, row):
        op = row.op.removesuffix(".default")
        if op not in _OPS:
            return NotServable(f"{op}: overload not served")
        known = {"momentum", "eps", "weight", "bias", "running_mean", "running_var"}
        if op == "aten.batch_norm":
            known |= {"training"}
            try:
                training = row.params.bool("training", False)
            except ValueError as e:
                return NotServable(str(e))
            if training:
                return NotServable("batch_norm with training=True (batch statistics) is not served")
        unknown = set(row.params) - known
        if unknown:
            return NotServable(f"{op}: unsupported params {', '.join(sorted(unknown))}")
        # Tensors in schema order: input, weight?, bias?, running_mean?, running_var?.
        # The recorder writes an absent Optional tensor as `name=None`.
        names = [n for n in ("weight", "bias", "running_mean", "running_var") if row.params.get(n) != "None"]
        if len(row.shapes) != 1 + len(names):
            return NotServable(f"{op}: {len(row.shapes)} tensors do not match the params")
        if "running_mean" not in names or "running_var" not in names:
            return NotServable("batch_norm without running statistics is not served")
        affine = "weight" in names
        if affine != ("bias" in names):
            return NotServable("batch_norm with only one of weight and bias is not served")
        x_shape, x_dt = row.shapes[0], row.dtypes[0]
        p_dts = set(row.dtypes[1:])
        if x_dt not in TORCH_DTYPES or len(p_dts) != 1 or next(iter(p_dts)) not in TORCH_DTYPES:
            return NotServable(f"dtypes {', '.join(row.dtypes)}: one float input dtype and one "
                               "statistics dtype are served")
        if len(x_shape) < 2:
            return NotServable(f"an input of rank {len(x_shape)} (2 or more expected)")
        C = x_shape[1]
        if any(tuple(s) != (C,) for s in row.shapes[1:]):
            return NotServable(f"statistics of shapes {', '.join(format_shape(s) for s in row.shapes[1:])} "
                               f"for {C} channels")
        try:
            eps = row.params.float("eps", 1e-5)
        except ValueError as e:
            return NotServable(f"bad eps: {e}")
        if not (math.isfinite(eps) and eps >= 0):
            return NotServable(f"eps={eps}")
        n = numel(x_shape)
        if n == 0:
            return NotServable("an empty input: nothing to launch")
        return Problem(self.name, (x_dt, next(iter(p_dts))), seat_flags(affine=int(affine)), (n,),
                       (("eps", eps), ("shape", tuple(x_shape))))

    def _affine(self, problem) -> bool:
        return dict(problem.flags)["affine"] == "1"

    def input_shapes(self, problem):
        C = problem.get("shape")[1]
        p = (C,), problem.dtypes[1]
        out = {"x": (tuple(problem.get("shape")), problem.dtypes[0]), "mean": p, "var": p}
        if self._affine(problem):
            out.update(weight=p, bias=p)
        return out

    def make_inputs(self, problem, rng):
        C = problem.get("shape")[1]
        pdt = problem.dtypes[1]
        out = {"x": (rng.standard_normal(tuple(problem.get("shape"))) * 2.0 + 0.5, problem.dtypes[0]),
               "mean": (rng.standard_normal(C) * 0.5, pdt), "var": (rng.uniform(0.25, 4.0, C), pdt)}
        if self._affine(problem):
            out.update(weight=(rng.uniform(0.5, 1.5, C) * rng.choice([-1.0, 1.0], C), pdt),
                       bias=(rng.standard_normal(C), pdt))
        return out

    def oracle(self, problem, inputs):
        shape = tuple(problem.get("shape"))
        return {"y": oracle.batch_norm_inference(inputs["x"].reshape(shape), inputs["mean"], inputs["var"],
                                                 inputs.get("weight"), inputs.get("bias"), problem.get("eps"))}

    def output_specs(self, problem):
        return {"y": (tuple(problem.get("shape")), problem.dtypes[0])}

    def serve_ops(self):
        return {"aten.batch_norm": batch_norm,
                "aten._native_batch_norm_legit_no_training": _native_batch_norm_legit_no_training}

    def launch(self, config, problem, inputs, outputs):
        x = inputs["x"].reshape(tuple(problem.get("shape")))
        launch_batch_norm(x, outputs["y"], inputs["mean"], inputs["var"], inputs.get("weight"),
                          inputs.get("bias"), problem.get("eps"), config)

    def example_rows(self, scale):
        from nbx_tune.kernels.rows import make_row

        if scale == "small":
            dts = ("float16", "float32")
            shapes = ((3, 7, 5, 9), (2, 13), (1, 24, 2, 2))
        else:
            dts = tuple(TORCH_DTYPES)
            shapes = ((8, 64, 112, 112), (8, 2048, 7, 7), (31, 1000))
        inference = {"training": "False", "momentum": "0.1", "eps": "1e-05"}
        rows = []
        for dt in dts:
            for i, s in enumerate(shapes):
                C = s[1]
                rows.append(make_row("aten.batch_norm", [dt] * 5, [s, (C,), (C,), (C,), (C,)], inference))
            s = shapes[0]
            C = s[1]
            rows += [make_row("aten.batch_norm", [dt, "float32", "float32", "float32", "float32"],
                              [s] + [(C,)] * 4, {**inference, "eps": "0.001"}),
                     make_row("aten.batch_norm", [dt, dt, dt], [shapes[1], (shapes[1][1],), (shapes[1][1],)],
                              {"weight": "None", "bias": "None", **inference}),
                     make_row("aten._native_batch_norm_legit_no_training", [dt] * 5,
                              [shapes[2]] + [(shapes[2][1],)] * 4, {"momentum": "0.1", "eps": "1e-05"})]
        return rows


SPEC = BatchNormSpec()
SPECS = (SPEC,)


# ----------------------------------------------------------------------------- public ops

REMEMBERED = launch.REMEMBERED


def _run(x, weight, bias, running_mean, running_var, eps, what, saved=False):
    """The direct launch (kernels/runtime/launch.py) of `_call`; saved: return the empty saved
    statistics too."""
    tensors = (x, weight, bias, running_mean, running_var)
    try:
        key = (SPEC, eps, saved, *(None if t is None else launch.tensor_key(t) for t in tensors))
    except AttributeError:
        raise KernelError(f"{what}: the operands must be tensors or None") from None
    hit = REMEMBERED.get(key)
    if hit is not None:
        return hit(*tensors)
    return launch.remember(key, tensors, _call, *tensors, eps, what, saved)


def _call(x, weight, bias, running_mean, running_var, eps, what, saved):
    if running_mean is None or running_var is None:
        raise KernelError(f"{what}: batch statistics (no running_mean/running_var) are not served")
    if (weight is None) != (bias is None):
        raise KernelError(f"{what}: only one of weight and bias given is not served")
    x_dt = _NAMES.get(x.dtype)
    p_dt = {_NAMES.get(t.dtype) for t in (weight, bias, running_mean, running_var) if t is not None}
    if x_dt is None or len(p_dt) != 1 or None in p_dt:
        raise KernelError(f"{what}: dtypes not served (one of {', '.join(TORCH_DTYPES)} for the input, "
                          "one for the statistics)")
    if x.dim() < 2:
        raise KernelError(f"{what}: an input of rank {x.dim()} (2 or more expected)")
    x = dense(x)
    y = launch.empty(x.shape, x.dtype, x.device)
    empty = (launch.empty((0,), running_mean.dtype, x.device), launch.empty((0,), running_mean.dtype, x.device))
    if x.numel() == 0:
        return (y, *empty) if saved else y
    stats = [dense(t) if t is not None else None for t in (running_mean, running_var, weight, bias)]
    config = config_for(SPEC, (x_dt, p_dt.pop()), seat_flags(affine=int(weight is not None)), (x.numel(),))
    launch_batch_norm(x, y, *stats, eps, config)
    return (y, *empty) if saved else y


def batch_norm(input: torch.Tensor, weight, bias, running_mean, running_var, training: bool,
               momentum: float, eps: float, cudnn_enabled: bool = True) -> torch.Tensor:
    """aten.batch_norm in inference (training=False) with running statistics."""
    if training:
        raise KernelError("batch_norm: training=True (batch statistics) is not served")
    return _run(input, weight, bias, running_mean, running_var, eps, "batch_norm")


def _native_batch_norm_legit_no_training(input: torch.Tensor, weight, bias, running_mean, running_var,
                                         momentum: float, eps: float):
    """(output, save_mean, save_invstd) as on CUDA in inference: the saved statistics empty."""
    return _run(input, weight, bias, running_mean, running_var, eps, "_native_batch_norm_legit_no_training",
                saved=True)
