"""A residual add and the norm of its sum in one launch: `nbx_tune.add_rms_norm` (a Llama
decoder layer's `h = residual + attn_out; x = post_attention_layernorm(h)`) and
`nbx_tune.add_layer_norm` (GPT-2's `h = attn_out + residual; x = ln_2(h)`), in fp16, bf16
and fp32. Each returns (normed, sum): the layer goes on with both, the sum being the next
residual. torch runs the pair as two launches, the add writing the sum and the norm
reading it back.

Rows of N contiguous elements (the hidden size), ROWS of them a program, as the row norms of
kernels/norms.py. The sum is rounded to the dtype, stored, and normalized as rounded (what
the two ops compute); the norm is in fp32 and rounded once. A row that fits one BLOCK is
held in registers; a longer one is read again for each pass (the sum recomputed from both
inputs: another thread's store of it is not ordered before this thread's load).

Launch key: the row length N on the `row` ladder; the row count is a screen and timing
detail, as for the row norms.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nbx_tune.errors import KernelError
from nbx_tune.kernels.serving import custom_ops  # noqa: F401  (defines the torch ops serve_ops names)
from nbx_tune.kernels.runtime import launch
from nbx_tune.kernels.runtime.certified import config_for
from nbx_tune.kernels.copy import dense
from nbx_tune.kernels.norms import TORCH_DTYPES, RowSpec, norm_smem
from nbx_tune.kernels.rows import format_shape, numel
from nbx_tune.kernels.spec import NotServable, Problem, float_params, one_dtype, seat_flags
from nbx_tune.oracles import norms as oracle

OP_RMS = "nbx_tune.add_rms_norm"
OP_LAYER = "nbx_tune.add_layer_norm"
INT32_MAX = 2**31 - 1
_NAMES = {v: k for k, v in TORCH_DTYPES.items()}
_FLAGS = seat_flags()


@triton.jit
def _rounded_sum(x_ptr, r_ptr, offs, mask):
    """x + residual in fp32, rounded to the dtype as torch's add rounds it, back in fp32."""
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    return (x + r).to(x_ptr.dtype.element_ty).to(tl.float32)


