"""Indexing by an integer tensor: `aten.index.Tensor` along dim 0 (a mixture-of-experts
layer gathering its routed tokens, `hidden[perm // k]`), `aten.index_put_` along dim 0
(its inverse permutation, `inv[perm] = arange`; with accumulate, a scatter-add), and
`aten.gather` (an encoder's relative positions).

Rows kernels over (T, D): T indices, D the elements of a row (self's dims after the first,
contiguous); the index is loaded once per program and wrapped where negative, as advanced
indexing counts from the end. The gather kernel walks the index's elements through up to
four dims by strides. Exact: data movement, checked bit for bit; index_put_ with
accumulate adds with atomics, whose order on a GPU varies where an index repeats (its
seats declare `run_to_run_variation`).

Indices out of range raise torch's error (kernels/runtime/semantics.py: a host check on the
CPU, a device assert on a GPU); an index_put_ without accumulate whose indices repeat has
no defined result in torch, and goes to torch on the CPU (where torch's is the last write).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nbx_tune.errors import KernelError
from nbx_tune.kernels.copy import STAGING, copy_plan, dense, launch_copy_plan, strided_offsets
from nbx_tune.kernels.helpers import FLOATS, torch_dtypes
from nbx_tune.kernels.rows import numel
from nbx_tune.kernels.runtime import launch, semantics
from nbx_tune.kernels.runtime.certified import config_for
from nbx_tune.kernels.spec import Config, KernelSpec, KeyDim, NotServable, Problem, seat_flags, uniform_inputs
from nbx_tune.oracles import movement as oracle

DATA_DTYPES = torch_dtypes(*FLOATS, "int32", "int64", "bool")
INDEX_DTYPES = torch_dtypes("int64", "int32")
_NAMES = {v: k for k, v in DATA_DTYPES.items()}


@triton.jit
def _row_tile(idx_ptr, T, D, V, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """This program's BLOCK_T indices (wrapped where negative) by BLOCK_D columns, and the mask."""
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    tm = t < T
    m = tm[:, None] & (d < D)[None, :]
    row = tl.load(idx_ptr + t, mask=tm, other=0).to(tl.int64)
    return t.to(tl.int64), d, m, tl.where(row < 0, row + V, row)


