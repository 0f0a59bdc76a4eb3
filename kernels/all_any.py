"""Truth reductions: `aten.all` and `aten.any` (full, over one dim, over a list of dims) of
fp16 / bf16 / fp32 / int32 / int64 / bool tensors, to bool, as torch computes them: an
element is true where it is not zero (NaN is true, -0.0 false); all() of nothing is true,
any() of nothing false. An encoder checks its padding mask with one (`mask.all()`).

The plan is the reductions' (kernels/reduce.py: O outputs by R reduced elements through at
most three kept and three reduced dim groups, by strides); the kernel is its own: a
[BLOCK_O, BLOCK_R] tile of 0/1 folded by min (all) or max (any). With SPLIT > 1 the R range
is cut over programs whose bool partials the same kernel reduces again. Exact.

Launch key, flags and configs as reduce's (O `default`, R `row`; `inner`), with `fn=all|any`.
`all.dims` with an empty list reduces nothing (torch: a cast to bool); an empty input or a
uint8 one (torch answers in uint8) goes to torch.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from nbx_tune.errors import KernelError
from nbx_tune.kernels import reduce as _reduce
from nbx_tune.kernels.copy import strided_offsets
from nbx_tune.kernels.helpers import FLOATS, contiguous_strides, torch_dtypes
from nbx_tune.kernels.rows import numel
from nbx_tune.kernels.runtime import launch
from nbx_tune.kernels.runtime.certified import config_for
from nbx_tune.kernels.spec import KernelSpec, KeyDim, NotServable, Problem, seat_flags

TORCH_DTYPES = torch_dtypes(*FLOATS, "int32", "int64", "bool")
_NAMES = {v: k for k, v in TORCH_DTYPES.items()}
_OPS = {f"aten.{fn}{o}": fn for fn in ("all", "any") for o in ("", ".dim", ".dims")}


@triton.jit
def _all_any_kernel(x_ptr, out_ptr, O, R, r_chunk, out_stride,
                    KD1, KD2, KS0, KS1, KS2, RD1, RD2, RS0, RS1, RS2,
                    ANY: tl.constexpr, K_NDIM: tl.constexpr, R_NDIM: tl.constexpr, INT64: tl.constexpr,
                    BLOCK_O: tl.constexpr, BLOCK_R: tl.constexpr):
    """out[o * out_stride + s] = all/any of x != 0 over chunk s of output o's elements."""
    pid_o = tl.program_id(0)
    pid_s = tl.program_id(1)
    o = pid_o * BLOCK_O + tl.arange(0, BLOCK_O)
    if INT64:
        o = o.to(tl.int64)
        r_begin = pid_s.to(tl.int64) * r_chunk
    else:
        r_begin = pid_s * r_chunk
    o_mask = o < O
    k_off = strided_offsets(o, K_NDIM, KD1, KD2, 1, KS0, KS1, KS2, 0)
    r_end = tl.minimum(r_begin + r_chunk, R)
    neutral = 0 if ANY else 1  # what a masked-off element counts as
    acc = tl.full([BLOCK_O, BLOCK_R], neutral, tl.int32)
    for r0 in range(r_begin, r_end, BLOCK_R):
        r = r0 + tl.arange(0, BLOCK_R)
        r_off = strided_offsets(r, R_NDIM, RD1, RD2, 1, RS0, RS1, RS2, 0)
        m = o_mask[:, None] & (r < r_end)[None, :]
        x = tl.load(x_ptr + (k_off[:, None] + r_off[None, :]), mask=m, other=0)
        t = tl.where(m, (x != 0).to(tl.int32), neutral)
        if ANY:
            acc = tl.maximum(acc, t)
        else:
            acc = tl.minimum(acc, t)
    if ANY:
        res = tl.max(acc, 1)
    else:
        res = tl.min(acc, 1)
    tl.store(out_ptr + (o * out_stride + pid_s), res.to(out_ptr.dtype.element_ty), mask=o_mask)


_all_any_kernel = launch.recorded(_all_any_kernel)


def _pass(x, out, O, R, chunk, splits, out_stride, kg, rg, any_: bool, int64: bool, meta, warps):
    _all_any_kernel[(triton.cdiv(O, meta["BLOCK_O"]), splits)](
        x, out, O, R, chunk, out_stride, *_reduce._levels3(kg), *_reduce._levels3(rg),
        ANY=any_, K_NDIM=len(kg), R_NDIM=len(rg), INT64=int64,
        BLOCK_O=meta["BLOCK_O"], BLOCK_R=meta["BLOCK_R"], num_warps=warps, num_stages=1)


