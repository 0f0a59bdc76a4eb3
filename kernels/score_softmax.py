"""Eager attention's score chain in one launch (`nbx_tune.score_softmax`): between its two
matmuls transformers' eager attention scales the scores, soft-caps them (Gemma 2:
tanh(w / c) * c), adds the mask, takes the softmax in fp32 and casts back, seven launches
and as many score-sized tensors; here one pass over each row, in fp16, bf16 and fp32.

One program a row of the (B, H, Q, K) scores, the whole row in registers (K up to
MAX_ROW); the mask is read through its strides, broadcast over batch and heads where its
dims are 1. Computed in fp32 from the scores as stored (torch rounds the scaled and capped
scores to their dtype between ops) and rounded once. A fully masked row gives what torch's
softmax gives (the mask is finite: its minimum, not -inf).

Launch key: the row length K on the `row` ladder; whether there is a cap and a mask are
seat flags (they change the code).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from nbx_tune.errors import KernelError
from nbx_tune.kernels.elementwise import _tanh_f32
from nbx_tune.kernels.helpers import FLOATS, torch_dtypes
from nbx_tune.kernels.rows import format_shape, numel
from nbx_tune.kernels.runtime import launch
from nbx_tune.kernels.runtime.certified import config_for
from nbx_tune.kernels.serving import gemma_ops  # noqa: F401  (defines the torch op serve_ops names)
from nbx_tune.kernels.spec import Config, KernelSpec, KeyDim, NotServable, Problem, float_params, seat_flags
from nbx_tune.oracles import score_softmax as oracle

OP = "nbx_tune.score_softmax"
TORCH_DTYPES = torch_dtypes(*FLOATS)
_NAMES = {v: k for k, v in TORCH_DTYPES.items()}
MAX_ROW = 16384  # the longest row held in registers (16 fp32 values a thread at 32 warps)


@triton.jit
def _score_softmax_kernel(s_ptr, m_ptr, y_ptr, H, Q, K, scaling, cap,
                          ss_b, ss_h, ss_q, ss_k, sm_b, sm_h, sm_q, sm_k,
                          HAS_CAP: tl.constexpr, HAS_MASK: tl.constexpr, BLOCK: tl.constexpr):
    """y[r, :] = softmax(softcap(s[r, :] * scaling) + m[r, :]) for row r = (b, h, q) of
    (B, H, Q, K); y contiguous."""
    r = tl.program_id(0).to(tl.int64)
    q = r % Q
    h = (r // Q) % H
    b = r // (Q * H)
    offs = tl.arange(0, BLOCK)
    inside = offs < K
    w = tl.load(s_ptr + b * ss_b + h * ss_h + q * ss_q + offs * ss_k, mask=inside, other=0.0).to(tl.float32)
    w = w * scaling
    if HAS_CAP:
        w = _tanh_f32(w / cap) * cap
    if HAS_MASK:
        w += tl.load(m_ptr + b * sm_b + h * sm_h + q * sm_q + offs * sm_k, mask=inside, other=0.0).to(tl.float32)
    w = tl.where(inside, w, float("-inf"))
    e = tl.exp(w - tl.max(w, axis=0))
    e = tl.where(inside, e, 0.0)
    y = e / tl.sum(e, axis=0)
    tl.store(y_ptr + r * K + offs, y.to(y_ptr.dtype.element_ty), mask=inside)


_score_softmax_kernel = launch.recorded(_score_softmax_kernel)  # its calls are replayed (kernels/runtime/launch.py)


def launch_score_softmax(scores, mask, out, scaling: float, cap: float | None, config) -> None:
    """out = the chain of scores (B, H, Q, K) and mask (broadcast to it, or None); out contiguous."""
    B, H, Q, K = scores.shape
    ms = mask.expand(B, H, Q, K).stride() if mask is not None else (0, 0, 0, 0)
    _score_softmax_kernel[(B * H * Q,)](
        scores, scores if mask is None else mask, out, H, Q, K, float(scaling), 1.0 if cap is None else float(cap),
        *scores.stride(), *ms, HAS_CAP=cap is not None, HAS_MASK=mask is not None,
        BLOCK=triton.next_power_of_2(K), **config.kwargs)


def _c(warps):
    return Config.make(num_warps=warps, num_stages=1)


CONFIGS = (_c(1), _c(2), _c(4), _c(8), _c(16), _c(32))
DEFAULTS = (_c(4), _c(8))


def _flags(cap: bool, mask: bool):
    return seat_flags(cap="yes" if cap else "no", mask="yes" if mask else "no")


class ScoreSoftmaxSpec(KernelSpec):
    name = "score_softmax"
    ops = (OP,)
    key = (KeyDim("K", "row"),)
    dtypes = tuple(TORCH_DTYPES)
    description = "eager attention's scale, soft-cap, mask and fp32 softmax in one launch"

    config_space = CONFIGS
    default_configs = DEFAULTS

    def source_parts(self):
        return (_score_softmax_kernel, launch_score_softmax, _tanh_f32)

    def problem_from_row(self, row):
        if row.op.removesuffix(".default") != OP:
            return NotServable(f"{row.op}: overload not served")
        if len(row.shapes) not in (1, 2):
            return NotServable(f"{OP} takes scores and an optional mask, the row has {len(row.shapes)} tensors")
        dt = row.dtypes[0]
        if dt not in self.dtypes or any(d not in self.dtypes for d in row.dtypes):
            return NotServable(f"dtypes {', '.join(row.dtypes)}: not served")
        got = float_params(row, "scaling", "softcap")
        if isinstance(got, NotServable):
            return got
        scaling, cap = got
        if scaling is None or not math.isfinite(scaling) or (cap is not None and (not math.isfinite(cap) or cap == 0)):
            return NotServable(f"{OP}: scaling {scaling!r}, softcap {cap!r}: finite numbers expected, a non-zero cap")
        shape, mask = tuple(row.shapes[0]), (tuple(row.shapes[1]) if len(row.shapes) == 2 else None)
        why = _unservable(shape, mask)
        if why:
            return NotServable(why)
        extra = (("M", numel(shape) // shape[-1]), ("mask_shape", mask), ("scaling", scaling), ("shape", shape),
                 ("softcap", cap))
        return Problem(self.name, (dt,), _flags(cap is not None, mask is not None), (shape[-1],), extra)

    def resized(self, problem, dims):
        # As many rows of another length: the kernel sees the row length and count only.
        B, H, Q, _ = problem.get("shape")
        mask = problem.get("mask_shape")
        extra = dict(problem.extra, shape=(B, H, Q, dims[0]),
                     mask_shape=None if mask is None else (*tuple(mask)[:3], dims[0]))
        return Problem(problem.kernel, problem.dtypes, problem.flags, (dims[0],), tuple(sorted(extra.items())))

    def input_shapes(self, problem):
        dt, mask = problem.dtypes[0], problem.get("mask_shape")
        out = {"scores": (tuple(problem.get("shape")), dt)}
        if mask is not None:
            out["mask"] = (tuple(mask), dt)
        return out

    def make_inputs(self, problem, rng):
        shape, mask, dt = tuple(problem.get("shape")), problem.get("mask_shape"), problem.dtypes[0]
        out = {"scores": (4.0 * rng.standard_normal(shape), dt)}
        if mask is not None:  # a causal-style mask: about a third masked, never a whole row
            m = rng.random(tuple(mask)) < 0.3
            m[..., 0] = False
            out["mask"] = (m * -30000.0, dt)
        return out

    def oracle(self, problem, inputs):
        shape = tuple(problem.get("shape"))
        mask = problem.get("mask_shape")
        return {"out": oracle.score_softmax(inputs["scores"].reshape(shape), problem.get("scaling"),
                                            problem.get("softcap"),
                                            None if mask is None else inputs["mask"].reshape(tuple(mask)))}

    def output_specs(self, problem):
        return {"out": (tuple(problem.get("shape")), problem.dtypes[0])}

    def serve_ops(self):
        return {OP: score_softmax}

    def launch(self, config, problem, inputs, outputs):
        launch_score_softmax(inputs["scores"], inputs.get("mask"), outputs["out"], problem.get("scaling"),
                             problem.get("softcap"), config)

    def example_rows(self, scale):
        from nbx_tune.kernels.rows import make_row

        def row(dt, s, m, cap):
            shapes = [s] if m is None else [s, m]
            return make_row(OP, [dt] * len(shapes), shapes, {"scaling": "0.0625", "softcap": str(cap)})

        if scale == "small":
            dts, cases = ("float16", "float32"), (((2, 3, 5, 37), (2, 1, 5, 37), 50.0), ((1, 2, 1, 300), None, None),
                                                  ((1, 3, 4, 19), (1, 1, 4, 19), None))
        else:  # Gemma-2-2B's eager attention (8 heads): a decode step at batch 16, a prefill, and an odd one
            dts, cases = tuple(self.dtypes), (((16, 8, 1, 1024), (16, 1, 1, 1024), 50.0),
                                              ((1, 8, 512, 512), (1, 1, 512, 512), 50.0),
                                              ((3, 5, 7, 4097), None, None))
        return [row(dt, s, m, cap) for dt in dts for s, m, cap in cases]


def _unservable(shape, mask) -> str | None:
    """Why (B, H, Q, K) scores with a mask of `mask`'s shape (or None) are not served, or None."""
    if len(shape) != 4:
        return f"scores {format_shape(shape)}: (batch, heads, queries, keys) expected"
    if numel(shape) == 0:
        return "empty scores: nothing to launch"
    if shape[-1] > MAX_ROW:
        return f"rows of {shape[-1]} keys: at most {MAX_ROW} served"
    if mask is not None and (len(mask) != 4 or any(m not in (1, s) for m, s in zip(mask, shape))
                             or tuple(mask[2:]) != tuple(shape[2:])):
        return f"mask {format_shape(mask)}: (batch or 1, heads or 1, queries, keys) of scores {format_shape(shape)} expected"
    return None


