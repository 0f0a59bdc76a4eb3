"""Normalizations: layer norm (aten.native_layer_norm), RMS norm (aten._fused_rms_norm,
aten.rms_norm) and group norm (aten.native_group_norm) in fp16, bf16 and fp32.

Layer and RMS norm share one row kernel: the input is viewed as (M, N) rows, N being the
product of the normalized shape, and each program owns ROWS rows. A row that fits one
BLOCK is normalized from registers (mean first, then the centered variance, both exact);
a longer row is read twice, the first time accumulating a Welford mean and M2 per lane,
merged across the lanes at the end (Chan's formula). Group norm gives each (sample,
group) pair, the C / group channels times H*W positions contiguous in memory, to one
program, the same way; its looped path writes channel by channel so that the weight and
bias are scalars. All arithmetic is in fp32.

What the ops return beside the output, and in which dtype (as torch's sources and CPU
kernels do):
- native_layer_norm: mean and rstd shaped like the input's leading dims with a 1 for each
  normalized dim. On CUDA they are float32 for every input dtype (layer_norm_cuda
  allocates them in the accumulate type); on the CPU they take the input's dtype. These
  kernels run where CUDA's would, so they return float32, as CUDA does.
- _fused_rms_norm: rstd, shaped the same way, float32 (the op math type) on every device.
  eps=None means float32's machine epsilon for float16, bfloat16 and float32 inputs alike
  (torch computes in float32 and takes that type's epsilon).
- native_group_norm: mean and rstd of shape (N, group) in the input's dtype, on every
  device.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nbx_tune.errors import KernelError
from nbx_tune.kernels.runtime import launch
from nbx_tune.kernels.runtime.certified import config_for
from nbx_tune.kernels.copy import dense
from nbx_tune.kernels.helpers import FLOATS, torch_dtypes
from nbx_tune.kernels.rows import format_shape, numel
from nbx_tune.kernels.spec import Config, KernelSpec, KeyDim, NotServable, Problem, one_dtype, seat_flags
from nbx_tune.oracles import norms as oracle

TORCH_DTYPES = torch_dtypes(*FLOATS)
INT32_MAX = 2**31 - 1
FP32_EPS = 1.1920928955078125e-07  # torch.finfo(torch.float32).eps: rms_norm's eps=None


@triton.jit
def _row_norm_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n_rows, N, eps,
    RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, ONE_PASS: tl.constexpr,
    ROWS: tl.constexpr, BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * ROWS + tl.arange(0, ROWS)
    row_ok = rows < n_rows
    base = tl.where(row_ok, rows, 0).to(tl.int64) * N
    x_row = x_ptr + base[:, None]
    y_row = y_ptr + base[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    if ONE_PASS:
        mask = row_ok[:, None] & (cols < N)
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        if RMS:
            rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)
            y = x * rstd[:, None]
        else:
            mean = tl.sum(x, axis=1) / N
            d = tl.where(mask, x - mean[:, None], 0.0)
            rstd = tl.rsqrt(tl.sum(d * d, axis=1) / N + eps)
            y = d * rstd[:, None]
        if HAS_W:
            y = y * tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
        if HAS_B:
            y = y + tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        if RMS:
            acc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
            for start in range(0, N, BLOCK):
                c = start + cols
                x = tl.load(x_row + c, mask=row_ok[:, None] & (c < N), other=0.0).to(tl.float32)
                acc += x * x
            rstd = tl.rsqrt(tl.sum(acc, axis=1) / N + eps)
            mean = tl.zeros([ROWS], dtype=tl.float32)
        else:
            m_v = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
            m2_v = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
            n_v = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
            for start in range(0, N, BLOCK):
                c = start + cols
                ok = row_ok[:, None] & (c < N)
                x = tl.load(x_row + c, mask=ok, other=0.0).to(tl.float32)
                n_v += ok.to(tl.float32)
                delta = x - m_v
                m_v += tl.where(ok, delta / tl.maximum(n_v, 1.0), 0.0)
                m2_v += tl.where(ok, delta * (x - m_v), 0.0)
            # Merge the lanes' partials at once: M2 = sum of lane M2s + sum n (mean - lane mean)^2.
            mean = tl.sum(n_v * m_v, axis=1) / N
            dm = m_v - mean[:, None]
            rstd = tl.rsqrt((tl.sum(m2_v, axis=1) + tl.sum(n_v * dm * dm, axis=1)) / N + eps)
        for start in range(0, N, BLOCK):
            c = start + cols
            mask = row_ok[:, None] & (c < N)
            x = tl.load(x_row + c, mask=mask, other=0.0).to(tl.float32)
            y = (x - mean[:, None]) * rstd[:, None]
            if HAS_W:
                y = y * tl.load(w_ptr + c, mask=c < N, other=0.0).to(tl.float32)
            if HAS_B:
                y = y + tl.load(b_ptr + c, mask=c < N, other=0.0).to(tl.float32)
            tl.store(y_row + c, y.to(y_ptr.dtype.element_ty), mask=mask)
    if not RMS:
        tl.store(mean_ptr + rows, mean.to(mean_ptr.dtype.element_ty), mask=row_ok)
    tl.store(rstd_ptr + rows, rstd.to(rstd_ptr.dtype.element_ty), mask=row_ok)


_row_norm_kernel = launch.recorded(_row_norm_kernel)  # its calls are replayed (kernels/runtime/launch.py)


@triton.jit
def _group_norm_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, G, D, HW, CPG, eps,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, ONE_PASS: tl.constexpr, BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)  # sample * G + group
    g = pid % G
    base = pid.to(tl.int64) * D
    offs = tl.arange(0, BLOCK)
    if ONE_PASS:
        mask = offs < D
        x = tl.load(x_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=0) / D
        d = tl.where(mask, x - mean, 0.0)
        rstd = tl.rsqrt(tl.sum(d * d, axis=0) / D + eps)
        y = d * rstd
        if HAS_W:
            y = y * tl.load(w_ptr + g * CPG + offs // HW, mask=mask, other=0.0).to(tl.float32)
        if HAS_B:
            y = y + tl.load(b_ptr + g * CPG + offs // HW, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + base + offs, y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        m_v = tl.zeros([BLOCK], dtype=tl.float32)
        m2_v = tl.zeros([BLOCK], dtype=tl.float32)
        n_v = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, D, BLOCK):
            o = start + offs
            ok = o < D
            x = tl.load(x_ptr + base + o, mask=ok, other=0.0).to(tl.float32)
            n_v += ok.to(tl.float32)
            delta = x - m_v
            m_v += tl.where(ok, delta / tl.maximum(n_v, 1.0), 0.0)
            m2_v += tl.where(ok, delta * (x - m_v), 0.0)
        mean = tl.sum(n_v * m_v, axis=0) / D
        dm = m_v - mean
        rstd = tl.rsqrt((tl.sum(m2_v, axis=0) + tl.sum(n_v * dm * dm, axis=0)) / D + eps)
        for ci in range(0, CPG):
            ch = g * CPG + ci
            a = rstd
            if HAS_W:
                a = rstd * tl.load(w_ptr + ch).to(tl.float32)
            shift = 0.0
            if HAS_B:
                shift = tl.load(b_ptr + ch).to(tl.float32)
            row = base + ci * HW
            for start in range(0, HW, BLOCK):
                o = start + offs
                ok = o < HW
                x = tl.load(x_ptr + row + o, mask=ok, other=0.0).to(tl.float32)
                tl.store(y_ptr + row + o, ((x - mean) * a + shift).to(y_ptr.dtype.element_ty), mask=ok)
    tl.store(mean_ptr + pid, mean.to(mean_ptr.dtype.element_ty))
    tl.store(rstd_ptr + pid, rstd.to(rstd_ptr.dtype.element_ty))


_group_norm_kernel = launch.recorded(_group_norm_kernel)  # its calls are replayed (kernels/runtime/launch.py)


def launch_row_norm(x, weight, bias, y, mean, rstd, n_rows: int, N: int, eps: float, rms: bool,
                    config: Config) -> None:
    """y = norm(x) over rows of N contiguous elements; mean (unused for RMS) and rstd hold
    n_rows values each; weight and bias are N contiguous values or None."""
    grid = (triton.cdiv(n_rows, config["ROWS"]),)
    _row_norm_kernel[grid](
        x, x if weight is None else weight, x if bias is None else bias, y,
        rstd if mean is None else mean, rstd, n_rows, N, eps,
        RMS=rms, HAS_W=weight is not None, HAS_B=bias is not None,
        ONE_PASS=N <= config["BLOCK"], **config.kwargs,
    )


def launch_group_norm(x, weight, bias, y, mean, rstd, n: int, C: int, HW: int, groups: int,
                      eps: float, config: Config) -> None:
    """y = group_norm(x) for contiguous x of n * C * HW elements; mean and rstd hold
    n * groups values; weight and bias are C values or None."""
    D = (C // groups) * HW
    _group_norm_kernel[(n * groups,)](
        x, x if weight is None else weight, x if bias is None else bias, y, mean, rstd, groups, D, HW, C // groups, eps,
        HAS_W=weight is not None, HAS_B=bias is not None, ONE_PASS=D <= config["BLOCK"],
        **config.kwargs,
    )


# ----------------------------------------------------------------------------- config spaces

def _r(rows, block, warps, stages=1):
    return Config.make(ROWS=rows, BLOCK=block, num_warps=warps, num_stages=stages)


def _g(block, warps, stages=1):
    return Config.make(BLOCK=block, num_warps=warps, num_stages=stages)


# Rows of layer / RMS norm: several short rows a program (hidden sizes of 64-1024), one
# row a program from 1024 on, up to 16384 held in registers; longer rows loop. num_stages
# stays 1: Triton's pipeliner leaves these loops alone (the PTX for sm_90 is the same for
# num_stages 1 to 4), so staged copies would be timed twice.
ROW_CONFIGS = (
    _r(16, 64, 4), _r(8, 128, 4), _r(4, 256, 4), _r(8, 256, 8), _r(4, 512, 4), _r(4, 512, 8),
    _r(2, 1024, 4), _r(4, 1024, 8), _r(1, 1024, 4), _r(2, 2048, 8), _r(1, 2048, 4),
    _r(1, 2048, 8), _r(1, 4096, 4), _r(1, 4096, 8), _r(1, 4096, 16), _r(1, 8192, 8),
    _r(1, 8192, 16), _r(1, 8192, 32), _r(1, 16384, 16), _r(1, 16384, 32),
)
ROW_DEFAULTS = (_r(16, 64, 4), _r(8, 128, 4), _r(4, 256, 4), _r(4, 512, 4), _r(2, 1024, 4),
                _r(1, 2048, 8), _r(1, 4096, 8), _r(1, 8192, 16), _r(1, 16384, 16))

# Groups of group norm: one group a program; groups of a few thousand elements fit a
# block, the larger ones (10 channels of 64x64: 40960) loop.
GROUP_CONFIGS = (
    _g(256, 4), _g(512, 4), _g(1024, 4), _g(1024, 8), _g(2048, 4), _g(2048, 8), _g(4096, 4),
    _g(4096, 8), _g(4096, 16), _g(8192, 8), _g(8192, 16), _g(8192, 32), _g(16384, 16),
    _g(16384, 32),
)
GROUP_DEFAULTS = (_g(256, 4), _g(512, 4), _g(1024, 4), _g(2048, 8), _g(4096, 8), _g(8192, 16),
                  _g(16384, 16))


def _rows_of(config: Config) -> int:
    return dict(config.meta).get("ROWS", 1)


def norm_smem(config: Config, problem: Problem, reductions: int) -> int:
    # Cross-warp steps of the row reductions: at most one fp32 per row, warp and reduced
    # value. Nothing else is staged in shared memory (the compiled kernels' shared memory
    # stays under this estimate for every config).
    return reductions * _rows_of(config) * config.num_warps * 4


def _optional_tensors(row, names) -> dict[str, bool] | NotServable:
    """Which optional tensors the row holds: a None one is written `name=None` and is
    absent from the dtypes and shapes columns."""
    present = {n: row.params.get(n) != "None" for n in names}
    want = 1 + sum(present.values())
    if len(row.shapes) != want:
        return NotServable(f"{row.base_op}: {want} tensors expected "
                           f"({', '.join(['input'] + [n for n in names if present[n]])}), "
                           f"the row has {len(row.shapes)}")
    return present


def _affine_inputs(rng, shape, present: dict, dt: str) -> dict:
    out = {}
    if present.get("weight"):
        out["weight"] = (1.0 + 0.5 * rng.standard_normal(shape), dt)
    if present.get("bias"):
        out["bias"] = (0.5 * rng.standard_normal(shape), dt)
    return out


def _affine_and_dtype(row, affine):
    """(which of the optional affine tensors the row has, its one dtype), or why not."""
    present = _optional_tensors(row, affine)
    if isinstance(present, NotServable):
        return present
    dt = one_dtype(row, TORCH_DTYPES)
    return dt if isinstance(dt, NotServable) else (present, dt)


# ----------------------------------------------------------------------------- row norms

class RowSpec(KernelSpec):
    """A kernel over rows of N elements in the row-norm config space (layer and RMS norm
    here, their residual-add forms in kernels/residual_norm.py): seats by the row length."""

    key = (KeyDim("N", "row"),)
    dtypes = tuple(TORCH_DTYPES)
    config_space = ROW_CONFIGS
    default_configs = ROW_DEFAULTS
    default_holds_row = True


class _RowNormSpec(RowSpec):
    """Layer norm and RMS norm: one row kernel and launcher, one config space."""

    def source_parts(self):
        return (_row_norm_kernel, launch_row_norm)

    affine: tuple[str, ...] = ()  # the optional affine tensors, in the trace row's order
    eps_default: float | None = None  # None: a row must give eps
    input_mean = 0.0  # of the seeded inputs
    rms = False  # RMS norm (outputs out, rstd) or layer norm (out, mean, rstd)
    # The example rows' cases at the "small" scale and at the "gpu" one: (input shape, normalized shape).
    small_cases = [((5, 37), (37,)), ((3, 7, 11), (7, 11)), ((3, 1100), (1100,))]
    gpu_cases: list = []

    def smem_bytes(self, config, problem):
        return norm_smem(config, problem, 1 if self.rms else 3)

    def example_rows(self, scale):
        cases = self.small_cases if scale == "small" else self.gpu_cases
        return [row for dt in self.dtypes for i, (shape, ns) in enumerate(cases)
                for row in self.case_rows(dt, i, shape, ns)]

    def case_rows(self, dt: str, i: int, shape: tuple, ns: tuple) -> list:
        """The example rows of case i (the first and second add the optional forms)."""
        raise NotImplementedError

    def problem_from_row(self, row):
        """Checks that the normalized shape is the input's trailing dims and the affine
        tensors are shaped like it."""
        got = _affine_and_dtype(row, self.affine)
        if isinstance(got, NotServable):
            return got
        present, dt = got
        try:
            ns = row.params.ints("normalized_shape")
            eps = row.params.float("eps", self.eps_default)
        except ValueError as e:
            return NotServable(f"unreadable params: {e}")
        if ns is None or eps is None:
            return NotServable(f"{row.base_op} row without normalized_shape"
                               + (" or eps" if self.eps_default is None else ""))
        shape = row.shapes[0]
        k = len(ns)
        if k == 0 or k > len(shape) or tuple(shape[len(shape) - k:]) != tuple(ns):
            return NotServable(f"normalized_shape {format_shape(ns)} is not the trailing dims of {format_shape(shape)}")
        for t, s in zip((n for n in self.affine if present[n]), row.shapes[1:]):
            if tuple(s) != tuple(ns):
                return NotServable(f"{t} {format_shape(s)} is not shaped {format_shape(ns)}")
        N = numel(ns)
        if numel(shape) == 0:
            return NotServable("an empty tensor: nothing to launch")
        if N > INT32_MAX:
            return NotServable("a normalized row of 2^31 elements or more")
        # "M" (the row count) sorts first among the extras: of two problems with one row
        # length, the census screens and times the one with more rows as the larger.
        extra = [("M", numel(shape) // N), ("eps", eps), ("norm_ndim", k), ("shape", tuple(shape))]
        return Problem(self.name, (dt,), seat_flags(**{n: int(present[n]) for n in self.affine}),
                       (N,), tuple(sorted(extra)))

    def resized(self, problem, dims):
        # Rows of another length, as many rows, normalized over the last dim (the weights
        # follow it): the kernel sees the row length and the row count only.
        if problem.get("norm_ndim") != 1:
            return None
        M, N = problem.get("M"), dims[0]
        extra = dict(problem.extra, shape=(M, N))
        return Problem(problem.kernel, problem.dtypes, problem.flags, (N,), tuple(sorted(extra.items())))

    def input_shapes(self, problem):
        shape, k, dt = tuple(problem.get("shape")), problem.get("norm_ndim"), problem.dtypes[0]
        fl = dict(problem.flags)
        out = {"input": (shape, dt)}
        for n in self.affine:
            if fl[n] == "1":
                out[n] = (shape[len(shape) - k:], dt)
        return out

    def make_inputs(self, problem, rng):
        shape, k, dt = tuple(problem.get("shape")), problem.get("norm_ndim"), problem.dtypes[0]
        out = {"input": (self.input_mean + 2.0 * rng.standard_normal(shape), dt)}
        out.update(_affine_inputs(rng, shape[len(shape) - k:], {n: v == "1" for n, v in problem.flags}, dt))
        return out

    def output_specs(self, problem):
        shape, k = tuple(problem.get("shape")), problem.get("norm_ndim")
        stat = shape[:len(shape) - k] + (1,) * k
        return {"out": (shape, problem.dtypes[0]),
                **{s: (stat, "float32") for s in (("rstd",) if self.rms else ("mean", "rstd"))}}

    def launch(self, config, problem, inputs, outputs):
        N = problem.dims[0]
        x = inputs["input"]
        launch_row_norm(x, inputs.get("weight"), inputs.get("bias"), outputs["out"], outputs.get("mean"),
                        outputs["rstd"], x.numel() // N, N, problem.get("eps"), self.rms, config)


# ----------------------------------------------------------------------------- layer norm

class LayerNormSpec(_RowNormSpec):
    name = "layer_norm"
    ops = ("aten.native_layer_norm",)
    description = "layer norm over the trailing dims, returning (out, mean, rstd)"
    affine = ("weight", "bias")
    input_mean = 1.5
    gpu_cases = [((2048, 4096), (4096,)), ((512, 768), (768,)), ((4, 511, 1024), (1024,)), ((3, 20000), (20000,))]

    def case_rows(self, dt, i, shape, ns):
        from nbx_tune.kernels.rows import make_row

        p = {"normalized_shape": format_shape(ns), "eps": "1e-05"}
        rows = [make_row("aten.native_layer_norm", [dt] * 3, [shape, ns, ns], p)]
        if i == 0:
            rows.append(make_row("aten.native_layer_norm", [dt] * 2, [shape, ns],
                                 {**p, "bias": "None", "eps": "1e-06"}))
        if i == 1:
            rows.append(make_row("aten.native_layer_norm", [dt], [shape], {**p, "weight": "None", "bias": "None"}))
        return rows

    def oracle(self, problem, inputs):
        y, mean, rstd = oracle.layer_norm(inputs["input"], problem.get("norm_ndim"), inputs.get("weight"),
                                          inputs.get("bias"), problem.get("eps"))
        return {"out": y, "mean": mean, "rstd": rstd}

    def serve_ops(self):
        return {"aten.native_layer_norm": _serve_native_layer_norm}


# ----------------------------------------------------------------------------- RMS norm

class RMSNormSpec(_RowNormSpec):
    name = "rms_norm"
    ops = ("aten._fused_rms_norm", "aten.rms_norm")
    description = "RMS norm over the trailing dims, returning (out, rstd)"
    affine = ("weight",)
    eps_default = FP32_EPS
    input_mean = 0.3
    rms = True
    gpu_cases = [((512, 4096), (4096,)), ((7, 4096), (4096,)), ((3, 17, 5120), (5120,)), ((2, 20000), (20000,))]

    def case_rows(self, dt, i, shape, ns):
        from nbx_tune.kernels.rows import make_row

        p = {"normalized_shape": format_shape(ns), "eps": "None" if i % 2 else "1e-06"}
        rows = [make_row("aten._fused_rms_norm", [dt] * 2, [shape, ns], p)]
        if i == 0:  # the composite op too, once a dtype
            rows.append(make_row("aten.rms_norm", [dt] * 2, [shape, ns], {"normalized_shape": format_shape(ns)}))
        if i == 1:
            rows.append(make_row("aten._fused_rms_norm", [dt], [shape], {**p, "weight": "None"}))
        return rows

    def oracle(self, problem, inputs):
        y, rstd = oracle.rms_norm(inputs["input"], problem.get("norm_ndim"), inputs.get("weight"),
                                  problem.get("eps"))
        return {"out": y, "rstd": rstd}

    def serve_ops(self):
        return {"aten.rms_norm": rms_norm}


# ----------------------------------------------------------------------------- group norm

class GroupNormSpec(KernelSpec):
    name = "group_norm"
    ops = ("aten.native_group_norm",)
    key = (KeyDim("D", "row"),)  # elements of one group: C / group * H * W
    dtypes = tuple(TORCH_DTYPES)
    description = "group norm over (channels of a group) x (spatial), returning (out, mean, rstd)"

    config_space = GROUP_CONFIGS
    default_configs = GROUP_DEFAULTS
    default_holds_row = True

    def smem_bytes(self, config, problem):
        return norm_smem(config, problem, 3)

    def source_parts(self):
        return (_group_norm_kernel, launch_group_norm)

    def example_rows(self, scale):
        from nbx_tune.kernels.rows import make_row

        if scale == "small":
            cases = [((2, 6, 5, 7), 3), ((3, 4, 33), 2), ((2, 4, 30, 37), 2)]
        else:
            cases = [((8, 320, 64, 64), 32), ((2, 512, 33, 33), 32), ((4, 96, 31, 29), 3)]
        rows = []
        for dt in self.dtypes:
            for i, (shape, groups) in enumerate(cases):
                n, c = shape[:2]
                p = {"N": str(n), "C": str(c), "HxW": str(numel(shape[2:])), "group": str(groups),
                     "eps": "1e-05"}
                rows.append(make_row("aten.native_group_norm", [dt] * 3, [shape, (c,), (c,)], p))
                if i == 0:
                    rows.append(make_row("aten.native_group_norm", [dt], [shape],
                                         {"weight": "None", "bias": "None", **p, "eps": "1e-06"}))
                    rows.append(make_row("aten.native_group_norm", [dt] * 2, [shape, (c,)],
                                         {"bias": "None", **p}))
        return rows

    def problem_from_row(self, row):
        got = _affine_and_dtype(row, ("weight", "bias"))
        if isinstance(got, NotServable):
            return got
        present, dt = got
        try:
            n, c, hw, groups = (row.params.int(k) for k in ("N", "C", "HxW", "group"))
            eps = row.params.float("eps")
        except ValueError as e:
            return NotServable(f"unreadable params: {e}")
        if None in (n, c, hw, groups, eps):
            return NotServable("native_group_norm row without N, C, HxW, group or eps")
        shape = row.shapes[0]
        if len(shape) < 2 or shape[0] != n or shape[1] != c or numel(shape[2:]) != hw:
            return NotServable(f"input {format_shape(shape)} does not match N={n}, C={c}, HxW={hw}")
        if groups <= 0 or c % groups:
            return NotServable(f"C={c} does not split into {groups} groups")
        for t, s in zip((k for k in ("weight", "bias") if present[k]), row.shapes[1:]):
            if tuple(s) != (c,):
                return NotServable(f"{t} {format_shape(s)} is not shaped {c}")
        if numel(shape) == 0:
            return NotServable("an empty tensor: nothing to launch")
        D = (c // groups) * hw
        if D > INT32_MAX:
            return NotServable("a group of 2^31 elements or more")
        extra = [("M", n * groups), ("eps", eps), ("groups", groups), ("shape", tuple(shape))]
        return Problem(self.name, (dt,), seat_flags(weight=int(present["weight"]), bias=int(present["bias"])),
                       (D,), tuple(sorted(extra)))

    def input_shapes(self, problem):
        shape, dt = tuple(problem.get("shape")), problem.dtypes[0]
        fl = dict(problem.flags)
        out = {"input": (shape, dt)}
        for k in ("weight", "bias"):
            if fl[k] == "1":
                out[k] = ((shape[1],), dt)
        return out

    def make_inputs(self, problem, rng):
        shape, dt = tuple(problem.get("shape")), problem.dtypes[0]
        fl = dict(problem.flags)
        # Channels get their own offsets, so a group's statistics differ from a channel's.
        offset = rng.standard_normal((1, shape[1]) + (1,) * (len(shape) - 2))
        out = {"input": (1.0 + offset + 2.0 * rng.standard_normal(shape), dt)}
        out.update(_affine_inputs(rng, (shape[1],), {k: fl[k] == "1" for k in fl}, dt))
        return out

    def oracle(self, problem, inputs):
        y, mean, rstd = oracle.group_norm(inputs["input"], problem.get("groups"), inputs.get("weight"),
                                          inputs.get("bias"), problem.get("eps"))
        return {"out": y, "mean": mean, "rstd": rstd}

    def output_specs(self, problem):
        shape, dt = tuple(problem.get("shape")), problem.dtypes[0]
        stat = (shape[0], problem.get("groups"))
        return {"out": (shape, dt), "mean": (stat, dt), "rstd": (stat, dt)}

    def serve_ops(self):
        return {"aten.native_group_norm": _serve_native_group_norm}

    def launch(self, config, problem, inputs, outputs):
        shape = tuple(problem.get("shape"))
        launch_group_norm(inputs["input"], inputs.get("weight"), inputs.get("bias"), outputs["out"],
                          outputs["mean"], outputs["rstd"], shape[0], shape[1], numel(shape[2:]),
                          problem.get("groups"), problem.get("eps"), config)


LAYER_NORM = LayerNormSpec()
RMS_NORM = RMSNormSpec()
GROUP_NORM = GroupNormSpec()
SPECS = (LAYER_NORM, RMS_NORM, GROUP_NORM)


# ----------------------------------------------------------------------------- public ops

REMEMBERED, tensor_key = launch.REMEMBERED, launch.tensor_key
_DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}
_WB_FLAGS = {(w, b): seat_flags(weight=int(w), bias=int(b)) for w in (False, True) for b in (False, True)}
_W_FLAGS = {w: seat_flags(weight=int(w)) for w in (False, True)}


def _dtype_of(op: str, x, *others) -> tuple[str]:
    name = _DTYPE_NAMES.get(x.dtype)
    if name is None:
        raise KernelError(f"{op}: dtype {x.dtype} is not served (float16, bfloat16, float32)")
    for t in others:
        if t is not None and t.dtype != x.dtype:
            raise KernelError(f"{op}: mixed dtypes {x.dtype} and {t.dtype}")
    return (name,)


def _contig(t):  # a copy by the copy kernel where it is not contiguous
    return t if t is None else dense(t)


def _trailing(op: str, x, normalized_shape) -> tuple[int, int]:
    ns = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    k = len(ns)
    if k == 0 or k > x.dim() or tuple(x.shape[x.dim() - k:]) != ns:
        raise KernelError(f"{op}: normalized_shape {ns} is not the trailing dims of {tuple(x.shape)}")
    N = 1
    for d in ns:
        N *= d
    return N, ns


def _check_affine(op: str, t, shape) -> None:
    if t is not None and tuple(t.shape) != tuple(shape):
        raise KernelError(f"{op}: weight/bias {tuple(t.shape)} is not shaped {tuple(shape)}")


def _direct(spec, call, x, arg, weight, bias, eps):
    # The direct launch (kernels/runtime/launch.py): a call whose key was seen replays its kernel.
    # A list argument (from an aten op) is keyed as a tuple.
    try:
        key = (spec, arg if type(arg) is not list else tuple(arg), eps, x.shape, x.stride(), x.dtype, x.device,
               x.data_ptr() & 15, None if weight is None else tensor_key(weight),
               None if bias is None else tensor_key(bias))
        hit = REMEMBERED.get(key)
    except (AttributeError, TypeError):  # not tensors, or unhashable: the checks say so
        return call(x, arg, weight, bias, eps)
    if hit is not None:
        return hit(x, weight, bias)
    return launch.remember(key, (x, weight, bias), call, x, arg, weight, bias, eps)


def layer_norm(x: torch.Tensor, normalized_shape, weight: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:
    """torch.nn.functional.layer_norm with the certified config of its seat."""
    return _direct(LAYER_NORM, _layer_norm, x, normalized_shape, weight, bias, eps)


def _layer_norm_args(x, normalized_shape, weight, bias):
    """layer_norm's checks, public op's and serve()'s: (dtypes, N, normalized shape) and x,
    weight and bias contiguous."""
    dtypes = _dtype_of("layer_norm", x, weight, bias)
    N, ns = _trailing("layer_norm", x, normalized_shape)
    if N == 1:  # x - mean is 0 there, and the kernel's 0 * w + b keeps a sign torch's does not
        raise KernelError("layer_norm over one element: torch's signed zero")
    _check_affine("layer_norm", weight, ns)
    _check_affine("layer_norm", bias, ns)
    return dtypes, N, ns, _contig(x), _contig(weight), _contig(bias)


def _layer_norm(x, normalized_shape, weight, bias, eps):
    dtypes, N, _ns, x, weight, bias = _layer_norm_args(x, normalized_shape, weight, bias)
    y = launch.empty(x.shape, x.dtype, x.device)
    M = x.numel() // N if N else 0
    if M == 0 or N == 0:
        return y
    stats = launch.scratch((2, M), torch.float32, x.device)  # not returned: nothing reads them
    config = config_for(LAYER_NORM, dtypes, _WB_FLAGS[(weight is not None, bias is not None)], (N,))
    launch_row_norm(x, weight, bias, y, stats[0], stats[1], M, N, eps, False, config)
    return y


def rms_norm(x: torch.Tensor, normalized_shape, weight: torch.Tensor | None = None,
             eps: float | None = None) -> torch.Tensor:
    """torch.nn.functional.rms_norm; eps=None is float32's machine epsilon, as in torch."""
    return _direct(RMS_NORM, _rms_norm, x, normalized_shape, weight, None, eps)