def launch_all_any(x, out, plan, fn: str, config) -> None:
    """out (bool, contiguous, O elements) = fn ("all" / "any") over the plan's R elements
    of each output (a reduce_plan of x)."""
    O, R, _, kg, rg = plan
    extent = 1
    for d, s in (*kg, *rg):
        extent += (d - 1) * abs(s)
    int64 = max(extent, O * R) > _reduce.INDEX_LIMIT
    any_ = fn == "any"
    splits, chunk = _reduce._split_of(R, config["BLOCK_R"], config["SPLIT"])
    if splits == 1:
        _pass(x, out, O, R, R, 1, 1, kg, rg, any_, int64, dict(config.meta), config.num_warps)
        return
    part = launch.empty((O, splits), torch.bool, out.device)
    _pass(x, part, O, R, chunk, splits, splits, kg, rg, any_, int64, dict(config.meta), config.num_warps)
    block_r = triton.next_power_of_2(splits)  # the partials: O rows of `splits`, one pass
    meta2 = {"BLOCK_O": max(1, min(64, 2048 // block_r)), "BLOCK_R": block_r}
    _pass(part, out, O, splits, splits, 1, 1, ((O, splits),), ((splits, 1),), any_, O * splits > _reduce.INDEX_LIMIT,
          meta2, 4)


def dims_of(dim, rank: int) -> tuple[int, ...] | str:
    """The reduced dims of a call (non-negative, sorted): every dim for None, none for an
    empty list (`all.dims(x, [])`), else the given ones; or an error text."""
    if dim is None:
        return tuple(range(rank))
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    if not dims:
        return ()
    return _reduce.normalize_dims(dims, rank)


def _row_dims(row, op: str):
    """The `dim` argument a trace row of `op` gives (dims_of's)."""
    if op.endswith(".dim"):
        return row.params.int("dim")
    if op.endswith(".dims"):
        return row.params.ints("dim", None)
    return None


class AllAnySpec(KernelSpec):
    name = "all_any"
    ops = tuple(_OPS)
    key = _reduce.SPEC.key
    dtypes = tuple(TORCH_DTYPES)
    exact = True
    description = "all / any (x != 0) over any dims, to bool: rows of R reduced for O outputs"

    config_space = _reduce.CONFIGS
    default_configs = _reduce.DEFAULTS

    def default_config(self, profile, problem):
        return _reduce.SPEC.default_config(profile, problem)  # the same plan, flags and configs

    def smem_bytes(self, config, problem):
        return config["BLOCK_O"] * (config.num_warps + 1) * 4

    def source_parts(self):
        return (_all_any_kernel, strided_offsets, _pass, launch_all_any, _reduce._groups, _reduce.reduce_plan,
                _reduce._levels3, _reduce._split_of)

    def problem_from_row(self, row):
        op = row.op.removesuffix(".default")
        fn = _OPS.get(op)
        if fn is None:
            return NotServable(f"{op}: overload not served")
        if len(row.shapes) != 1:
            return NotServable(f"{op} takes one tensor, the row has {len(row.shapes)}")
        unknown = set(row.params) - ({"dim", "keepdim"} if op != f"aten.{fn}" else set())
        if unknown:
            return NotServable(f"{op}: unsupported params {', '.join(sorted(unknown))}")
        shape, in_dt = tuple(row.shapes[0]), row.dtypes[0]
        if in_dt not in TORCH_DTYPES:
            return NotServable(f"{fn}: dtype {in_dt} is not served ({', '.join(TORCH_DTYPES)})")
        try:
            red = dims_of(_row_dims(row, op), len(shape))
            keepdim = bool(row.params.bool("keepdim", False))
        except ValueError as e:
            return NotServable(f"bad dim/keepdim: {e}")
        if isinstance(red, str):
            return NotServable(red)
        if not numel(shape):
            return NotServable(f"{fn}: an empty input: nothing to launch")
        try:
            O, R, inner, _, _ = _reduce.reduce_plan(shape, contiguous_strides(shape), red)
        except ValueError as e:
            return NotServable(str(e))
        return Problem(self.name, ("bool", in_dt), seat_flags(fn=fn, inner=int(inner)), (O, R),
                       (("dims", red), ("keepdim", keepdim), ("shape", shape)))

    def input_shapes(self, problem):
        return {"x": (tuple(problem.get("shape")), problem.dtypes[1])}

    def make_inputs(self, problem, rng):
        shape, in_dt = tuple(problem.get("shape")), problem.dtypes[1]
        _, R = problem.dims
        # Zeros and non-zeros both common, and whole rows of one kind: both answers occur.
        p_zero = 1.0 - 0.5 ** (1.0 / max(R, 1))  # a row of R all non-zero with probability 1/2
        if dict(problem.flags)["fn"] == "any":
            p_zero = 1.0 - p_zero  # a row of R all zero with probability 1/2
        zero = rng.random(shape) < p_zero
        if in_dt == "bool":
            x = ~zero
        elif in_dt in ("int32", "int64"):
            x = np.where(zero, 0, rng.integers(1, 1000, shape) * rng.choice([-1, 1], shape))
        else:  # NaN and -0.0 among the values: NaN is true, -0.0 false
            v = rng.standard_normal(shape)
            v[rng.random(shape) < 0.05] = np.nan
            x = np.where(zero, np.where(rng.random(shape) < 0.5, -0.0, 0.0), v)
        return {"x": (x, in_dt)}

    def oracle(self, problem, inputs):
        x = np.asarray(inputs["x"]).reshape(tuple(problem.get("shape"))) != 0
        dims = tuple(problem.get("dims"))
        pick = np.any if dict(problem.flags)["fn"] == "any" else np.all
        y = pick(x, axis=dims, keepdims=problem.get("keepdim")) if dims else x
        return {"out": np.asarray(y).reshape(self._out_shape(problem))}

    def _out_shape(self, problem):
        return _reduce.out_shape_of(tuple(problem.get("shape")), tuple(problem.get("dims")), problem.get("keepdim"))

    def output_specs(self, problem):
        return {"out": (self._out_shape(problem), "bool")}

    def launch(self, config, problem, inputs, outputs):
        x = inputs["x"].reshape(tuple(problem.get("shape")))
        plan = _reduce.reduce_plan(tuple(x.shape), x.stride(), tuple(problem.get("dims")))
        launch_all_any(x, outputs["out"], plan, dict(problem.flags)["fn"], config)

    def serve_ops(self):
        return {op: (all if fn == "all" else any) for op, fn in _OPS.items()}

    def example_rows(self, scale):
        from nbx_tune.kernels.rows import make_row

        if scale == "small":
            cases = (("", (2, 7), {}), (".dim", (37, 45), {"dim": "-1"}), (".dim", (300, 7), {"dim": "0"}),
                     (".dims", (3, 5, 7), {"dim": "0x2", "keepdim": "True"}), (".dims", (5000,), {}),
                     (".dims", (4, 3), {"dim": "()"}), ("", (), {}))
            dts = ("bool", "float32", "int64", "float16", "int32")
        else:
            cases = (("", (64, 4096), {}), (".dim", (512, 4096), {"dim": "-1"}), (".dim", (4096, 511), {"dim": "0"}),
                     ("", (1000003,), {}))
            dts = tuple(TORCH_DTYPES)
        return [make_row(f"aten.{fn}{o}", [dt], [s], p) for dt in dts for fn in ("all", "any") for o, s, p in cases]


SPEC = AllAnySpec()
SPECS = (SPEC,)

_EVERY = object()  # `aten.all(x)`: no dim argument at all


def _run(fn: str, x, dim, keepdim: bool) -> torch.Tensor:
    in_dt = _NAMES.get(getattr(x, "dtype", None))
    if in_dt is None:
        raise KernelError(f"{fn}: dtype {getattr(x, 'dtype', None)} is not served ({', '.join(TORCH_DTYPES)})")
    if x.dim() > 64:
        raise KernelError(f"{fn}: a tensor of {x.dim()} dims (torch reduces up to 64)")
    red = dims_of(None if dim is _EVERY else dim, x.dim())
    if isinstance(red, str):
        raise KernelError(f"{fn}: {red} (torch raises)")
    if x.numel() == 0:
        raise KernelError(f"{fn}: an empty input is not served")
    try:
        plan = _reduce.reduce_plan(tuple(x.shape), x.stride(), red)
    except ValueError as e:
        raise KernelError(f"{fn}: {e}") from None
    out = launch.empty(_reduce.out_shape_of(tuple(x.shape), red, keepdim), torch.bool, x.device)
    config = config_for(SPEC, ("bool", in_dt), seat_flags(fn=fn, inner=int(plan[2])), plan[:2])
    launch_all_any(x, out, plan, fn, config)
    return out


def all(x: torch.Tensor, dim=_EVERY, keepdim: bool = False) -> torch.Tensor:
    """torch.all: whether every element over `dim` (an int, a list, None / absent for all
    dims; an empty list for none) is non-zero, as bool."""
    return _run("all", x, dim, keepdim)


def any(x: torch.Tensor, dim=_EVERY, keepdim: bool = False) -> torch.Tensor:
    """torch.any: whether some element over `dim` (as all's) is non-zero, as bool."""
    return _run("any", x, dim, keepdim)
