"""Advanced indexing by several integer tensors, or after whole leading dims:
`aten.index.Tensor` with 1 to 4 index tensors broadcast together, after p sliced dims (None
entries of its list; p = 0 needs 2 or more tensors, one is index_rows'): `x[i0, i1]` (a
padded batch's mask read at every (batch, key) pair,
`padding_mask[batch_idx[:, None, None, None], kv_idx]`) and `x[:, i]`.

The output is self's p sliced dims, the indices' broadcast shape B (rank <= 4), then self's
dims after the indexed ones, as torch's. A rows kernel over (T, D): T = P * |B| rows (P the
elements of the sliced dims), D the elements after (the sliced dims and the trailing ones
must each collapse to one stride); each program reads, per row, every index at its place
in B (strides, 0 where broadcast), wraps a negative one (advanced indexing counts from the
end) and adds it times self's stride of that dim. Exact: data movement.

Served from kernels/index.py's route: IndexSpec hands these rows and calls over. Not served
(to torch, counted): a None after an index tensor (torch moves the indexed dims first), a
bool mask (its shape is its count of true elements: a host read), mixed index dtypes, a
broadcast rank over 4. An index out of range raises torch's IndexError
(kernels/runtime/semantics.py).
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from nbx_tune.errors import KernelError
from nbx_tune.kernels.copy import strided_offsets
from nbx_tune.kernels.index import DATA_DTYPES, INDEX_DTYPES, ROW_CONFIGS, ROW_DEFAULTS, _data_values, dims4
from nbx_tune.kernels.rows import numel
from nbx_tune.kernels.runtime import launch, semantics
from nbx_tune.kernels.runtime.certified import config_for
from nbx_tune.kernels.spec import KernelSpec, KeyDim, NotServable, Problem, seat_flags

MAX_INDICES = 4
OP = "aten.index.Tensor"
_NAMES = {v: k for k, v in DATA_DTYPES.items()}
_INDEX_NAMES = {v: k for k, v in INDEX_DTYPES.items()}


@triton.jit
def _term(t, tm, idx_ptr, B1, B2, B3, S0, S1, S2, S3, V, SX):
    """Index tensor `idx_ptr`'s value at rows t (strides in the broadcast shape), wrapped
    where negative, times self's stride SX of its dim."""
    i = tl.load(idx_ptr + strided_offsets(t, 4, B1, B2, B3, S0, S1, S2, S3), mask=tm, other=0).to(tl.int64)
    return tl.where(i < 0, i + V, i) * SX


