"""Rotary position embedding in one launch (`nbx_tune.rotary`): out = x * cos + rotate_half(x)
* sin, transformers' apply_rotary_pos_emb for one tensor (unsqueeze_dim=1), in fp16, bf16
and fp32. torch runs it as 5 launches (neg and cat for rotate_half, two products, a sum).

x is (B, H, S, D) with any strides over B, H and S (the model's q and k are a transposed
view of the projection's output: read in place), the last dim contiguous; cos and sin are
(B, S, D) or (1, S, D), broadcast over the heads (and the batch). A program takes ROWS rows
of D elements and each row as its two halves: out1 = x1 c1 - x2 s1, out2 = x2 c2 + x1 s2,
computed in fp32 and rounded once (torch rounds each of the three steps to the dtype).
The output has x's layout where x is dense (as torch's element-wise result does), else is
contiguous. D must be even (rotate_half's halves).

Launch key: the element count N on the `elements` ladder and the row length D on the `row`
ladder (the block holds half a row).

`rope_cos_sin` (`nbx_tune.rope_cos_sin`, LlamaRotaryEmbedding.forward) makes the cos and sin
tables those take: angle = float32(position) * inv_freq in fp32, as the model computes it,
then cos and sin times the attention scaling, each of the D / 2 frequencies written twice;
one launch for torch's nine. Keyed as rotary is: the tables' element count and D.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from nbx_tune.errors import KernelError
from nbx_tune.kernels.serving import custom_ops  # noqa: F401  (defines the torch op serve_ops names)
from nbx_tune.kernels.runtime import launch
from nbx_tune.kernels.runtime.certified import config_for
from nbx_tune.kernels.copy import dense
from nbx_tune.kernels.elementwise import INDEX_LIMIT, TORCH_DTYPES
from nbx_tune.kernels.rows import format_shape, numel
from nbx_tune.kernels.spec import Config, KernelSpec, KeyDim, NotServable, Problem, plain_row, seat_flags
from nbx_tune.oracles import rope as oracle

OP = "nbx_tune.rotary"
OP_QK = "nbx_tune.rotary_qk"  # q and k in one launch: what apply_rotary_pos_emb computes
OP_COS_SIN = "nbx_tune.rope_cos_sin"  # the cos and sin tables: LlamaRotaryEmbedding.forward
_NAMES = {v: k for k, v in TORCH_DTYPES.items()}
_FLAGS = seat_flags()


@triton.jit
def _rotary_rows(x_ptr, cos_ptr, sin_ptr, out_ptr, p, R, H, S, HALF,
                 sxb, sxh, sxs, scb, scs, ssb, sss, sob, soh, sos,
                 ROWS: tl.constexpr, BLOCK_D: tl.constexpr, INT64: tl.constexpr):
    """Rows r = (b, h, s) of x, the p-th ROWS of them, each as its halves of HALF elements
    (a block of BLOCK_D, the next power of two). s?b, s?h, s?s: the strides of x, cos, sin
    and out over B, H and S (0 where cos and sin broadcast); the last dim's stride is 1."""
    r = p * ROWS + tl.arange(0, ROWS)
    if INT64:
        r = r.to(tl.int64)
    rmask = r < R
    s = r % S
    t = r // S
    h = t % H
    b = t // H
    d = tl.arange(0, BLOCK_D)
    m = rmask[:, None] & (d < HALF)[None, :]
    xo = (b * sxb + h * sxh + s * sxs)[:, None] + d[None, :]
    co = (b * scb + s * scs)[:, None] + d[None, :]
    so = (b * ssb + s * sss)[:, None] + d[None, :]
    oo = (b * sob + h * soh + s * sos)[:, None] + d[None, :]
    x1 = tl.load(x_ptr + xo, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + xo + HALF, mask=m, other=0.0).to(tl.float32)
    c1 = tl.load(cos_ptr + co, mask=m, other=0.0).to(tl.float32)
    c2 = tl.load(cos_ptr + co + HALF, mask=m, other=0.0).to(tl.float32)
    s1 = tl.load(sin_ptr + so, mask=m, other=0.0).to(tl.float32)
    s2 = tl.load(sin_ptr + so + HALF, mask=m, other=0.0).to(tl.float32)
    ty = out_ptr.dtype.element_ty
    tl.store(out_ptr + oo, (x1 * c1 - x2 * s1).to(ty), mask=m)
    tl.store(out_ptr + oo + HALF, (x2 * c2 + x1 * s2).to(ty), mask=m)