SPEC = ScoreSoftmaxSpec()
SPECS = (SPEC,)


# ----------------------------------------------------------------------------- public op

REMEMBERED = launch.REMEMBERED


def score_softmax(scores: torch.Tensor, scaling: float, softcap: float | None = None,
                  mask: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(softcap(scores * scaling) + mask, fp32) in scores' dtype: scores (B, H, Q, K) of
    fp16, bf16 or fp32, mask broadcast over batch and heads or None."""
    try:  # the direct launch (kernels/runtime/launch.py)
        key = (SPEC, scaling, softcap, *launch.tensor_key(scores),
               *(launch.tensor_key(mask) if mask is not None else (None,)))
    except AttributeError:
        raise KernelError("score_softmax: scores and mask must be tensors") from None
    hit = REMEMBERED.get(key)
    if hit is not None:
        return hit(scores, mask)
    return launch.remember(key, (scores, mask), _score_softmax_call, scores, scaling, softcap, mask)


def _score_softmax_call(scores, scaling, softcap, mask) -> torch.Tensor:
    dt = _NAMES.get(scores.dtype)
    if dt is None or (mask is not None and mask.dtype not in _NAMES):
        raise KernelError(f"score_softmax: dtypes {scores.dtype}, {None if mask is None else mask.dtype}: "
                          "float16, bfloat16 or float32 expected")
    why = _unservable(tuple(scores.shape), None if mask is None else tuple(mask.shape))
    if why:
        raise KernelError(f"score_softmax: {why}")
    if mask is not None and mask.device != scores.device:
        raise KernelError(f"score_softmax: scores on {scores.device}, mask on {mask.device}")
    scaling, cap = float(scaling), None if softcap is None else float(softcap)
    if not math.isfinite(scaling) or (cap is not None and (not math.isfinite(cap) or cap == 0)):
        raise KernelError(f"score_softmax: scaling {scaling!r}, softcap {cap!r}: finite numbers expected, a non-zero cap")
    out = launch.empty(scores.shape, scores.dtype, scores.device)
    K = scores.shape[-1]
    config = config_for(SPEC, (dt,), _flags(cap is not None, mask is not None), (K,))
    launch_score_softmax(scores, mask, out, scaling, cap, config)
    return out