@triton.jit
def _index_nd_kernel(x_ptr, out_ptr, T, TB, D, SP, SD, B1, B2, B3,
                     i0_ptr, A0, A1, A2, A3, V0, X0,
                     i1_ptr, C0, C1, C2, C3, V1, X1,
                     i2_ptr, E0, E1, E2, E3, V2, X2,
                     i3_ptr, F0, F1, F2, F3, V3, X3,
                     K: tl.constexpr, OUTER: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """Row r of the output (r = p * TB + t: p over the sliced leading dims, stride SP; t over
    the broadcast index shape) is self's row at p and the K indices at t."""
    r = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    rm = r < T
    if OUTER:
        t = r % TB
        row = (r // TB) * SP
    else:
        t = r
        row = r * 0
    row += _term(t, rm, i0_ptr, B1, B2, B3, A0, A1, A2, A3, V0, X0)
    if K > 1:
        row += _term(t, rm, i1_ptr, B1, B2, B3, C0, C1, C2, C3, V1, X1)
    if K > 2:
        row += _term(t, rm, i2_ptr, B1, B2, B3, E0, E1, E2, E3, V2, X2)
    if K > 3:
        row += _term(t, rm, i3_ptr, B1, B2, B3, F0, F1, F2, F3, V3, X3)
    m = rm[:, None] & (d < D)[None, :]
    v = tl.load(x_ptr + row[:, None] + d[None, :].to(tl.int64) * SD, mask=m)
    tl.store(out_ptr + r[:, None] * D + d[None, :], v, mask=m)


_index_nd_kernel = launch.recorded(_index_nd_kernel)


def launch_index_nd(x, sliced: int, indices, out, config) -> None:
    """out (x.shape[:sliced] + B + x.shape[sliced + k:], contiguous) = x[:, ..., indices]:
    `sliced` whole leading dims, then k = len(indices) in 1..4 index tensors broadcast to B
    (rank <= 4), in range [-n, n) of their dims; the sliced dims and those after the indexed
    ones each collapse to one stride (`one_stride`)."""
    k = len(indices)
    shape = tuple(torch.broadcast_shapes(*(i.shape for i in indices)))
    TB, P = numel(shape), numel(x.shape[:sliced])
    D = numel(x.shape[sliced + k:])
    b1, b2, b3 = dims4(shape)
    args = []
    for j in range(MAX_INDICES):
        j = min(j, k - 1)  # unused slots repeat the last (K leaves them unread)
        _, _, _, s0, s1, s2, s3 = dims4(shape, indices[j].expand(shape).stride())
        args += [indices[j], s0, s1, s2, s3, x.shape[sliced + j], x.stride(sliced + j)]
    grid = (triton.cdiv(P * TB, config["BLOCK_T"]), triton.cdiv(D, config["BLOCK_D"]))
    _index_nd_kernel[grid](x, out, P * TB, TB, D, one_stride(x.shape[:sliced], x.stride()[:sliced]),
                           one_stride(x.shape[sliced + k:], x.stride()[sliced + k:]), b1, b2, b3, *args,
                           K=k, OUTER=sliced > 0, **config.kwargs)


def one_stride(sizes, strides) -> int:
    """The one stride of dims read as a single run (row-major); raises ValueError where
    they do not collapse to one (a transposed tail)."""
    stride, run = None, 1
    for size, s in reversed(list(zip(sizes, strides))):
        if size == 1:
            continue
        if stride is None:
            stride, run = s, size
        elif s != stride * run:
            raise ValueError("self's dims around the indexed ones do not collapse to one stride each")
        else:
            run *= size
    return 1 if stride is None else stride


def split_indices(indices) -> tuple[int, list] | str:
    """(leading None entries, the index tensors after them), or why not served."""
    sliced = 0
    while sliced < len(indices) and indices[sliced] is None:
        sliced += 1
    rest = list(indices[sliced:])
    if any(i is None for i in rest):
        return "index: a None (sliced) dim after an index tensor is not served"
    if not 1 <= len(rest) <= MAX_INDICES:
        return f"index: {len(rest)} index tensors (served: 1 to {MAX_INDICES})"
    return sliced, rest


def _broadcast(ishapes) -> tuple | str:
    """The index shapes' broadcast shape, or why not served."""
    try:
        shape = tuple(torch.broadcast_shapes(*ishapes))
    except RuntimeError:
        return "index: the index tensors do not broadcast (torch raises IndexError)"
    if len(shape) > 4:
        return f"index: a broadcast index of rank {len(shape)} (the kernel takes 4)"
    return shape


class IndexNdSpec(KernelSpec):
    name = "index_nd"
    ops = ("nbx_tune.index_nd",)  # rows of aten.index.Tensor reach it through index_rows' spec
    key = (KeyDim("T"), KeyDim("D", "row"))
    dtypes = tuple(DATA_DTYPES)
    exact = True
    description = ("advanced indexing by 1-4 broadcast integer tensors after whole leading dims: "
                   "x[i0, i1], x[:, i0]")
    config_space = ROW_CONFIGS
    default_configs = ROW_DEFAULTS

    def source_parts(self):
        return (_term, _index_nd_kernel, strided_offsets, launch_index_nd, dims4, one_stride)

    def problem_from_row(self, row):
        if row.op.removesuffix(".default") not in (OP, *self.ops):
            return NotServable(f"{row.op}: overload not served")
        k = len(row.shapes) - 1
        # the recorder writes the list (NonexTensor) where it holds a None, else k tensors
        entries = row.params.str("indices", "x".join(["Tensor"] * k)).split("x")
        split = split_indices([None if e == "None" else e for e in entries])
        if isinstance(split, str):
            return NotServable(split)
        sliced, rest = split
        if len(rest) != k or (k == 1 and not sliced):
            return NotServable(f"index: {k} index tensors, indices={row.params.str('indices', '')}: "
                               "not this family's (one tensor on dim 0 is index_rows')")
        data, idx = row.dtypes[0], set(row.dtypes[1:])
        if data not in DATA_DTYPES or len(idx) != 1 or not idx <= set(INDEX_DTYPES):
            return NotServable(f"index: a tensor of {', '.join(DATA_DTYPES)} indexed by tensors of one of "
                               f"{', '.join(INDEX_DTYPES)} expected")
        shape, ishapes = tuple(row.shapes[0]), tuple(tuple(s) for s in row.shapes[1:])
        if len(shape) < sliced + k:
            return NotServable("index: more indices than self has dims (torch raises)")
        b = _broadcast(ishapes)
        if isinstance(b, str):
            return NotServable(b)
        if not numel(b) or not numel(shape):
            return NotServable("index: an empty index or self: nothing to launch")
        return Problem(self.name, (data, idx.pop()), seat_flags(k=k, outer=int(sliced > 0)),
                       (numel(shape[:sliced]) * numel(b), numel(shape[sliced + k:])),
                       (("index_shapes", ishapes), ("shape", shape), ("sliced", sliced)))

    def input_shapes(self, problem):
        ishapes = problem.get("index_shapes")
        return {"x": (tuple(problem.get("shape")), problem.dtypes[0]),
                **{f"indices{j}": (tuple(s), problem.dtypes[1]) for j, s in enumerate(ishapes)}}

    def make_inputs(self, problem, rng):
        shape, p = tuple(problem.get("shape")), problem.get("sliced")
        out = {"x": (_data_values(rng, shape, problem.dtypes[0]), problem.dtypes[0])}
        for j, s in enumerate(problem.get("index_shapes")):  # negative ones too: they wrap
            n = shape[p + j]
            out[f"indices{j}"] = (rng.integers(-n, n, tuple(s)), problem.dtypes[1])
        return out

    def oracle(self, problem, inputs):
        shape, p = tuple(problem.get("shape")), problem.get("sliced")
        idx = tuple(np.asarray(inputs[f"indices{j}"]).reshape(tuple(s)) % shape[p + j]
                    for j, s in enumerate(problem.get("index_shapes")))
        return {"out": np.asarray(inputs["x"]).reshape(shape)[(slice(None),) * p + idx]}

    def _out_shape(self, problem):
        shape, ishapes, p = tuple(problem.get("shape")), problem.get("index_shapes"), problem.get("sliced")
        return (*shape[:p], *torch.broadcast_shapes(*ishapes), *shape[p + len(ishapes):])

    def output_specs(self, problem):
        return {"out": (self._out_shape(problem), problem.dtypes[0])}

    def launch(self, config, problem, inputs, outputs):
        ishapes = problem.get("index_shapes")
        launch_index_nd(inputs["x"].reshape(tuple(problem.get("shape"))), problem.get("sliced"),
                        [inputs[f"indices{j}"].reshape(tuple(s)) for j, s in enumerate(ishapes)],
                        outputs["out"], config)

    def serve_ops(self):
        return {}  # aten.index.Tensor's route is index_rows' (kernels/index.py), which hands over

    def example_rows(self, scale):
        from nbx_tune.kernels.rows import make_row

        # a padded batch's mask read, pairs, 3 and 4 broadcast indices, then x[:, i] and x[:, :, i0, i1]
        if scale == "small":
            cases = (((2, 7), ((2, 1, 1, 1), (1, 1, 1, 7)), 0), ((13, 9, 5), ((6,), (6,)), 0),
                     ((5, 4, 3, 2), ((7, 1), (1, 3), (7, 3)), 0), ((3, 4, 5, 6), ((2, 1), (1, 3), (2, 3), (1, 1)), 0),
                     ((4, 9, 5), ((6,),), 1), ((3, 2, 6, 5, 2), ((4, 1), (1, 3)), 2))
            dts = ("bool", "float32", "int64", "float16")
        else:
            cases = (((8, 4096), ((8, 1, 1, 1), (1, 1, 1, 4096)), 0), ((4096, 64, 128), ((3000,), (3000,)), 0),
                     ((64, 64, 4096), ((16, 1), (1, 64)), 0), ((8, 4096, 1024), ((2048,),), 1))
            dts = tuple(DATA_DTYPES)
        return [make_row(OP, [dt] + ["int32" if n == 1 else "int64"] * len(i_s), [s, *i_s],
                         {"indices": "x".join(["None"] * p + ["Tensor"] * len(i_s))} if p else None)
                for dt in dts for n, (s, i_s, p) in enumerate(cases)]


SPEC = IndexNdSpec()
SPECS = (SPEC,)


def index_nd(self: torch.Tensor, indices) -> torch.Tensor:
    """aten.index.Tensor with 1..4 integer index tensors after whole leading dims (None
    entries): self[i0, i1], self[:, i0]."""
    if not isinstance(self, torch.Tensor) or _NAMES.get(self.dtype) is None:
        raise KernelError(f"index: dtype {getattr(self, 'dtype', None)} is not served")
    split = split_indices(indices)
    if isinstance(split, str):
        raise KernelError(split)
    sliced, rest = split
    k = len(rest)
    dts = {i.dtype for i in rest}
    if len(dts) != 1 or not dts <= set(_INDEX_NAMES):
        raise KernelError(f"index: index dtypes {sorted(map(str, dts))} are not served "
                          "(one integer dtype; a mask goes to torch)")
    if any(i.device != self.device for i in rest):
        raise KernelError("index: an index on another device")
    if sliced + k > self.dim():
        raise KernelError(f"index: {sliced + k} indices for {self.dim()} dims (torch raises IndexError)")
    shape = _broadcast([i.shape for i in rest])
    if isinstance(shape, str):
        raise KernelError(shape)
    try:
        one_stride(self.shape[:sliced], self.stride()[:sliced])
        one_stride(self.shape[sliced + k:], self.stride()[sliced + k:])
    except ValueError as e:
        raise KernelError(f"index: {e}") from None
    for j, i in enumerate(rest):
        semantics.check_indices("index", i, self.shape[sliced + j], negative=True)
    out = launch.empty((*self.shape[:sliced], *shape, *self.shape[sliced + k:]), self.dtype, self.device)
    if out.numel() == 0:
        return out
    config = config_for(SPEC, (_NAMES[self.dtype], _INDEX_NAMES[dts.pop()]), seat_flags(k=k, outer=int(sliced > 0)),
                        (numel(self.shape[:sliced]) * numel(shape), numel(self.shape[sliced + k:])))
    launch_index_nd(self, sliced, rest, out, config)
    return out
