"""Top-k and sort of short rows (`aten.topk`, `aten.sort`): a mixture-of-experts router's
top-k over its experts' logits, and the sort of the routed expert ids.

A rank sort: each element's place in its row is the count of elements that sort before it
(greater, descending; less, ascending; NaN the largest value as torch orders it; an equal
one at a lower index), found by comparing a BLOCK_I slice of the row with every BLOCK_J
slice; the element is then written at its place if that is < k. No data-dependent control
flow and no atomics on the outputs, so the result is the stable order bit for bit.
Program (row, i-block): a row longer than BLOCK_I (a prefill's 1-D sort of tokens x k
expert ids) is ranked by several programs at once.

Ties: torch's stable sort keeps them in index order, as here. Its non-stable sort and its
top-k do not say (the CPU's std::sort orders them otherwise), so the kernel also raises a
flag (`tie_ptr`, atomic max of one int) where an element it writes has an equal partner:
the public ops hand such a CPU call to torch (reading the flag costs nothing there); a GPU
call is not synced for it and gives the stable order (docs/architecture.md).

Launch key: the rows R (`default` ladder) and the row length E (`row`); flags: the op
(topk or sort) and the direction.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from nbx_tune.errors import KernelError
from nbx_tune.kernels.copy import dense
from nbx_tune.kernels.helpers import FLOATS, torch_dtypes
from nbx_tune.kernels.rows import numel
from nbx_tune.kernels.runtime import launch
from nbx_tune.kernels.runtime.certified import config_for
from nbx_tune.kernels.spec import Config, KernelSpec, KeyDim, NotServable, Problem, seat_flags, uniform_inputs
from nbx_tune.oracles import sorting as oracle

TORCH_DTYPES = torch_dtypes(*FLOATS, "int32", "int64")
# The rank sort does E^2 comparisons a row: up to a 4096-token prefill's 8 expert ids a
# token. Longer rows go to torch's radix sort.
MAX_ROW = 32768
# On the CPU (Triton's interpreter, which runs each comparison tile in numpy) a long row
# takes minutes: there torch sorts rows over this.
INTERPRETED_MAX_ROW = 1024
_NAMES = {v: k for k, v in TORCH_DTYPES.items()}


@triton.jit
def _rank_sort_kernel(x_ptr, v_ptr, i_ptr, tie_ptr, E, K, inner, stride_o, stride_e, stride_i,
                      DESC: tl.constexpr, IS_FLOAT: tl.constexpr,
                      BLOCK_I: tl.constexpr, BLOCK_J: tl.constexpr):
    r = tl.program_id(0)
    o = (r // inner).to(tl.int64)
    ii = (r % inner).to(tl.int64)
    base = x_ptr + o * stride_o + ii * stride_i
    ri = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    mi = ri < E
    xi = tl.load(base + ri.to(tl.int64) * stride_e, mask=mi)
    rank = tl.zeros([BLOCK_I], dtype=tl.int32)
    equal = tl.zeros([BLOCK_I], dtype=tl.int32)
    for j0 in range(0, E, BLOCK_J):
        rj = j0 + tl.arange(0, BLOCK_J)
        mj = rj < E
        xj = tl.load(base + rj.to(tl.int64) * stride_e, mask=mj)
        a = xj[:, None]
        b = xi[None, :]
        if IS_FLOAT:
            na = a != a
            nb = b != b
            same = (a == b) | (na & nb)
            if DESC:
                first = (a > b) | (na & (nb == 0))
            else:
                first = (a < b) | ((na == 0) & nb)
        else:
            same = a == b
            if DESC:
                first = a > b
            else:
                first = a < b
        valid = mj[:, None]
        lower = rj[:, None] < ri[None, :]
        rank += tl.sum((valid & (first | (same & lower))).to(tl.int32), axis=0)
        equal += tl.sum((valid & same & (rj[:, None] != ri[None, :])).to(tl.int32), axis=0)
    kept = mi & (rank < K)
    out = (o * K + rank) * inner + ii
    tl.store(v_ptr + out, xi, mask=kept)
    tl.store(i_ptr + out, ri.to(tl.int64), mask=kept)
    tie = tl.max((kept & (equal > 0)).to(tl.int32), axis=0)
    tl.atomic_max(tie_ptr, tie)


_rank_sort_kernel = launch.recorded(_rank_sort_kernel)


def launch_rank_sort(x, values, indices, tie, k: int, dim: int, descending: bool, config: Config) -> None:
    """values, indices (x's shape with `dim` k long, contiguous) = the k first of each
    row's stable order along `dim`; x contiguous; tie (one int32) raised where a written
    element has an equal one in its row."""
    E = x.shape[dim]
    inner = numel(x.shape[dim + 1:])
    rows = numel(x.shape) // E
    grid = (rows, triton.cdiv(E, config["BLOCK_I"]))
    _rank_sort_kernel[grid](x, values, indices, tie, E, k, inner, E * inner, inner, 1,
                            DESC=descending, IS_FLOAT=x.dtype.is_floating_point, **config.kwargs)


def _c(bi, bj, warps):
    return Config.make(BLOCK_I=bi, BLOCK_J=bj, num_warps=warps, num_stages=1)


# A router's rows (8..256 experts) fit one BLOCK_I; a prefill's sort of tokens x k ids is
# split over programs. The comparison tile BLOCK_I x BLOCK_J stays <= 8192 elements.
CONFIGS = (_c(16, 16, 1), _c(32, 32, 1), _c(64, 16, 1), _c(64, 32, 2), _c(64, 64, 4),
           _c(128, 16, 2), _c(128, 32, 4), _c(128, 64, 4), _c(256, 16, 4), _c(256, 32, 8))
DEFAULTS = (_c(64, 32, 2),)


def _integers(rng, shape, dt):
    # few distinct values: every row has ties, which the stable order must keep in index order
    return rng.integers(-6, 7, shape)


class RowSortSpec(KernelSpec):
    name = "row_sort"
    ops = ("aten.topk", "aten.sort", "aten.sort.stable")
    key = (KeyDim("R"), KeyDim("E", "row"))
    dtypes = tuple(TORCH_DTYPES)
    exact = True
    description = "top-k and stable sort of short rows (a router's experts, routed expert ids)"

    config_space = CONFIGS
    default_configs = DEFAULTS

    def source_parts(self):
        return (_rank_sort_kernel, launch_rank_sort)

    def problem_from_row(self, row):
        op = row.op.removesuffix(".default")
        if op not in self.ops:
            return NotServable(f"{row.op}: overload not served")
        if len(row.shapes) != 1 or row.dtypes[0] not in TORCH_DTYPES:
            return NotServable(f"{op}: one tensor of {', '.join(TORCH_DTYPES)} expected")
        shape = tuple(row.shapes[0]) or (1,)
        dim = row.params.int("dim", -1)
        if not -len(shape) <= dim < len(shape):
            return NotServable(f"{op}: dim {dim} out of range for rank {len(shape)}")
        dim %= len(shape)
        E = shape[dim]
        if op == "aten.topk":
            k = row.params.int("k")
            if not row.params.bool("sorted", True):
                return NotServable("topk(sorted=False): torch's order of the k is its own")
            desc, kind = row.params.bool("largest", True), "topk"
        else:
            k, desc, kind = E, row.params.bool("descending", False), "sort"
        if k is None or not 0 < k <= E:
            return NotServable(f"{op}: k={k} with a row of {E}: nothing to launch")
        if E > MAX_ROW:
            return NotServable(f"{op}: a row of {E} > {MAX_ROW} (the rank sort is quadratic)")
        return Problem(self.name, (row.dtypes[0],), seat_flags(op=kind, desc=int(desc)),
                       (numel(shape) // E, E), (("dim", dim), ("k", k), ("shape", shape)))

    def _out_shape(self, problem):
        shape, dim = list(problem.get("shape")), problem.get("dim")
        shape[dim] = problem.get("k")
        return tuple(shape)

    def input_shapes(self, problem):
        return {"x": (tuple(problem.get("shape")), problem.dtypes[0])}

    def make_inputs(self, problem, rng):
        shape, dt = tuple(problem.get("shape")), problem.dtypes[0]
        if dt in ("int32", "int64"):
            return {"x": (_integers(rng, shape, dt), dt)}
        x = uniform_inputs(rng, shape)
        x[..., ::7] = x[..., :1]  # ties in every row, kept in index order
        return {"x": (x, dt)}

    def oracle(self, problem, inputs):
        dim = problem.get("dim")
        x = inputs["x"].reshape(tuple(problem.get("shape")))
        v, i = oracle.topk(x.swapaxes(dim, -1), problem.get("k"), dict(problem.flags)["desc"] == "1")
        return {"values": v.swapaxes(dim, -1), "indices": i.swapaxes(dim, -1)}

    def output_specs(self, problem):
        shape = self._out_shape(problem)
        return {"values": (shape, problem.dtypes[0]), "indices": (shape, "int64")}

    def launch(self, config, problem, inputs, outputs):
        x = inputs["x"].reshape(tuple(problem.get("shape")))
        tie = torch.zeros(1, dtype=torch.int32, device=x.device)
        launch_rank_sort(x, outputs["values"], outputs["indices"], tie, problem.get("k"),
                         problem.get("dim"), dict(problem.flags)["desc"] == "1", config)

    def serve_ops(self):
        return {"aten.topk": topk, "aten.sort": sort, "aten.sort.stable": sort_stable}

    def example_rows(self, scale):
        from nbx_tune.kernels.rows import make_row

        if scale == "small":
            # the interpreter runs BLOCK_I x BLOCK_J comparisons a step: short rows
            dts = ("float16", "float32", "int64", "int32")
            cases = (("aten.topk", (13, 8), {"k": "2"}), ("aten.topk", (3, 37), {"k": "7", "largest": "False"}),
                     ("aten.topk", (2, 19, 2), {"k": "3", "dim": "1"}), ("aten.sort", (26,), {}),
                     ("aten.sort.stable", (2, 41), {"stable": "True", "descending": "True"}))
        else:
            dts = tuple(TORCH_DTYPES)
            # Mixtral's router (8 experts, top-2), DeepSeek-V3's (256, top-8); the sort of a
            # 4096-token prefill's 8192 routed expert ids
            cases = (("aten.topk", (4096, 8), {"k": "2"}), ("aten.topk", (4095, 256), {"k": "8"}),
                     ("aten.topk", (1, 60), {"k": "4"}), ("aten.sort", (8192,), {}),
                     ("aten.sort", (37, 250), {"descending": "True"}))
        return [make_row(op, [dt], [shape], params) for dt in dts for op, shape, params in cases]


SPEC = RowSortSpec()
SPECS = (SPEC,)


def _rank_sorted(x: torch.Tensor, k: int, dim: int, descending: bool, kind: str, ties_ok: bool):
    """The rank sort, replayed (kernels/runtime/launch.py) under a key of the op, k, dim, the
    order, whether ties are served and x's layout. Where ties are refused (the CPU: torch's
    order of ties is its own) the tie flag is a zeroed input of each call, read after it,
    so a replay checks it too; elsewhere nothing reads the flag."""
    flag = tie = None
    if not ties_ok and getattr(getattr(x, "device", None), "type", None) == "cpu":
        # made and read through numpy: torch.zeros and item() would be ops serve() routes
        flag = np.zeros(1, np.int32)
        tie = torch.from_numpy(flag)
    try:
        key = (SPEC, kind, k, dim, descending, ties_ok, *launch.tensor_key(x),
               None if tie is None else tie.data_ptr() & 15)
    except AttributeError:  # not a tensor: the checks say so
        return _rank_sort(x, k, dim, descending, kind, tie)
    inputs = (x,) if tie is None else (x, tie)
    hit = launch.REMEMBERED.get(key)
    out = hit(*inputs) if hit is not None else launch.remember(key, inputs, _rank_sort, x, k, dim, descending, kind, tie)
    if flag is not None and flag[0]:
        raise KernelError(f"{kind}: equal values where torch's order of ties is its own")
    return out


def _rank_sort(x, k, dim, descending, kind, tie):
    dt = _NAMES.get(x.dtype) if isinstance(x, torch.Tensor) else None
    if dt is None:
        raise KernelError(f"{kind}: dtype {getattr(x, 'dtype', type(x).__name__)} is not served "
                          f"({', '.join(TORCH_DTYPES)})")
    shape = tuple(x.shape) or (1,)
    if not -len(shape) <= dim < len(shape):
        raise KernelError(f"{kind}: dim {dim} out of range (torch raises)")
    dim %= len(shape)
    E = shape[dim]
    if not 0 <= k <= E:
        raise KernelError(f"{kind}: k={k} out of range for a row of {E} (torch raises)")
    limit = INTERPRETED_MAX_ROW if x.device.type == "cpu" else MAX_ROW
    if E > limit:
        raise KernelError(f"{kind}: a row of {E} > {limit} goes to torch (the rank sort is quadratic)")
    out_shape = list(x.shape)
    if out_shape:
        out_shape[dim] = k
    values = launch.empty(tuple(out_shape), x.dtype, x.device)
    indices = launch.empty(tuple(out_shape), torch.int64, x.device)
    if values.numel() == 0:
        return values, indices
    if tie is None:  # a flag nothing reads
        tie = launch.scratch((1,), torch.int32, x.device)
    config = config_for(SPEC, (dt,), seat_flags(op=kind, desc=int(descending)), (numel(shape) // E, E))
    launch_rank_sort(dense(x).reshape(shape), values, indices, tie, k, dim, descending, config)
    return values, indices


def topk(self: torch.Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):
    """aten.topk: the k largest (smallest) of each row along dim, in order, with their
    indices; ties as the module docstring says."""
    if not sorted and k > 1:  # sorted=False with k <= 1 is sorted's result: one key
        raise KernelError("topk(sorted=False): torch's order of the k is its own")
    return _rank_sorted(self, k, dim, largest, "topk", ties_ok=False)


def sort(self: torch.Tensor, dim: int = -1, descending: bool = False):
    """aten.sort (not asked to be stable)."""
    return sort_stable(self, stable=False, dim=dim, descending=descending)


def sort_stable(self: torch.Tensor, *, stable=None, dim: int = -1, descending: bool = False):
    """aten.sort.stable: the stable order; a non-stable sort with ties goes to torch on the CPU."""
    E = self.shape[dim] if isinstance(self, torch.Tensor) and self.dim() else 1
    return _rank_sorted(self, E, dim, descending, "sort", ties_ok=bool(stable))