@triton.jit
def _take_rows_kernel(x_ptr, idx_ptr, out_ptr, T, D, V, stride_x,
                      BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    t, d, m, row = _row_tile(idx_ptr, T, D, V, BLOCK_T, BLOCK_D)
    v = tl.load(x_ptr + row[:, None] * stride_x + d[None, :], mask=m)
    tl.store(out_ptr + t[:, None] * D + d[None, :], v, mask=m)


@triton.jit
def _put_rows_kernel(x_ptr, idx_ptr, val_ptr, T, D, V, stride_x, sv_t, sv_d,
                     ACC: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    t, d, m, row = _row_tile(idx_ptr, T, D, V, BLOCK_T, BLOCK_D)
    v = tl.load(val_ptr + t[:, None] * sv_t + d[None, :].to(tl.int64) * sv_d, mask=m)
    dst = x_ptr + row[:, None] * stride_x + d[None, :]
    if ACC:
        tl.atomic_add(dst, v, mask=m)
    else:
        tl.store(dst, v, mask=m)


@triton.jit
def _gather_kernel(x_ptr, idx_ptr, out_ptr, n, D1, D2, D3, SX0, SX1, SX2, SX3, S_DIM,
                   SI0, SI1, SI2, SI3, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    at = strided_offsets(offs, 4, D1, D2, D3, SI0, SI1, SI2, SI3)
    idx = tl.load(idx_ptr + at, mask=m, other=0).to(tl.int64)
    v = tl.load(x_ptr + strided_offsets(offs, 4, D1, D2, D3, SX0, SX1, SX2, SX3) + idx * S_DIM, mask=m)
    tl.store(out_ptr + offs, v, mask=m)


_take_rows_kernel = launch.recorded(_take_rows_kernel)
_put_rows_kernel = launch.recorded(_put_rows_kernel)
_gather_kernel = launch.recorded(_gather_kernel)


def _grid(T, D, config):
    return (triton.cdiv(T, config["BLOCK_T"]), triton.cdiv(D, config["BLOCK_D"]))


def launch_take_rows(x, idx, out, config: Config) -> None:
    """out (T x D, contiguous) = x[idx]: x (V x D) rows contiguous, idx contiguous, in [-V, V)."""
    T, D = idx.numel(), x.shape[1]
    _take_rows_kernel[_grid(T, D, config)](x, idx, out, T, D, x.shape[0], x.stride(0), **config.kwargs)


def launch_put_rows(x, idx, values, accumulate: bool, config: Config) -> None:
    """x[idx] = values (+= with accumulate): x (V x D) rows contiguous, values (T x D) by strides."""
    T, D = idx.numel(), x.shape[1]
    _put_rows_kernel[_grid(T, D, config)](x, idx, values, T, D, x.shape[0], x.stride(0),
                                          values.stride(0), values.stride(1), ACC=accumulate,
                                          **config.kwargs)


def dims4(shape, *strides) -> list:
    """`strided_offsets`'s arguments for a tensor of rank <= 4 (padded with leading 1s): the
    sizes of the three innermost dims, innermost first, then per strides list its
    outermost stride and those three, innermost first."""
    pad = 4 - len(shape)
    sizes = [1] * pad + list(shape)
    out = sizes[:0:-1]
    for s in strides:
        s = [0] * pad + list(s)
        out += [s[0], *s[:0:-1]]
    return out


def launch_gather(x, dim: int, idx, out, config: Config) -> None:
    """out (idx's shape, contiguous) = x gathered along dim; rank <= 4, indices in range."""
    sx = list(x.stride())
    s_dim = sx[dim]
    sx[dim] = 0
    d1, d2, d3, sx0, sx1, sx2, sx3, si0, si1, si2, si3 = dims4(idx.shape, sx, idx.stride())
    n = idx.numel()
    _gather_kernel[(triton.cdiv(n, config["BLOCK"]),)](x, idx, out, n, d1, d2, d3, sx0, sx1, sx2, sx3, s_dim,
                                                       si0, si1, si2, si3, **config.kwargs)


def _c(bt, bd, warps):
    return Config.make(BLOCK_T=bt, BLOCK_D=bd, num_warps=warps, num_stages=1)


# As embedding's: one token's long row spread over programs, many short rows per program.
ROW_CONFIGS = (_c(1, 1024, 4), _c(4, 256, 4), _c(8, 512, 8), _c(16, 128, 4), _c(32, 64, 4), _c(64, 16, 2))
ROW_DEFAULTS = (_c(4, 256, 4),)
# A kernel over flat elements, BLOCK a program (gather's, floor_divide's).
FLAT_CONFIGS = tuple(Config.make(BLOCK=b, num_warps=w, num_stages=1)
                     for b, w in ((128, 1), (256, 2), (512, 4), (1024, 4), (2048, 8), (4096, 8)))
FLAT_DEFAULTS = (Config.make(BLOCK=1024, num_warps=4, num_stages=1),)


def _data_values(rng, shape, dt):
    if dt == "bool":
        return rng.integers(0, 2, shape)
    if dt in ("int32", "int64"):
        return rng.integers(-1000, 1000, shape)
    return uniform_inputs(rng, shape)


def _index_dtypes(row, what):
    if len(row.dtypes) < 2 or row.dtypes[0] not in DATA_DTYPES or row.dtypes[1] not in INDEX_DTYPES:
        return NotServable(f"{what}: a tensor of {', '.join(DATA_DTYPES)} indexed by "
                           f"{' or '.join(INDEX_DTYPES)} expected")
    return None


class _RowsSpec(KernelSpec):
    """What the row-indexing specs share: key (T, D), the row configs."""

    key = (KeyDim("T"), KeyDim("D", "row"))
    dtypes = tuple(DATA_DTYPES)
    exact = True
    config_space = ROW_CONFIGS
    default_configs = ROW_DEFAULTS

    def _rows(self, problem):
        return problem.get("V"), problem.dims[1]

    def _refusal(self, row, what: str, tensors: int):
        """Why a row of `what` with `tensors` tensors is not one this spec serves, or None."""
        if row.op.removesuffix(".default") not in self.ops:
            return NotServable(f"{row.op}: overload not served")
        bad = _index_dtypes(row, what)
        if bad:
            return bad
        if len(row.shapes) != tensors or row.params.str("indices", "Tensor") != "Tensor":
            return NotServable(f"{what}: one index tensor on dim 0 is served")
        return None

    def input_shapes(self, problem):
        V, D = self._rows(problem)
        return {"x": (tuple(problem.get("shape")), problem.dtypes[0]),
                "indices": (tuple(problem.get("index_shape")), problem.dtypes[1])}


class IndexSpec(_RowsSpec):
    name = "index_rows"
    ops = ("aten.index.Tensor",)
    description = "advanced indexing along dim 0 by one integer tensor: x[idx]"

    def source_parts(self):
        return (_take_rows_kernel, _row_tile, launch_take_rows, _grid)

    def problem_from_row(self, row):
        if (len(row.shapes) > 2 or "None" in row.params.str("indices", "")) and row.op.removesuffix(".default") \
                in self.ops:  # x[i0, i1] and x[:, i]: another family's
            from nbx_tune.kernels.index_nd import SPEC as INDEX_ND

            return INDEX_ND.problem_from_row(row)
        bad = self._refusal(row, "index", 2)
        if bad:
            return bad
        shape, ishape = tuple(row.shapes[0]), tuple(row.shapes[1])
        if not shape or not numel(shape) or not numel(ishape):
            return NotServable("index: an empty or 0-d tensor: nothing to launch")
        return Problem(self.name, tuple(row.dtypes[:2]), seat_flags(), (numel(ishape), numel(shape[1:])),
                       (("V", shape[0]), ("index_shape", ishape), ("shape", shape)))

    def make_inputs(self, problem, rng):
        V = problem.get("V")
        return {"x": (_data_values(rng, tuple(problem.get("shape")), problem.dtypes[0]), problem.dtypes[0]),
                "indices": (rng.integers(-V, V, tuple(problem.get("index_shape"))), problem.dtypes[1])}

    def oracle(self, problem, inputs):
        V, D = self._rows(problem)
        idx = inputs["indices"].reshape(tuple(problem.get("index_shape")))
        out = oracle.embedding(inputs["x"].reshape(V, D), idx % V)
        return {"out": out.reshape(self.output_specs(problem)["out"][0])}

    def output_specs(self, problem):
        return {"out": ((*problem.get("index_shape"), *problem.get("shape")[1:]), problem.dtypes[0])}

    def launch(self, config, problem, inputs, outputs):
        V, D = self._rows(problem)
        launch_take_rows(inputs["x"].reshape(V, D), inputs["indices"].reshape(-1), outputs["out"], config)

    def serve_ops(self):
        return {"aten.index.Tensor": index}

    def example_rows(self, scale):
        from nbx_tune.kernels.rows import make_row

        cases = (((37, 45), (13,)), ((300,), (7, 3)), ((5, 3, 2), (40,))) if scale == "small" else \
            (((8192, 4096), (8192,)), ((4096, 2048), (1, 3)), ((16384,), (16384,)))
        dts = ("float16", "float32", "int64", "bool") if scale == "small" else tuple(DATA_DTYPES)
        return [make_row("aten.index.Tensor", [dt, "int32" if i == 2 else "int64"], [s, i_s],
                         {"indices": "Tensor"})
                for dt in dts for i, (s, i_s) in enumerate(cases)]


class IndexPutSpec(_RowsSpec):
    name = "index_put_rows"
    ops = ("aten.index_put_", "aten.index_put")
    description = "x[idx] = values (+= with accumulate) along dim 0 by one integer tensor"
    run_to_run_variation = True  # accumulate's float atomics where an index repeats
    exact = False  # accumulate rounds each add to the dtype, as torch's does: judged at its tolerance

    def source_parts(self):
        return (_put_rows_kernel, _row_tile, launch_put_rows, _grid)

    def problem_from_row(self, row):
        bad = self._refusal(row, "index_put_", 3)
        if bad:
            return bad
        shape, ishape, vshape = (tuple(s) for s in row.shapes)
        if row.dtypes[2] != row.dtypes[0]:
            return NotServable("index_put_: values of another dtype")
        full = (*ishape, *shape[1:])
        if not shape or not numel(full) or tuple(vshape) not in (full, tuple(shape[1:]), (), (1,)):
            return NotServable(f"index_put_: values of shape {vshape} are not served")
        acc = int(bool(row.params.bool("accumulate", False)))
        if acc and row.dtypes[0] == "bool":
            return NotServable("index_put_: accumulate into bool is not served")
        return Problem(self.name, tuple(row.dtypes[:2]), seat_flags(accumulate=acc),
                       (numel(ishape), numel(shape[1:])),
                       (("V", shape[0]), ("index_shape", ishape), ("shape", shape), ("values_shape", vshape)))

    def input_shapes(self, problem):
        return {**super().input_shapes(problem),
                "values": (tuple(problem.get("values_shape")), problem.dtypes[0])}

    def make_inputs(self, problem, rng):
        V, acc = problem.get("V"), dict(problem.flags)["accumulate"] == "1"
        T = numel(problem.get("index_shape"))
        # without accumulate torch defines no result where indices repeat: a permutation's
        # prefix; with it, repeats (the sums' order is the atomics')
        idx = rng.integers(-V, V, T) if acc else rng.permutation(V)[:T] - rng.integers(0, 2, T) * V
        dt = problem.dtypes[0]
        return {"x": (_data_values(rng, tuple(problem.get("shape")), dt), dt),
                "indices": (idx.reshape(tuple(problem.get("index_shape"))), problem.dtypes[1]),
                "values": (_data_values(rng, tuple(problem.get("values_shape")), dt), dt)}

    def oracle(self, problem, inputs):
        import numpy as np

        V, D = self._rows(problem)
        x = np.array(inputs["x"], copy=True).reshape(V, D)
        idx = inputs["indices"].reshape(-1) % V
        vals = np.broadcast_to(inputs["values"].reshape(tuple(problem.get("values_shape"))),
                               (*problem.get("index_shape"), *problem.get("shape")[1:])).reshape(-1, D)
        if dict(problem.flags)["accumulate"] == "1":
            if x.dtype == bool:
                x = x.astype(np.int64)
                np.add.at(x, idx, vals)
                x = x != 0
            else:
                np.add.at(x, idx, vals)
        else:
            x[idx] = vals
        return {"out": x.reshape(tuple(problem.get("shape")))}

    def output_specs(self, problem):
        return {"out": (tuple(problem.get("shape")), problem.dtypes[0])}

    def launch(self, config, problem, inputs, outputs):
        V, D = self._rows(problem)
        out = outputs["out"]
        out.copy_(inputs["x"])  # in place on a copy of self: the screen's output
        launch_put_rows(out.view(V, D), inputs["indices"].reshape(-1),
                        _values_2d(inputs["values"], (*problem.get("index_shape"), *problem.get("shape")[1:]),
                                   tuple(problem.get("shape")[1:]), numel(problem.get("index_shape")), D),
                        dict(problem.flags)["accumulate"] == "1", config)

    def serve_ops(self):
        return {"aten.index_put_": index_put_, "aten.index_put": index_put}

    def example_rows(self, scale):
        from nbx_tune.kernels.rows import make_row

        cases = (((37, 45), (13,), (13, 45)), ((300,), (7, 3), ()), ((50, 3, 2), (40,), (3, 2))) \
            if scale == "small" else (((8192,), (8192,), (8192,)), ((4096, 2048), (3000,), (3000, 2048)))
        dts = ("float16", "float32", "int64") if scale == "small" else (*FLOATS, "int64", "int32")
        return [make_row("aten.index_put_", [dt, "int64", dt], [s, i_s, v_s],
                         {"indices": "Tensor", "accumulate": acc})
                for dt in dts for s, i_s, v_s in cases for acc in ("False", "True")]


class GatherSpec(KernelSpec):
    name = "gather"
    ops = ("aten.gather",)
    key = (KeyDim("N", "elements"),)
    dtypes = tuple(DATA_DTYPES)
    exact = True
    description = "gather along a dim by an integer tensor (rank <= 4)"
    config_space = FLAT_CONFIGS
    default_configs = FLAT_DEFAULTS

    def source_parts(self):
        return (_gather_kernel, strided_offsets, launch_gather, dims4)

    def problem_from_row(self, row):
        if row.op.removesuffix(".default") != "aten.gather":
            return NotServable(f"{row.op}: overload not served")
        bad = _index_dtypes(row, "gather")
        if bad or row.dtypes[1] != "int64":
            return bad or NotServable("gather: torch takes int64 indices only")
        shape, ishape = (tuple(s) for s in row.shapes)
        if not 1 <= len(shape) <= 4 or len(ishape) != len(shape) or not numel(ishape):
            return NotServable("gather: rank 1..4, the index of self's rank, not empty")
        dim = row.params.int("dim") % len(shape)
        if any(i > s for d, (i, s) in enumerate(zip(ishape, shape)) if d != dim):
            return NotServable("gather: an index larger than self off its dim")
        return Problem(self.name, tuple(row.dtypes[:2]), seat_flags(), (numel(ishape),),
                       (("dim", dim), ("index_shape", ishape), ("shape", shape)))

    def input_shapes(self, problem):
        return {"x": (tuple(problem.get("shape")), problem.dtypes[0]),
                "indices": (tuple(problem.get("index_shape")), "int64")}

    def make_inputs(self, problem, rng):
        shape, dim = tuple(problem.get("shape")), problem.get("dim")
        return {"x": (_data_values(rng, shape, problem.dtypes[0]), problem.dtypes[0]),
                "indices": (rng.integers(0, shape[dim], tuple(problem.get("index_shape"))), "int64")}

    def oracle(self, problem, inputs):
        import numpy as np

        shape, ishape, dim = (tuple(problem.get("shape")), tuple(problem.get("index_shape")),
                              problem.get("dim"))
        x = inputs["x"].reshape(shape)[tuple(slice(0, n) if d != dim else slice(None)
                                             for d, n in enumerate(ishape))]
        return {"out": np.take_along_axis(x, inputs["indices"].reshape(ishape), axis=dim)}

    def output_specs(self, problem):
        return {"out": (tuple(problem.get("index_shape")), problem.dtypes[0])}

    def launch(self, config, problem, inputs, outputs):
        launch_gather(inputs["x"].reshape(tuple(problem.get("shape"))), problem.get("dim"),
                      inputs["indices"].reshape(tuple(problem.get("index_shape"))), outputs["out"], config)

    def serve_ops(self):
        return {"aten.gather": gather}

    def example_rows(self, scale):
        from nbx_tune.kernels.rows import make_row

        cases = (((6, 37), (6, 11), 1), ((5, 4, 3), (9, 4, 2), 0), ((2, 3, 4, 5), (2, 3, 4, 7), -1)) \
            if scale == "small" else (((12, 512, 512), (12, 512, 512), 2), ((4096, 129), (4096, 1), 1))
        dts = ("float16", "float32", "int64", "bool") if scale == "small" else tuple(DATA_DTYPES)
        return [make_row("aten.gather", [dt, "int64"], [s, i_s], {"dim": str(d)})
                for dt in dts for s, i_s, d in cases]


INDEX_SPEC, INDEX_PUT_SPEC, GATHER_SPEC = IndexSpec(), IndexPutSpec(), GatherSpec()
SPECS = (INDEX_SPEC, INDEX_PUT_SPEC, GATHER_SPEC)


def _strip(shape) -> tuple:
    shape = tuple(shape)
    while shape and shape[0] == 1:
        shape = shape[1:]
    return shape


def _values_2d(values: torch.Tensor, full: tuple, rest: tuple, T: int, D: int) -> torch.Tensor:
    """values (broadcastable to `full`, the index's shape + `rest`) as a (T, D) view by
    strides: whole, one row repeated over the index (stride 0), or one value."""
    if values.numel() == 1:
        return dense(values).view(1, 1).expand(T, D)
    if tuple(values.shape) == tuple(full):
        return dense(values).view(T, D)
    if _strip(values.shape) == _strip(rest):
        return dense(values).view(1, D).expand(T, D)
    raise KernelError(f"index_put_: values of shape {tuple(values.shape)} are not served")


def _dim0_index(what: str, x, indices):
    """The one integer index tensor of `indices` (dim 0), else KernelError."""
    if not isinstance(x, torch.Tensor) or _NAMES.get(x.dtype) is None:
        raise KernelError(f"{what}: dtype {getattr(x, 'dtype', None)} is not served")
    if len(indices) != 1 or not isinstance(indices[0], torch.Tensor):
        raise KernelError(f"{what}: one index tensor on dim 0 is served")
    idx = indices[0]
    if idx.dtype not in INDEX_DTYPES.values():
        raise KernelError(f"{what}: index dtype {idx.dtype} is not served (a mask goes to torch)")
    if x.dim() == 0 or idx.device != x.device:
        raise KernelError(f"{what}: a 0-d tensor or an index on another device")
    semantics.check_indices(what, idx, x.shape[0], negative=True)
    return idx


def index(self: torch.Tensor, indices) -> torch.Tensor:
    """aten.index.Tensor with one integer index tensor: self[idx] along dim 0 (with more, or
    after sliced dims, kernels/index_nd.py's family)."""
    if len(indices) != 1:  # several tensors, or sliced dims before one (None entries)
        from nbx_tune.kernels.index_nd import index_nd

        return index_nd(self, indices)
    idx = _dim0_index("index", self, indices)
    D = numel(self.shape[1:])
    out = launch.empty((*idx.shape, *self.shape[1:]), self.dtype, self.device)
    if out.numel() == 0:
        return out
    config = config_for(INDEX_SPEC, (_NAMES[self.dtype], _NAMES[idx.dtype]), seat_flags(), (idx.numel(), D))
    launch_take_rows(dense(self).view(self.shape[0], D), dense(idx).view(-1), out, config)
    return out


def index_put_(self: torch.Tensor, indices, values: torch.Tensor, accumulate: bool = False) -> torch.Tensor:
    """aten.index_put_ with one integer index tensor along dim 0, in place."""
    idx = _dim0_index("index_put_", self, indices)
    if not isinstance(values, torch.Tensor) or values.dtype != self.dtype or values.device != self.device:
        raise KernelError("index_put_: values of another dtype or device (torch casts or refuses)")
    if not self.is_contiguous():
        raise KernelError("index_put_: a strided self is not served")
    full = (*idx.shape, *self.shape[1:])
    try:
        if torch.broadcast_shapes(values.shape, full) != full:
            raise KernelError("index_put_: values do not broadcast to the indexed shape")
    except RuntimeError:
        raise KernelError("index_put_: values do not broadcast to the indexed shape (torch raises)") from None
    if accumulate and self.dtype == torch.bool:
        raise KernelError("index_put_: accumulate into bool is not served")
    semantics.check_writable("index_put_", self, values, idx)
    T, D = idx.numel(), numel(self.shape[1:])
    if T == 0 or D == 0:
        return self
    values2 = _values_2d(values, full, tuple(self.shape[1:]), T, D)
    idx = dense(idx).view(-1)
    if not accumulate and self.device.type == "cpu":
        wrapped = torch.where(idx < 0, idx + self.shape[0], idx)
        if torch.unique(wrapped).numel() != T:
            raise KernelError("index_put_: repeated indices without accumulate (torch's result is its own)")
    config = config_for(INDEX_PUT_SPEC, (_NAMES[self.dtype], _NAMES[idx.dtype]),
                        seat_flags(accumulate=int(bool(accumulate))), (T, D))
    launch_put_rows(self.view(self.shape[0], D), idx, values2, bool(accumulate), config)
    return self


def index_put(self: torch.Tensor, indices, values: torch.Tensor, accumulate: bool = False) -> torch.Tensor:
    """aten.index_put: index_put_ on a copy."""
    _dim0_index("index_put", self, indices)
    out = launch.empty(self.shape, self.dtype, self.device)
    if self.numel():
        try:
            plan = copy_plan(tuple(self.shape), self.stride(), out.stride())
        except ValueError as e:
            raise KernelError(f"index_put: {e}") from None
        launch_copy_plan(self, out, plan, STAGING)
    return index_put_(out, indices, values, accumulate)


def gather(self: torch.Tensor, dim: int, index: torch.Tensor, *, sparse_grad: bool = False) -> torch.Tensor:
    """aten.gather: out[i][j] = self[i][index[i][j]] (dim 1), for ranks 1..4."""
    if not isinstance(self, torch.Tensor) or _NAMES.get(self.dtype) is None:
        raise KernelError(f"gather: dtype {getattr(self, 'dtype', None)} is not served")
    if not isinstance(index, torch.Tensor) or index.dtype != torch.int64 or index.device != self.device:
        raise KernelError("gather: an int64 index on self's device is served (torch raises otherwise)")
    if not 1 <= self.dim() <= 4 or index.dim() != self.dim():
        raise KernelError("gather: ranks 1..4 with an index of self's rank are served")
    if not -self.dim() <= dim < self.dim():
        raise KernelError(f"gather: dim {dim} out of range (torch raises)")
    dim %= self.dim()
    if any(i > s for d, (i, s) in enumerate(zip(index.shape, self.shape)) if d != dim):
        raise KernelError("gather: an index larger than self off its dim (torch raises)")
    semantics.check_indices("gather", index, self.shape[dim])
    out = launch.empty(index.shape, self.dtype, self.device)
    if out.numel() == 0:
        return out
    config = config_for(GATHER_SPEC, (_NAMES[self.dtype], "int64"), seat_flags(), (index.numel(),))
    launch_gather(self, dim, index, out, config)
    return out