@triton.jit
def _rotary_kernel(x_ptr, out_ptr, R, H, sxb, sxh, sxs, sob, soh, sos,
                   y_ptr, yout_ptr, RY, HY, syb, syh, sys, syob, syoh, syos, X_PROGRAMS,
                   cos_ptr, sin_ptr, S, HALF, scb, scs, ssb, sss,
                   ROWS: tl.constexpr, BLOCK_D: tl.constexpr, INT64: tl.constexpr):
    """x's rows in the first X_PROGRAMS programs, then y's (a model's q and k, in one
    launch; y is absent, RY = 0, for one tensor), both against the same cos and sin."""
    pid = tl.program_id(0)
    if pid < X_PROGRAMS:
        _rotary_rows(x_ptr, cos_ptr, sin_ptr, out_ptr, pid, R, H, S, HALF, sxb, sxh, sxs,
                     scb, scs, ssb, sss, sob, soh, sos, ROWS, BLOCK_D, INT64)
    else:
        _rotary_rows(y_ptr, cos_ptr, sin_ptr, yout_ptr, pid - X_PROGRAMS, RY, HY, S, HALF, syb, syh, sys,
                     scb, scs, ssb, sss, syob, syoh, syos, ROWS, BLOCK_D, INT64)


_rotary_kernel = launch.recorded(_rotary_kernel)  # its calls are replayed (kernels/runtime/launch.py)


def _bs_strides(t, B: int) -> tuple[int, int]:
    """cos's or sin's strides over (B, S): 0 over a batch of 1 broadcast to B."""
    return (0 if t.shape[0] == 1 and B != 1 else t.stride(0)), t.stride(1)