@triton.jit
def _add_norm_kernel(x_ptr, r_ptr, w_ptr, b_ptr, y_ptr, s_ptr, n_rows, N, eps,
                     RMS: tl.constexpr, HAS_B: tl.constexpr, ONE_PASS: tl.constexpr,
                     ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """s = x + r, y = norm(s) * w (+ b) over rows of N elements. RMS: s * rstd(s); else
    (s - mean) * rstd of the centered s. Sums and norms in fp32."""
    pid = tl.program_id(0)
    rows = pid * ROWS + tl.arange(0, ROWS)
    row_ok = rows < n_rows
    base = (tl.where(row_ok, rows, 0).to(tl.int64) * N)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    if ONE_PASS:
        mask = row_ok[:, None] & (cols < N)
        h = _rounded_sum(x_ptr, r_ptr, base + cols, mask)
        tl.store(s_ptr + base + cols, h.to(s_ptr.dtype.element_ty), mask=mask)
        if RMS:
            rstd = tl.rsqrt(tl.sum(h * h, axis=1) / N + eps)
            y = h * rstd[:, None]
        else:
            d = tl.where(mask, h - (tl.sum(h, axis=1) / N)[:, None], 0.0)
            y = d * tl.rsqrt(tl.sum(d * d, axis=1) / N + eps)[:, None]
        y = y * tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
        if HAS_B:
            y = y + tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
        tl.store(y_ptr + base + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        # The first pass stores the sum; layer norm's mean then its centered variance
        # (exact, a pass each: rows this long are rare), RMS norm's mean square.
        acc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
        for start in range(0, N, BLOCK):
            c = start + cols
            mask = row_ok[:, None] & (c < N)
            h = _rounded_sum(x_ptr, r_ptr, base + c, mask)
            tl.store(s_ptr + base + c, h.to(s_ptr.dtype.element_ty), mask=mask)
            if RMS:
                acc += h * h
            else:
                acc += h
        if RMS:
            mean = tl.zeros([ROWS], dtype=tl.float32)
            rstd = tl.rsqrt(tl.sum(acc, axis=1) / N + eps)
        else:
            mean = tl.sum(acc, axis=1) / N
            acc2 = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
            for start in range(0, N, BLOCK):
                c = start + cols
                mask = row_ok[:, None] & (c < N)
                d = tl.where(mask, _rounded_sum(x_ptr, r_ptr, base + c, mask) - mean[:, None], 0.0)
                acc2 += d * d
            rstd = tl.rsqrt(tl.sum(acc2, axis=1) / N + eps)
        for start in range(0, N, BLOCK):
            c = start + cols
            mask = row_ok[:, None] & (c < N)
            y = (_rounded_sum(x_ptr, r_ptr, base + c, mask) - mean[:, None]) * rstd[:, None]
            y = y * tl.load(w_ptr + c, mask=c < N, other=0.0).to(tl.float32)
            if HAS_B:
                y = y + tl.load(b_ptr + c, mask=c < N, other=0.0).to(tl.float32)
            tl.store(y_ptr + base + c, y.to(y_ptr.dtype.element_ty), mask=mask)


_add_norm_kernel = launch.recorded(_add_norm_kernel)  # its calls are replayed (kernels/runtime/launch.py)


def launch_add_norm(x, residual, weight, bias, out, total, n_rows: int, N: int, eps: float, rms: bool,
                    config) -> None:
    """total = x + residual and out = norm(total) * weight (+ bias) over rows of N: x,
    residual, out and total contiguous of n_rows * N elements, weight and bias N."""
    _add_norm_kernel[(triton.cdiv(n_rows, config["ROWS"]),)](
        x, residual, weight, weight if bias is None else bias, out, total, n_rows, N, eps,
        RMS=rms, HAS_B=bias is not None, ONE_PASS=N <= config["BLOCK"], **config.kwargs)


class _AddNormSpec(RowSpec):
    """Shared by both ops: the row, its checks, inputs and launch; `rms` picks the norm."""

    op: str = ""
    rms: bool = True
    affine: tuple[str, ...] = ("weight",)

    def source_parts(self):
        return (_rounded_sum, _add_norm_kernel, launch_add_norm)

    def smem_bytes(self, config, problem):
        return norm_smem(config, problem, 1 if self.rms else 2)

    def problem_from_row(self, row):
        """x and residual of one shape, the affine tensors shaped like its last dim, eps a param."""
        if row.op.removesuffix(".default") != self.op:
            return NotServable(f"{row.op}: overload not served")
        want = 2 + len(self.affine)
        if len(row.shapes) != want:
            return NotServable(f"{self.op} takes {want} tensors, the row has {len(row.shapes)}")
        dt = one_dtype(row, self.dtypes)
        if isinstance(dt, NotServable):
            return dt
        got = float_params(row, "eps")
        if isinstance(got, NotServable):
            return got
        eps, = got
        if eps is None:
            return NotServable(f"{self.op} row without eps")
        shape = tuple(row.shapes[0])
        if tuple(row.shapes[1]) != shape or not shape:
            return NotServable(f"x {format_shape(row.shapes[0])} and residual {format_shape(row.shapes[1])}: "
                               "one shape expected")
        N = shape[-1]
        for name, s in zip(self.affine, row.shapes[2:]):
            if tuple(s) != (N,):
                return NotServable(f"{name} {format_shape(s)}: {N} values (a row) expected")
        if numel(shape) == 0:
            return NotServable("an empty tensor: nothing to launch")
        if N > INT32_MAX:
            return NotServable("a normalized row of 2^31 elements or more")
        extra = (("M", numel(shape) // N), ("eps", eps), ("shape", shape))  # M first: more rows time as larger
        return Problem(self.name, (dt,), _FLAGS, (N,), extra)

    def resized(self, problem, dims):
        # As many rows of another length: the kernel sees the row length and count only.
        M, N = problem.get("M"), dims[0]
        extra = dict(problem.extra, shape=(M, N))
        return Problem(problem.kernel, problem.dtypes, problem.flags, (N,), tuple(sorted(extra.items())))

    def input_shapes(self, problem):
        shape, dt = tuple(problem.get("shape")), problem.dtypes[0]
        return {"x": (shape, dt), "residual": (shape, dt), **{n: ((shape[-1],), dt) for n in self.affine}}

    def make_inputs(self, problem, rng):
        shape, dt = tuple(problem.get("shape")), problem.dtypes[0]
        out = {"x": (2.0 * rng.standard_normal(shape), dt), "residual": (0.5 + 2.0 * rng.standard_normal(shape), dt),
               "weight": (1.0 + 0.5 * rng.standard_normal(shape[-1]), dt)}
        if "bias" in self.affine:
            out["bias"] = (0.5 * rng.standard_normal(shape[-1]), dt)
        return out

    def oracle(self, problem, inputs):
        shape = tuple(problem.get("shape"))
        total = inputs["x"].reshape(shape) + inputs["residual"].reshape(shape)
        if self.rms:
            out = oracle.rms_norm(total, 1, inputs["weight"], problem.get("eps"))[0]
        else:
            out = oracle.layer_norm(total, 1, inputs["weight"], inputs["bias"], problem.get("eps"))[0]
        return {"out": out, "sum": total}

    def output_specs(self, problem):
        spec = (tuple(problem.get("shape")), problem.dtypes[0])
        return {"out": spec, "sum": spec}

    def launch(self, config, problem, inputs, outputs):
        N = problem.dims[0]
        x = inputs["x"]
        launch_add_norm(x, inputs["residual"], inputs["weight"], inputs.get("bias"), outputs["out"], outputs["sum"],
                        x.numel() // N, N, problem.get("eps"), self.rms, config)

    def example_rows(self, scale):
        from nbx_tune.kernels.rows import make_row

        if scale == "small":
            dts, shapes = ("float16", "float32"), ((5, 37), (2, 3, 11), (3, 1100))
        else:  # a 7B decoder's prefill and decode step, GPT-2's, and an odd row longer than a block
            dts, shapes = tuple(self.dtypes), ((1, 512, 4096), (8, 1, 4096), (4, 1024, 768), (3, 20000))
        n_affine = len(self.affine)
        return [make_row(self.op, [dt] * (2 + n_affine), [s, s] + [(s[-1],)] * n_affine, {"eps": "1e-05"})
                for dt in dts for s in shapes]


class AddRMSNormSpec(_AddNormSpec):
    name = "add_rms_norm"
    ops = (OP_RMS,)
    op = OP_RMS
    description = "a residual add and the RMS norm of the sum in one launch, returning (normed, sum)"

    def serve_ops(self):
        return {OP_RMS: add_rms_norm}


class AddLayerNormSpec(_AddNormSpec):
    name = "add_layer_norm"
    ops = (OP_LAYER,)
    op = OP_LAYER
    rms = False
    affine = ("weight", "bias")
    description = "a residual add and the layer norm of the sum in one launch, returning (normed, sum)"

    def serve_ops(self):
        return {OP_LAYER: add_layer_norm}


RMS_SPEC = AddRMSNormSpec()
LAYER_SPEC = AddLayerNormSpec()
SPECS = (RMS_SPEC, LAYER_SPEC)


# ----------------------------------------------------------------------------- public ops

REMEMBERED = launch.REMEMBERED


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    """(rms_norm(x + residual) * weight, x + residual): x and residual of one shape, weight
    their last dim, one dtype (fp16, bf16, fp32)."""
    try:  # the direct launch (kernels/runtime/launch.py)
        key = (RMS_SPEC, eps, *launch.tensor_key(x), *launch.tensor_key(residual), *launch.tensor_key(weight))
    except AttributeError:
        raise KernelError("add_rms_norm: x, residual and weight must be tensors") from None
    hit = REMEMBERED.get(key)
    if hit is not None:
        return hit(x, residual, weight)
    return launch.remember(key, (x, residual, weight), _add_norm_call, RMS_SPEC, x, residual, weight, None, eps)


def add_layer_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float):
    """(layer_norm(x + residual) * weight + bias, x + residual), as add_rms_norm."""
    try:
        key = (LAYER_SPEC, eps, *launch.tensor_key(x), *launch.tensor_key(residual), *launch.tensor_key(weight),
               *launch.tensor_key(bias))
    except AttributeError:
        raise KernelError("add_layer_norm: x, residual, weight and bias must be tensors") from None
    hit = REMEMBERED.get(key)
    if hit is not None:
        return hit(x, residual, weight, bias)
    return launch.remember(key, (x, residual, weight, bias), _add_norm_call, LAYER_SPEC, x, residual, weight, bias,
                           eps)


def _add_norm_call(spec, x, residual, weight, bias, eps):
    what = spec.name
    dt = _NAMES.get(x.dtype)
    if dt is None or any(t.dtype != x.dtype for t in (residual, weight, bias) if t is not None):
        raise KernelError(f"{what}: dtypes {x.dtype}, {residual.dtype}, {weight.dtype}: one of float16, "
                          "bfloat16, float32 expected")
    if x.shape != residual.shape or x.dim() == 0:
        raise KernelError(f"{what}: x {format_shape(x.shape)} and residual {format_shape(residual.shape)}: "
                          "one shape expected")
    N = x.shape[-1]
    for t in (weight, bias):
        if t is not None and tuple(t.shape) != (N,):
            raise KernelError(f"{what}: weight/bias {format_shape(t.shape)}: {N} values (a row) expected")
    if any(t.device != x.device for t in (residual, weight, bias) if t is not None):
        raise KernelError(f"{what}: tensors on more than one device")
    x, residual, weight = dense(x), dense(residual), dense(weight)
    bias = None if bias is None else dense(bias)
    out = launch.empty(x.shape, x.dtype, x.device)
    total = launch.empty(x.shape, x.dtype, x.device)
    M = x.numel() // N if N else 0
    if M and N:
        launch_add_norm(x, residual, weight, bias, out, total, M, N, eps, spec.rms,
                        config_for(spec, (dt,), _FLAGS, (N,)))
    return out, total