def _rms_norm(x, normalized_shape, weight, _bias, eps):
    dtypes = _dtype_of("rms_norm", x, weight)
    N, ns = _trailing("rms_norm", x, normalized_shape)
    _check_affine("rms_norm", weight, ns)
    x, weight = _contig(x), _contig(weight)
    y = launch.empty(x.shape, x.dtype, x.device)
    M = x.numel() // N if N else 0
    if M == 0 or N == 0:
        return y
    rstd = launch.scratch((M,), torch.float32, x.device)
    config = config_for(RMS_NORM, dtypes, _W_FLAGS[weight is not None], (N,))
    launch_row_norm(x, weight, None, y, None, rstd, M, N, FP32_EPS if eps is None else eps, True, config)
    return y


def group_norm(x: torch.Tensor, num_groups: int, weight: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:
    """torch.nn.functional.group_norm for x of shape (N, C, *spatial)."""
    return _direct(GROUP_NORM, _group_norm, x, num_groups, weight, bias, eps)


def _group_norm(x, num_groups, weight, bias, eps):
    dtypes = _dtype_of("group_norm", x, weight, bias)
    if x.dim() < 2:
        raise KernelError(f"group_norm: expected (N, C, ...), got {tuple(x.shape)}")
    n, c = x.shape[:2]
    if num_groups <= 0 or c % num_groups:
        raise KernelError(f"group_norm: {c} channels do not split into {num_groups} groups")
    _check_affine("group_norm", weight, (c,))
    _check_affine("group_norm", bias, (c,))
    x, weight, bias = _contig(x), _contig(weight), _contig(bias)
    y = launch.empty(x.shape, x.dtype, x.device)
    if x.numel() == 0:
        return y
    hw = x.numel() // (n * c)
    stats = launch.scratch((2, n * num_groups), x.dtype, x.device)
    config = config_for(GROUP_NORM, dtypes, _WB_FLAGS[(weight is not None, bias is not None)],
                        ((c // num_groups) * hw,))
    launch_group_norm(x, weight, bias, y, stats[0], stats[1], n, c, hw, num_groups, eps, config)
    return y


# Keys of the native ops' replays: their results (out, mean, rstd) are not the public ops',
# so a key of theirs must never be one of layer_norm's or group_norm's (issue 60's lesson).
_NATIVE_LAYER_NORM, _NATIVE_GROUP_NORM = "aten.native_layer_norm", "aten.native_group_norm"


def _serve_native_layer_norm(x, normalized_shape, weight, bias, eps):
    """aten.native_layer_norm for serve(): (out, mean, rstd), the statistics in float32
    shaped as torch's (x's leading dims, then ones). Replayed like the public op (`_direct`)."""
    return _direct(_NATIVE_LAYER_NORM, _native_layer_norm, x, normalized_shape, weight, bias, eps)


def _native_layer_norm(x, normalized_shape, weight, bias, eps):
    dtypes, N, ns, x, weight, bias = _layer_norm_args(x, normalized_shape, weight, bias)
    y = launch.empty(x.shape, x.dtype, x.device)
    M = x.numel() // N if N else 0
    stat_shape = (*x.shape[:x.dim() - len(ns)], *(1,) * len(ns))
    # two allocations, not one buffer's rows: a replay returns an allocation or a view of all of it
    mean, rstd = (launch.empty((M,), torch.float32, x.device) for _ in range(2))
    if M and N:
        config = config_for(LAYER_NORM, dtypes, _WB_FLAGS[(weight is not None, bias is not None)], (N,))
        launch_row_norm(x, weight, bias, y, mean, rstd, M, N, eps, False, config)
    return y, mean.view(stat_shape), rstd.view(stat_shape)


def _serve_native_group_norm(x, weight, bias, N, C, HxW, group, eps):
    """aten.native_group_norm for serve(): (out, mean, rstd), the statistics (N, group).
    Replayed like the public op, every size argument in the key (HxW is not checked against x)."""
    return _direct(_NATIVE_GROUP_NORM, _native_group_norm, x, (N, C, HxW, group), weight, bias, eps)


def _native_group_norm(x, sizes, weight, bias, eps):
    N, C, HxW, group = sizes
    dtypes = _dtype_of("group_norm", x, weight, bias)
    if x.dim() < 2 or x.shape[0] != N or x.shape[1] != C or group <= 0 or C % group:
        raise KernelError(f"group_norm: {tuple(x.shape)} is not ({N}, {C}, ...) in {group} groups")
    _check_affine("group_norm", weight, (C,))
    _check_affine("group_norm", bias, (C,))
    x, weight, bias = _contig(x), _contig(weight), _contig(bias)
    y = launch.empty(x.shape, x.dtype, x.device)
    mean, rstd = (launch.empty((N, group), x.dtype, x.device) for _ in range(2))
    if x.numel():
        config = config_for(GROUP_NORM, dtypes, _WB_FLAGS[(weight is not None, bias is not None)],
                            ((C // group) * HxW,))
        launch_group_norm(x, weight, bias, y, mean, rstd, N, C, HxW, group, eps, config)
    return y, mean, rstd