def launch_rotary(x, cos, sin, out, config: Config, y=None, yout=None) -> None:
    """out = rotary(x, cos, sin), and yout = rotary(y, cos, sin) in the same launch where y is
    given: x, y and the outputs (B, H, S, D) (y's H its own), cos and sin (B or 1, S, D),
    every last dim contiguous, D even."""
    B, H, S, D = x.shape
    rows = config["ROWS"]
    R = B * H * S
    sx, so = x.stride(), out.stride()
    sc, ss = _bs_strides(cos, B), _bs_strides(sin, B)
    tensors = (x, cos, sin, out) if y is None else (x, cos, sin, out, y, yout)
    extent = max(sum((k - 1) * abs(st) for k, st in zip(t.shape, t.stride())) for t in tensors)
    if y is None:
        y, yout, RY, HY, sy, syo = x, out, 0, 1, sx, so
    else:
        RY, HY, sy, syo = B * y.shape[1] * S, y.shape[1], y.stride(), yout.stride()
    programs = triton.cdiv(R, rows)
    grid = (programs + triton.cdiv(RY, rows),)
    _rotary_kernel[grid](x, out, R, H, sx[0], sx[1], sx[2], so[0], so[1], so[2],
                         y, yout, RY, HY, sy[0], sy[1], sy[2], syo[0], syo[1], syo[2], programs,
                         cos, sin, S, D // 2, *sc, *ss,
                         BLOCK_D=triton.next_power_of_2(D // 2), INT64=max(extent + D, R, RY) > INDEX_LIMIT,
                         **config.kwargs)


def _c(rows, warps):
    return Config.make(ROWS=rows, num_warps=warps, num_stages=1)


# Rows per program is what a config changes: one for a decode step's few rows (a program
# each), more for a prefill's thousands; warps over a block of ROWS x D / 2 per half.
CONFIGS = (_c(1, 1), _c(1, 2), _c(2, 2), _c(4, 2), _c(4, 4), _c(8, 4), _c(16, 4), _c(16, 8), _c(32, 8),
           _c(64, 8))
DEFAULTS = (_c(4, 4),)


class RotarySpec(KernelSpec):
    name = "rotary"
    ops = (OP,)
    key = (KeyDim("N", "elements"), KeyDim("D", "row"))
    dtypes = tuple(TORCH_DTYPES)
    description = "rotary position embedding of q or k in one launch (x * cos + rotate_half(x) * sin)"

    config_space = CONFIGS
    default_configs = DEFAULTS

    def source_parts(self):
        return (_rotary_rows, _rotary_kernel, _bs_strides, launch_rotary)

    def problem_from_row(self, row):
        dt = plain_row(row, OP, 3, self.dtypes)
        if isinstance(dt, NotServable):
            return dt
        x, c, s = (tuple(sh) for sh in row.shapes)
        why = _refusal(x, c, s)
        if why:
            return NotServable(why)
        n = numel(x)
        if n == 0:
            return NotServable("an empty tensor: nothing to launch")
        return Problem(self.name, (dt,), _FLAGS, (n, x[3]), (("cos_shape", c), ("x_shape", x)))

    # x and out are laid out as a model lays out q and k, (B, S, H, D) in memory viewed as
    # (B, H, S, D): the screen and the timing read the rows a model's call reads.
    def input_shapes(self, problem):
        dt = problem.dtypes[0]
        c = (tuple(problem.get("cos_shape")), dt)
        return {"x": (_model_layout(problem.get("x_shape")), dt), "cos": c, "sin": c}

    def make_inputs(self, problem, rng):
        shapes = self.input_shapes(problem)
        x_shape, dt = shapes["x"]
        c_shape = shapes["cos"][0]
        return {"x": (2.0 * rng.standard_normal(x_shape), dt), "cos": (rng.uniform(-1.0, 1.0, c_shape), dt),
                "sin": (rng.uniform(-1.0, 1.0, c_shape), dt)}

    def oracle(self, problem, inputs):
        c_shape = tuple(problem.get("cos_shape"))
        x = inputs["x"].reshape(_model_layout(problem.get("x_shape"))).transpose(0, 2, 1, 3)
        y = oracle.rotary(x, inputs["cos"].reshape(c_shape), inputs["sin"].reshape(c_shape))
        return {"out": np.ascontiguousarray(y.transpose(0, 2, 1, 3))}

    def output_specs(self, problem):
        return {"out": (_model_layout(problem.get("x_shape")), problem.dtypes[0])}

    def serve_ops(self):
        return {OP: rotary}

    def launch(self, config, problem, inputs, outputs):
        layout, c_shape = _model_layout(problem.get("x_shape")), tuple(problem.get("cos_shape"))
        launch_rotary(inputs["x"].reshape(layout).transpose(1, 2), inputs["cos"].reshape(c_shape),
                      inputs["sin"].reshape(c_shape), outputs["out"].view(layout).transpose(1, 2), config)

    def example_rows(self, scale):
        from nbx_tune.kernels.rows import make_row

        if scale == "small":
            dts = ("float16", "float32")
            cases = (((2, 3, 7, 10), (2, 7, 10)), ((3, 2, 5, 64), (1, 5, 64)), ((1, 5, 1, 6), (1, 1, 6)))
        else:  # Llama-7B's q (32 heads of 128) in a prefill and a decode step, and an odd batch
            dts = tuple(TORCH_DTYPES)
            cases = (((1, 32, 512, 128), (1, 512, 128)), ((1, 32, 1, 128), (1, 1, 128)),
                     ((3, 8, 257, 64), (1, 257, 64)), ((2, 5, 33, 96), (2, 33, 96)))
        return [make_row(OP, [dt] * 3, [x, c, c]) for dt in dts for x, c in cases]


class RotaryQKSpec(RotarySpec):
    """q and k rotated in one launch (`nbx_tune.rotary_qk`): the same kernel, k's rows in the
    programs after q's; its own seats (the element count is q's and k's together)."""

    name = "rotary_qk"
    ops = (OP_QK,)
    description = "rotary position embedding of q and k in one launch"

    def problem_from_row(self, row):
        dt = plain_row(row, OP_QK, 4, self.dtypes)
        if isinstance(dt, NotServable):
            return dt
        q, k, c, s = (tuple(sh) for sh in row.shapes)
        why = _refusal(q, c, s) or _refusal(k, c, s) or _pair_refusal(q, k)
        if why:
            return NotServable(why)
        n = numel(q) + numel(k)
        return Problem(self.name, (dt,), _FLAGS, (n, q[3]), (("cos_shape", c), ("k_shape", k), ("q_shape", q)))

    def input_shapes(self, problem):
        dt = problem.dtypes[0]
        c = (tuple(problem.get("cos_shape")), dt)
        return {"q": (_model_layout(problem.get("q_shape")), dt), "k": (_model_layout(problem.get("k_shape")), dt),
                "cos": c, "sin": c}

    def make_inputs(self, problem, rng):
        shapes = self.input_shapes(problem)
        c_shape = shapes["cos"][0]
        return {"q": (2.0 * rng.standard_normal(shapes["q"][0]), problem.dtypes[0]),
                "k": (2.0 * rng.standard_normal(shapes["k"][0]), problem.dtypes[0]),
                "cos": (rng.uniform(-1.0, 1.0, c_shape), problem.dtypes[0]),
                "sin": (rng.uniform(-1.0, 1.0, c_shape), problem.dtypes[0])}

    def oracle(self, problem, inputs):
        c_shape = tuple(problem.get("cos_shape"))
        cos, sin = inputs["cos"].reshape(c_shape), inputs["sin"].reshape(c_shape)
        out = {}
        for name in ("q", "k"):
            x = inputs[name].reshape(_model_layout(problem.get(f"{name}_shape"))).transpose(0, 2, 1, 3)
            out[f"{name}_out"] = np.ascontiguousarray(oracle.rotary(x, cos, sin).transpose(0, 2, 1, 3))
        return out

    def output_specs(self, problem):
        dt = problem.dtypes[0]
        return {"q_out": (_model_layout(problem.get("q_shape")), dt),
                "k_out": (_model_layout(problem.get("k_shape")), dt)}

    def serve_ops(self):
        return {OP_QK: rotary_qk}

    def launch(self, config, problem, inputs, outputs):
        c_shape = tuple(problem.get("cos_shape"))
        q_layout, k_layout = _model_layout(problem.get("q_shape")), _model_layout(problem.get("k_shape"))
        launch_rotary(inputs["q"].reshape(q_layout).transpose(1, 2), inputs["cos"].reshape(c_shape),
                      inputs["sin"].reshape(c_shape), outputs["q_out"].view(q_layout).transpose(1, 2), config,
                      inputs["k"].reshape(k_layout).transpose(1, 2), outputs["k_out"].view(k_layout).transpose(1, 2))

    def example_rows(self, scale):
        from nbx_tune.kernels.rows import make_row

        if scale == "small":
            dts = ("float16", "float32")
            cases = (((2, 3, 7, 10), (2, 1, 7, 10), (2, 7, 10)), ((3, 4, 5, 64), (3, 2, 5, 64), (1, 5, 64)))
        else:  # Llama-3-8B's q and k (32 and 8 heads of 128) in a prefill and a decode step
            dts = tuple(TORCH_DTYPES)
            cases = (((1, 32, 512, 128), (1, 8, 512, 128), (1, 512, 128)),
                     ((4, 32, 1, 128), (4, 8, 1, 128), (4, 1, 128)), ((3, 6, 33, 96), (3, 2, 33, 96), (3, 33, 96)))
        return [make_row(OP_QK, [dt] * 4, [q, k, c, c]) for dt in dts for q, k, c in cases]


# ----------------------------------------------------------------------------- cos and sin tables

@triton.jit
def _cos_sin_kernel(pos_ptr, inv_ptr, cos_ptr, sin_ptr, R, S, spb, sps, HALF, scaling,
                    ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """Rows r = (b, s) of the tables: angle = float32(pos[b, s]) * inv_freq in fp32 (one
    rounding, as the model's product), cos and sin of it times scaling, each stored twice
    (the halves of cat(freqs, freqs))."""
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = r < R
    d = tl.arange(0, BLOCK_D)
    dmask = d < HALF
    pos = tl.load(pos_ptr + (r // S).to(tl.int64) * spb + (r % S) * sps, mask=rmask, other=0).to(tl.float32)
    angle = pos[:, None] * tl.load(inv_ptr + d, mask=dmask, other=0.0)[None, :]
    m = rmask[:, None] & dmask[None, :]
    o = r.to(tl.int64)[:, None] * (2 * HALF) + d[None, :]
    ty = cos_ptr.dtype.element_ty
    c = (tl.cos(angle) * scaling).to(ty)
    s = (tl.sin(angle) * scaling).to(ty)
    tl.store(cos_ptr + o, c, mask=m)
    tl.store(cos_ptr + o + HALF, c, mask=m)
    tl.store(sin_ptr + o, s, mask=m)
    tl.store(sin_ptr + o + HALF, s, mask=m)


_cos_sin_kernel = launch.recorded(_cos_sin_kernel)  # its calls are replayed (kernels/runtime/launch.py)


def launch_cos_sin(pos, inv_freq, cos, sin, scaling: float, config: Config) -> None:
    """cos, sin (B, S, D) contiguous = the tables of pos (B, S), any strides, and inv_freq
    (D / 2,) float32 contiguous."""
    B, S = pos.shape
    R, half = B * S, inv_freq.shape[0]
    _cos_sin_kernel[(triton.cdiv(R, config["ROWS"]),)](
        pos, inv_freq, cos, sin, R, S, pos.stride(0), pos.stride(1), half, scaling,
        BLOCK_D=triton.next_power_of_2(half), **config.kwargs)


POSITION_DTYPES = ("int64", "int32")


class CosSinSpec(KernelSpec):
    """transformers' LlamaRotaryEmbedding.forward (`nbx_tune.rope_cos_sin`): the cos and sin
    tables of a forward's positions, 9 launches in torch (a cast, the product, cat, cos, sin,
    two scalings, two casts), one here."""

    name = "rope_cos_sin"
    ops = (OP_COS_SIN,)
    key = (KeyDim("N", "elements"), KeyDim("D", "row"))
    dtypes = tuple(TORCH_DTYPES)  # the tables' dtype; the positions' is the problem's second
    description = "the rotary embedding's cos and sin tables of the positions, in one launch"

    config_space = CONFIGS
    default_configs = DEFAULTS

    def source_parts(self):
        return (_cos_sin_kernel, launch_cos_sin)

    def problem_from_row(self, row):
        if row.op.removesuffix(".default") != OP_COS_SIN:
            return NotServable(f"{row.op}: overload not served")
        if len(row.shapes) != 2:
            return NotServable(f"{OP_COS_SIN} takes 2 tensors, the row has {len(row.shapes)}")
        unknown = set(row.params) - {"scaling", "dtype"}
        if unknown:
            return NotServable(f"{OP_COS_SIN}: unsupported params {', '.join(sorted(unknown))}")
        (p_dt, f_dt), (p_shape, f_shape) = row.dtypes, (tuple(s) for s in row.shapes)
        out_dt = row.params.str("dtype", "")
        try:
            scaling = row.params.float("scaling", None)
        except ValueError as e:
            return NotServable(f"unreadable params: {e}")
        why = _cos_sin_refusal(p_dt, f_dt, p_shape, f_shape, out_dt, scaling)
        if why:
            return NotServable(why)
        half = f_shape[0]
        n = numel(p_shape) * 2 * half
        return Problem(self.name, (out_dt, p_dt), _FLAGS, (n, 2 * half),
                       (("inv_freq", f_shape), ("positions", p_shape), ("scaling", scaling)))

    def input_shapes(self, problem):
        return {"position_ids": (tuple(problem.get("positions")), problem.dtypes[1]),
                "inv_freq": (tuple(problem.get("inv_freq")), "float32")}

    def make_inputs(self, problem, rng):
        (half,) = problem.get("inv_freq")
        pos = rng.integers(0, 8192, tuple(problem.get("positions")))
        return {"position_ids": (pos, problem.dtypes[1]),  # Llama's frequencies, theta 10000
                "inv_freq": (1.0 / 10000.0 ** (np.arange(half) * 2.0 / (2 * half)), "float32")}

    def oracle(self, problem, inputs):
        pos = inputs["position_ids"].reshape(tuple(problem.get("positions")))
        cos, sin = oracle.cos_sin(pos, inputs["inv_freq"], problem.get("scaling"))
        return {"cos": cos, "sin": sin}

    def output_specs(self, problem):
        shape = (*_as_bs(problem.get("positions")), problem.dims[1])
        return {"cos": (shape, problem.dtypes[0]), "sin": (shape, problem.dtypes[0])}

    def serve_ops(self):
        return {OP_COS_SIN: rope_cos_sin}

    def launch(self, config, problem, inputs, outputs):
        pos = inputs["position_ids"].reshape(_as_bs(problem.get("positions")))
        launch_cos_sin(pos, inputs["inv_freq"], outputs["cos"], outputs["sin"], problem.get("scaling"), config)

    def example_rows(self, scale):
        from nbx_tune.kernels.rows import make_row

        if scale == "small":
            dts, cases = ("float16", "float32"), (((1, 9), (5,)), ((3, 1), (8,)), ((7,), (32,)))
        else:  # Llama's head dim 128: a prefill, a decode step of a batch of 8, an odd one
            dts, cases = tuple(TORCH_DTYPES), (((1, 512), (64,)), ((8, 1), (64,)), ((3, 1001), (48,)))
        return [make_row(OP_COS_SIN, [p_dt, "float32"], [p, f], {"scaling": "1.0", "dtype": dt})
                for dt in dts for p, f in cases for p_dt in POSITION_DTYPES[:1 if len(p) == 2 else 2]]


def _as_bs(positions) -> tuple[int, int]:
    """Positions (S,) or (B, S) as (B, S)."""
    return (1, *positions) if len(positions) == 1 else tuple(positions)


def _cos_sin_refusal(p_dt, f_dt, p_shape, f_shape, out_dt, scaling) -> str | None:
    if p_dt not in POSITION_DTYPES:
        return f"position dtype {p_dt} is not served ({', '.join(POSITION_DTYPES)})"
    if f_dt != "float32":
        return f"inv_freq dtype {f_dt}: float32 expected"
    if out_dt not in TORCH_DTYPES:
        return f"table dtype {out_dt or 'not given'} is not served ({', '.join(TORCH_DTYPES)})"
    if scaling is None:
        return f"{OP_COS_SIN} row without scaling"
    if len(p_shape) not in (1, 2) or len(f_shape) != 1:
        return f"positions {format_shape(p_shape)} and inv_freq {format_shape(f_shape)}: (B, S) or (S,), and (D / 2,) expected"
    if numel(p_shape) == 0 or f_shape[0] == 0:
        return "an empty table: nothing to launch"
    return None


SPEC = RotarySpec()
QK_SPEC = RotaryQKSpec()
COS_SIN_SPEC = CosSinSpec()
SPECS = (SPEC, QK_SPEC, COS_SIN_SPEC)


def _model_layout(x_shape) -> tuple[int, ...]:
    """(B, S, H, D): the memory order of a model's (B, H, S, D) q or k."""
    B, H, S, D = x_shape
    return (B, S, H, D)


def _refusal(x, c, s) -> str | None:
    """Why shapes x, cos, sin are not served, or None."""
    if len(x) != 4:
        return f"x {format_shape(x)}: (B, H, S, D) expected"
    B, H, S, D = x
    if D % 2:
        return f"an odd head dim {D}: rotate_half's halves differ in length"
    if tuple(c) != tuple(s):
        return f"cos {format_shape(c)} and sin {format_shape(s)} differ"
    if len(c) != 3 or c[1:] != (S, D) or c[0] not in (1, B):
        return f"cos {format_shape(c)} with x {format_shape(x)}: (B or 1, S, D) expected"
    return None


def _pair_refusal(q, k) -> str | None:
    if q[0] != k[0] or q[2:] != k[2:]:
        return f"q {format_shape(q)} and k {format_shape(k)}: one batch, sequence and head dim expected"
    return None


# ----------------------------------------------------------------------------- public op

REMEMBERED = launch.REMEMBERED


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x * cos.unsqueeze(1) + rotate_half(x) * sin.unsqueeze(1): x (B, H, S, D), any strides;
    cos and sin (B or 1, S, D); one dtype (fp16, bf16, fp32); D even."""
    try:  # the direct launch (kernels/runtime/launch.py)
        key = (SPEC, *launch.tensor_key(x), *launch.tensor_key(cos), *launch.tensor_key(sin))
    except AttributeError:
        raise KernelError("rotary: x, cos and sin must be tensors") from None
    hit = REMEMBERED.get(key)
    if hit is not None:
        return hit(x, cos, sin)
    return launch.remember(key, (x, cos, sin), _rotary_call, x, cos, sin)


def _out_strides(x: torch.Tensor):
    """x's strides where x is dense with its last dim innermost (the layout torch's
    element-wise result takes), else None (contiguous)."""
    if x.stride(-1) != 1:
        return None
    dims = sorted((st, k) for st, k in zip(x.stride(), x.shape) if k != 1)
    expect = 1
    for st, k in dims:
        if st != expect:
            return None
        expect *= k
    return x.stride()


def _checked(what: str, x, cos, sin):
    """x, cos, sin as the kernel reads them (last dims contiguous), and the dtype's name;
    KernelError where they are not served."""
    dt = _NAMES.get(x.dtype)
    if dt is None or cos.dtype != x.dtype or sin.dtype != x.dtype:
        raise KernelError(f"{what}: dtypes {x.dtype}, {cos.dtype}, {sin.dtype}: one of float16, bfloat16, "
                          "float32 expected")
    why = _refusal(tuple(x.shape), tuple(cos.shape), tuple(sin.shape))
    if why:
        raise KernelError(f"{what}: {why}")
    if not (x.device == cos.device == sin.device):
        raise KernelError(f"{what}: x on {x.device}, cos on {cos.device}, sin on {sin.device}")
    if x.stride(-1) != 1:
        x = dense(x)
    cos = cos if cos.stride(-1) == 1 else dense(cos)
    sin = sin if sin.stride(-1) == 1 else dense(sin)
    return x, cos, sin, dt


def _rotary_call(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x, cos, sin, dt = _checked("rotary", x, cos, sin)
    out = launch.empty(x.shape, x.dtype, x.device, _out_strides(x))
    n = out.numel()
    if n == 0:
        return out
    launch_rotary(x, cos, sin, out, config_for(SPEC, (dt,), _FLAGS, (n, x.shape[3])))
    return out


def rotary_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """(rotary(q, cos, sin), rotary(k, cos, sin)) in one launch: q (B, Hq, S, D) and k
    (B, Hk, S, D), any strides; cos and sin (B or 1, S, D); one dtype; D even."""
    try:  # the direct launch (kernels/runtime/launch.py)
        key = (QK_SPEC, *launch.tensor_key(q), *launch.tensor_key(k), *launch.tensor_key(cos),
               *launch.tensor_key(sin))
    except AttributeError:
        raise KernelError("rotary_qk: q, k, cos and sin must be tensors") from None
    hit = REMEMBERED.get(key)
    if hit is not None:
        return hit(q, k, cos, sin)
    return launch.remember(key, (q, k, cos, sin), _rotary_qk_call, q, k, cos, sin)


def _rotary_qk_call(q, k, cos, sin):
    if k.dtype != q.dtype:
        raise KernelError(f"rotary_qk: q is {q.dtype}, k {k.dtype}")
    why = _pair_refusal(tuple(q.shape), tuple(k.shape)) if q.dim() == k.dim() == 4 else "q and k: (B, H, S, D) expected"
    if why:
        raise KernelError(f"rotary_qk: {why}")
    q, cos, sin, dt = _checked("rotary_qk", q, cos, sin)
    k = _checked("rotary_qk", k, cos, sin)[0]
    q_out = launch.empty(q.shape, q.dtype, q.device, _out_strides(q))
    k_out = launch.empty(k.shape, k.dtype, k.device, _out_strides(k))
    n = q_out.numel() + k_out.numel()
    if n:
        launch_rotary(q, cos, sin, q_out, config_for(QK_SPEC, (dt,), _FLAGS, (n, q.shape[3])), k, k_out)
    return q_out, k_out



def rope_cos_sin(position_ids: torch.Tensor, inv_freq: torch.Tensor, scaling: float, dtype: torch.dtype):
    """(cos, sin), each position_ids.shape + (D,) in `dtype`: the rotary embedding's tables,
    angle = position * inv_freq in float32, cos and sin of it times scaling, each frequency
    twice. position_ids (B, S) or (S,), int64 or int32; inv_freq (D / 2,) float32."""
    try:  # the direct launch (kernels/runtime/launch.py)
        key = (COS_SIN_SPEC, scaling, dtype, *launch.tensor_key(position_ids), *launch.tensor_key(inv_freq))
    except AttributeError:
        raise KernelError("rope_cos_sin: position_ids and inv_freq must be tensors") from None
    hit = REMEMBERED.get(key)
    if hit is not None:
        return hit(position_ids, inv_freq)
    return launch.remember(key, (position_ids, inv_freq), _cos_sin_call, position_ids, inv_freq, scaling, dtype)


def _cos_sin_call(position_ids, inv_freq, scaling, dtype):
    p_dt = str(position_ids.dtype).removeprefix("torch.")
    why = _cos_sin_refusal(p_dt, str(inv_freq.dtype).removeprefix("torch."), tuple(position_ids.shape),
                           tuple(inv_freq.shape), _NAMES.get(dtype, str(dtype)), float(scaling))
    if why:
        raise KernelError(f"rope_cos_sin: {why}")
    if position_ids.device != inv_freq.device:
        raise KernelError(f"rope_cos_sin: position_ids on {position_ids.device}, inv_freq on {inv_freq.device}")
    pos = position_ids.view(_as_bs(position_ids.shape))
    inv_freq = dense(inv_freq)
    D = 2 * inv_freq.shape[0]
    cos = launch.empty((*position_ids.shape, D), dtype, pos.device)
    sin = launch.empty((*position_ids.shape, D), dtype, pos.device)
    launch_cos_sin(pos, inv_freq, cos, sin, float(scaling),
                   config_for(COS_SIN_SPEC, (_NAMES[dtype], p_dt), _FLAGS, (cos.numel(), D)))
    return cos, sin
