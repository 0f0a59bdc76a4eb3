"""Softmax over one dim: aten._softmax, aten._safe_softmax, aten._log_softmax in fp16, bf16
and fp32 (fp16/bf16 in, fp32 out where the op asks for it).

The launcher views the input as (outer, N, inner), N being the softmax dim, through its
strides: any dim is served without a copy, and each program owns ROWS of the
outer * inner rows. A row that fits one BLOCK is loaded once and written from registers;
a longer row (a 151936-entry vocabulary) is read in BLOCK-sized chunks by the online
algorithm (a running max and a running sum rescaled whenever the max grows), then read
again to write. All arithmetic is in fp32.

A row whose entries are all -inf gives NaN (0/0) as in torch; safe softmax gives 0 there.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from nbx_tune.errors import KernelError
from nbx_tune.kernels.runtime import launch
from nbx_tune.kernels.runtime.certified import config_for
from nbx_tune.kernels.copy import dense
from nbx_tune.kernels.helpers import FLOATS, torch_dtypes
from nbx_tune.kernels.rows import numel
from nbx_tune.kernels.spec import Config, KernelSpec, KeyDim, NotServable, Problem, seat_flags
from nbx_tune.oracles import softmax as oracle

TORCH_DTYPES = torch_dtypes(*FLOATS)
INT32_MAX = 2**31 - 1


@triton.jit
def _softmax_kernel(
    x_ptr, y_ptr, n_rows, N, inner,
    sx_o, sx_i, sx_n, sy_o, sy_i, sy_n,
    LOG: tl.constexpr, SAFE: tl.constexpr, ONE_PASS: tl.constexpr,
    ROWS: tl.constexpr, BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * ROWS + tl.arange(0, ROWS)
    row_ok = rows < n_rows
    rows = tl.where(row_ok, rows, 0)
    o = (rows // inner).to(tl.int64)
    i = (rows % inner).to(tl.int64)
    x_row = x_ptr + (o * sx_o + i * sx_i)[:, None]
    y_row = y_ptr + (o * sy_o + i * sy_i)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    if ONE_PASS:
        mask = row_ok[:, None] & (cols < N)
        x = tl.load(x_row + cols * sx_n, mask=mask, other=float("-inf")).to(tl.float32)
        m = tl.max(x, axis=1)
        # A row of -inf only has no max to subtract: shift by 0 and let 0/0 give NaN.
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        z = x - m_safe[:, None]
        e = tl.exp(z)
        s = tl.sum(e, axis=1)
        if LOG:
            y = z - tl.log(s)[:, None]
        else:
            y = e / s[:, None]
        if SAFE:
            y = tl.where((m == float("-inf"))[:, None], 0.0, y)
        tl.store(y_row + cols * sy_n, y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        m = tl.full([ROWS], float("-inf"), tl.float32)
        s = tl.zeros([ROWS], dtype=tl.float32)
        for start in range(0, N, BLOCK):
            c = start + cols
            mask = row_ok[:, None] & (c < N)
            x = tl.load(x_row + c * sx_n, mask=mask, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, axis=1))
            m_new_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            s = s * tl.exp(m - m_new_safe) + tl.sum(tl.exp(x - m_new_safe[:, None]), axis=1)
            m = m_new
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        log_s = tl.log(s)
        inv_s = 1.0 / s
        for start in range(0, N, BLOCK):
            c = start + cols
            mask = row_ok[:, None] & (c < N)
            z = tl.load(x_row + c * sx_n, mask=mask, other=float("-inf")).to(tl.float32) - m_safe[:, None]
            if LOG:
                y = z - log_s[:, None]
            else:
                y = tl.exp(z) * inv_s[:, None]
            if SAFE:
                y = tl.where((m == float("-inf"))[:, None], 0.0, y)
            tl.store(y_row + c * sy_n, y.to(y_ptr.dtype.element_ty), mask=mask)


_softmax_kernel = launch.recorded(_softmax_kernel)  # its calls are replayed (kernels/runtime/launch.py)


def launch_softmax(x3, y3, log: bool, safe: bool, config: Config) -> None:
    """y3 = softmax(x3) along dim 1 of the (outer, N, inner) views x3, y3 (any strides)."""
    outer, N, inner = x3.shape
    rows = config["ROWS"]
    grid = (triton.cdiv(outer * inner, rows),)
    _softmax_kernel[grid](
        x3, y3, outer * inner, N, inner,
        x3.stride(0), x3.stride(2), x3.stride(1), y3.stride(0), y3.stride(2), y3.stride(1),
        LOG=log, SAFE=safe, ONE_PASS=N <= config["BLOCK"],
        **config.kwargs,
    )


def _c(rows, block, warps, stages=1):
    return Config.make(ROWS=rows, BLOCK=block, num_warps=warps, num_stages=stages)


# Short rows pack several rows into one program (ROWS x BLOCK tiles of 1-4K elements);
# rows up to 16384 fit one block held in registers (16-32 fp32 values a thread); longer
# rows loop over BLOCK-sized chunks. num_stages stays 1: Triton's pipeliner leaves these
# loops alone (the PTX for sm_90 is the same for num_stages 1 to 4, with no cp.async), so
# staged copies would only be timed twice.
CONFIGS = (
    _c(16, 64, 4), _c(32, 64, 4), _c(8, 128, 4), _c(16, 128, 8), _c(4, 256, 4), _c(8, 256, 8),
    _c(2, 512, 4), _c(4, 512, 8), _c(1, 1024, 4), _c(1, 1024, 8), _c(2, 1024, 8),
    _c(4, 1024, 8), _c(1, 2048, 4), _c(1, 2048, 8), _c(1, 2048, 16), _c(1, 4096, 4),
    _c(1, 4096, 8), _c(1, 4096, 16), _c(2, 4096, 16), _c(1, 8192, 8), _c(1, 8192, 16),
    _c(1, 8192, 32), _c(1, 16384, 16), _c(1, 16384, 32),
)

# Served when a seat has no certificate: the first whose block holds the row (a row
# longer than every block takes the last, looped), among those the device admits.
DEFAULTS = (_c(16, 64, 4), _c(8, 128, 4), _c(4, 256, 4), _c(2, 512, 4), _c(1, 1024, 4),
            _c(1, 2048, 8), _c(1, 4096, 8), _c(1, 8192, 16), _c(1, 16384, 16))

OPS = {"aten._softmax": (False, False), "aten._safe_softmax": (False, True),
       "aten._log_softmax": (True, False)}


class SoftmaxSpec(KernelSpec):
    name = "softmax"
    ops = tuple(OPS)
    key = (KeyDim("N", "row"),)
    dtypes = tuple(TORCH_DTYPES)
    description = "row softmax / log-softmax / safe softmax over any dim, online for long rows"

    config_space = CONFIGS
    default_configs = DEFAULTS
    default_holds_row = True

    def smem_bytes(self, config, problem):
        # Cross-warp steps of the row max and the row sum: at most one fp32 per row and
        # warp each. Nothing else is staged in shared memory (the compiled kernels' shared
        # memory stays under this estimate for every config).
        return 2 * config["ROWS"] * config.num_warps * 4

    def source_parts(self):
        return (_softmax_kernel, launch_softmax)

    def example_rows(self, scale):
        from nbx_tune.kernels.rows import make_row

        rows = []
        h2f = {"half_to_float": "False"}
        for dt in self.dtypes:
            if scale == "small":
                # (3, 67, 5) on dim 1: a strided row; 4099 > 4096 loops under every block
                # but the two largest.
                shapes = [((3, 45), -1), ((2, 5, 1000), -1), ((3, 67, 5), 1), ((1, 4099), -1),
                          ((37,), 0)]
            else:
                shapes = [((8, 151936), -1), ((4096, 1000), -1), ((8, 32, 512, 512), -1),
                          ((3, 4097, 129), 1)]
            for shape, dim in shapes:
                rows.append(make_row("aten._softmax", [dt], [shape], {"dim": str(dim), **h2f}))
            rows.append(make_row("aten._log_softmax", [dt], [shapes[1][0]], {"dim": "-1", **h2f}))
            rows.append(make_row("aten._log_softmax", [dt], [shapes[2][0]], {"dim": "1", **h2f}))
            rows.append(make_row("aten._log_softmax", [dt], [shapes[3][0]], {"dim": str(shapes[3][1]), **h2f}))
            rows.append(make_row("aten._safe_softmax", [dt], [shapes[0][0]], {"dim": "-1"}))
            rows.append(make_row("aten._safe_softmax", [dt], [shapes[3][0]], {"dim": str(shapes[3][1])}))
            if dt != "float32":
                rows.append(make_row("aten._softmax", [dt], [shapes[1][0]],
                                     {"dim": "-1", "half_to_float": "True"}))
                rows.append(make_row("aten._safe_softmax", [dt], [shapes[2][0]],
                                     {"dim": "1", "dtype": "float32"}))
        return rows

    # -- trace rows -> problems
    def problem_from_row(self, row):
        op = row.base_op
        if op not in OPS:
            return NotServable(f"{row.op} is not a softmax op")
        log, safe = OPS[op]
        if len(row.shapes) != 1:
            return NotServable(f"{op} takes one tensor, the row has {len(row.shapes)}")
        dtype, shape = row.dtypes[0], row.shapes[0]
        if dtype not in TORCH_DTYPES:
            return NotServable(f"dtype {dtype} is not served (float16, bfloat16, float32)")
        try:
            dim = row.params.int("dim")
            half_to_float = row.params.bool("half_to_float", False)
            want = row.params.str("dtype")
        except ValueError as e:
            return NotServable(f"unreadable params: {e}")
        if dim is None:
            return NotServable(f"{op} row has no dim")
        rank = len(shape)
        if rank == 0:
            return NotServable("a 0-d tensor: no row to normalize")
        if not -rank <= dim < rank:
            return NotServable(f"dim {dim} is out of range for a rank-{rank} tensor")
        dim %= rank
        out = dtype
        if half_to_float:
            if dtype == "float32":
                return NotServable("half_to_float on a float32 input (torch refuses it)")
            out = "float32"
        if want is not None and want != dtype:
            if not (want == "float32" and dtype in ("float16", "bfloat16")):
                return NotServable(f"dtype={want} for a {dtype} input is not served "
                                   "(only float16/bfloat16 -> float32)")
            out = "float32"
        N = shape[dim]
        inner = numel(shape[dim + 1:])
        if numel(shape) == 0:
            return NotServable("an empty tensor: nothing to launch")
        if N * inner > INT32_MAX:
            return NotServable("a slice of 2^31 elements or more along the dim (the kernel "
                               "indexes inside a slice in int32)")
        flags = seat_flags(log=int(log), safe=int(safe), strided=int(inner > 1))
        # "M" (the row count) sorts first among the extras, so that of two problems with one
        # row length the census screens and times the one with more rows as the larger.
        extra = [("M", numel(shape) // N), ("dim", dim), ("shape", tuple(shape))]
        return Problem(self.name, (dtype, out), flags, (N,), tuple(sorted(extra)))

    def resized(self, problem, dims):
        # Rows of another length, as many rows, softmax over the last dim: the kernel sees
        # the row length and the row count only. A strided seat (dim not last) keeps its shapes.
        if dict(problem.flags)["strided"] == "1":
            return None
        M, N = problem.get("M"), dims[0]
        extra = dict(problem.extra, shape=(M, N), dim=1)
        return Problem(problem.kernel, problem.dtypes, problem.flags, (N,), tuple(sorted(extra.items())))

    # -- inputs, oracle, outputs, launch
    def input_shapes(self, problem):
        return {"x": (tuple(problem.get("shape")), problem.dtypes[0])}

    def make_inputs(self, problem, rng):
        shape, dim = tuple(problem.get("shape")), problem.get("dim")
        N = shape[dim]
        # Build with the softmax dim last, then move it into place.
        moved = shape[:dim] + shape[dim + 1:] + (N,)
        v = 3.0 * rng.standard_normal(moved)
        rows = v.reshape(-1, N)
        R = rows.shape[0]
        # Every 5th row has one entry that dominates the rest.
        dom = rows[0::5]
        dom[np.arange(dom.shape[0]), rng.integers(0, N, dom.shape[0])] += 25.0
        rows[0::5] = dom
        if N > 1:
            # Every 4th row (from the 3rd) is masked as attention masks do: about one entry
            # in 8 is -inf, never the first.
            masked = rows[2::4]
            hole = rng.random(masked.shape) < 0.125
            hole[:, 0] = False
            masked[hole] = -np.inf
            rows[2::4] = masked
        if dict(problem.flags).get("safe") == "1" and R > 1:
            rows[1::4] = -np.inf  # fully masked rows: 0 from safe softmax
        v = rows.reshape(moved)
        return {"x": (np.moveaxis(v, -1, dim), problem.dtypes[0])}

    def oracle(self, problem, inputs):
        dim = problem.get("dim")
        fl = dict(problem.flags)
        if fl["log"] == "1":
            return {"out": oracle.log_softmax(inputs["x"], dim)}
        if fl["safe"] == "1":
            return {"out": oracle.safe_softmax(inputs["x"], dim)}
        return {"out": oracle.softmax(inputs["x"], dim)}

    def output_specs(self, problem):
        return {"out": (tuple(problem.get("shape")), problem.dtypes[1])}

    def serve_ops(self):
        return {"aten._softmax": _serve_softmax, "aten._log_softmax": _serve_log_softmax}

    def launch(self, config, problem, inputs, outputs):
        fl = dict(problem.flags)
        x, y = inputs["x"], outputs["out"]
        dims3 = _view3(x.shape, problem.get("dim"))
        launch_softmax(x.view(dims3), y.view(dims3), fl["log"] == "1", fl["safe"] == "1", config)


def _view3(shape, dim: int) -> tuple[int, int, int]:
    outer = 1
    for d in shape[:dim]:
        outer *= d
    inner = 1
    for d in shape[dim + 1:]:
        inner *= d
    return (outer, shape[dim], inner)


SPEC = SoftmaxSpec()


# ----------------------------------------------------------------------------- public ops

REMEMBERED = launch.REMEMBERED
_DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}
_FLAGS = {(log, strided): seat_flags(log=int(log), safe=0, strided=int(strided))
          for log in (False, True) for strided in (False, True)}


def _run(x: torch.Tensor, dim: int, log: bool, dtype) -> torch.Tensor:
    # The direct launch (kernels/runtime/launch.py): a call whose key was seen replays its kernel.
    try:
        key = (SPEC, dim, log, dtype, x.shape, x.stride(), x.dtype, x.device, x.data_ptr() & 15)
    except AttributeError:
        raise KernelError("softmax: the input must be a tensor") from None
    hit = REMEMBERED.get(key)
    if hit is not None:
        return hit(x)
    return launch.remember(key, (x,), _softmax, x, dim, log, dtype)


def _softmax(x: torch.Tensor, dim: int, log: bool, dtype) -> torch.Tensor:
    name = _DTYPE_NAMES.get(x.dtype)
    if name is None:
        raise KernelError(f"softmax: dtype {x.dtype} is not served (float16, bfloat16, float32)")
    out_dtype = x.dtype if dtype is None else dtype
    if out_dtype != x.dtype and not (out_dtype == torch.float32 and name != "float32"):
        raise KernelError(f"softmax: dtype={out_dtype} for a {x.dtype} input is not served")
    rank = x.dim()
    if rank == 0:
        raise KernelError("softmax: a 0-d tensor has no dim to normalize")
    if not -rank <= dim < rank:
        raise KernelError(f"softmax: dim {dim} is out of range for a rank-{rank} tensor")
    dim %= rank
    x = dense(x)  # a copy by the copy kernel where it is not contiguous
    y = launch.empty(x.shape, out_dtype, x.device)
    if x.numel() == 0:
        return y
    dims3 = _view3(x.shape, dim)
    config = config_for(SPEC, (name, _DTYPE_NAMES[out_dtype]), _FLAGS[(log, dims3[2] > 1)],
                        (dims3[1],))
    launch_softmax(x.view(dims3), y.view(dims3), log, False, config)
    return y


def softmax(x: torch.Tensor, dim: int, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """torch.nn.functional.softmax(x, dim, dtype=dtype) with the certified config of its
    seat; dtype may be None or float32 for a float16/bfloat16 input."""
    return _run(x, dim, False, dtype)


def log_softmax(x: torch.Tensor, dim: int, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """torch.nn.functional.log_softmax(x, dim, dtype=dtype), likewise."""
    return _run(x, dim, True, dtype)


def _serve_softmax(x, dim, half_to_float):
    """aten._softmax's arguments, for serve()."""
    return _run(x, dim, False, torch.float32 if half_to_float else None)


def _serve_log_softmax(x, dim, half_to_float):
    return _run(x, dim, True, torch.float32 if half_to_float else None)
