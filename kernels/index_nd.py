"""Advanced indexing by several integer tensors: `aten.index.Tensor` with 2 to 4 index
tensors on self's leading dims, broadcast together (`x[i0, i1]`): a padded batch's mask
read at every (batch, key) pair, `padding_mask[batch_idx[:, None, None, None], kv_idx]`.

The output is the indices' broadcast shape B (rank <= 4) followed by self's dims after the
k indexed ones, as torch's. A rows kernel over (T, D): T the elements of B, D those of
self's remaining dims (one stride: collapsible); each program reads, per row t, every
index at t (its strides in B, 0 where broadcast), wraps a negative one (advanced indexing
counts from the end) and adds it times self's stride of that dim. Exact: data movement.

Served from kernels/index.py's route (one index tensor is its `index_rows`); a row of more
index tensors reaches this family the same way (IndexSpec hands it over). Not served (to
torch, counted): a None (sliced) dim among the indices, a bool mask (its shape is its
count of true elements: a host read), mixed index dtypes, a broadcast rank over 4. An
index out of range raises torch's IndexError (kernels/runtime/semantics.py).
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
def _index_nd_kernel(x_ptr, out_ptr, T, D, SD, B1, B2, B3,
                     i0_ptr, A0, A1, A2, A3, V0, X0,
                     i1_ptr, C0, C1, C2, C3, V1, X1,
                     i2_ptr, E0, E1, E2, E3, V2, X2,
                     i3_ptr, F0, F1, F2, F3, V3, X3,
                     K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    t = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    tm = t < T
    row = _term(t, tm, i0_ptr, B1, B2, B3, A0, A1, A2, A3, V0, X0)
    row += _term(t, tm, i1_ptr, B1, B2, B3, C0, C1, C2, C3, V1, X1)
    if K > 2:
        row += _term(t, tm, i2_ptr, B1, B2, B3, E0, E1, E2, E3, V2, X2)
    if K > 3:
        row += _term(t, tm, i3_ptr, B1, B2, B3, F0, F1, F2, F3, V3, X3)
    m = tm[:, None] & (d < D)[None, :]
    v = tl.load(x_ptr + row[:, None] + d[None, :].to(tl.int64) * SD, mask=m)
    tl.store(out_ptr + t[:, None] * D + d[None, :], v, mask=m)


_index_nd_kernel = launch.recorded(_index_nd_kernel)


def launch_index_nd(x, indices, out, config) -> None:
    """out (B + x.shape[k:], contiguous) = x[indices]: k = len(indices) in 2..4 index
    tensors on x's leading dims, broadcast to B (rank <= 4), in range [-n, n) of their dim;
    x's dims after the k collapse to one stride (`rest_stride`)."""
    k = len(indices)
    shape = tuple(torch.broadcast_shapes(*(i.shape for i in indices)))
    T = numel(shape)
    D = numel(x.shape[k:])
    b1, b2, b3 = dims4(shape)
    args = []
    for j in range(MAX_INDICES):
        i = indices[min(j, k - 1)]  # unused slots repeat the last (K leaves them unread)
        _, _, _, s0, s1, s2, s3 = dims4(shape, i.expand(shape).stride())
        args += [i, s0, s1, s2, s3, x.shape[min(j, k - 1)], x.stride(min(j, k - 1))]
    grid = (triton.cdiv(T, config["BLOCK_T"]), triton.cdiv(D, config["BLOCK_D"]))
    _index_nd_kernel[grid](x, out, T, D, rest_stride(x, k), b1, b2, b3, *args, K=k, **config.kwargs)


def rest_stride(x, k: int) -> int:
    """The one stride of x's dims after the first k, read as a run of D elements; raises
    ValueError where they do not collapse to one (a transposed tail)."""
    stride, run = None, 1
    for size, s in reversed(list(zip(x.shape[k:], x.stride()[k:]))):
        if size == 1:
            continue
        if stride is None:
            stride, run = s, size
        elif s != stride * run:
            raise ValueError("self's dims after the indexed ones do not collapse to one stride")
        else:
            run *= size
    return 1 if stride is None else stride


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
    description = "advanced indexing by 2-4 broadcast integer tensors on the leading dims: x[i0, i1]"
    config_space = ROW_CONFIGS
    default_configs = ROW_DEFAULTS

    def source_parts(self):
        return (_term, _index_nd_kernel, strided_offsets, launch_index_nd, dims4, rest_stride)

    def problem_from_row(self, row):
        if row.op.removesuffix(".default") not in (OP, *self.ops):
            return NotServable(f"{row.op}: overload not served")
        k = len(row.shapes) - 1
        if "None" in row.params.str("indices", ""):  # the recorder writes the list where it holds a None
            return NotServable("index: a None (sliced) dim among the indices is not served")
        if not 2 <= k <= MAX_INDICES:
            return NotServable(f"index: {k} index tensors (this family takes 2 to {MAX_INDICES})")
        data, idx = row.dtypes[0], set(row.dtypes[1:])
        if data not in DATA_DTYPES or len(idx) != 1 or not idx <= set(INDEX_DTYPES):
            return NotServable(f"index: a tensor of {', '.join(DATA_DTYPES)} indexed by tensors of one of "
                               f"{', '.join(INDEX_DTYPES)} expected")
        shape, ishapes = tuple(row.shapes[0]), tuple(tuple(s) for s in row.shapes[1:])
        if len(shape) < k:
            return NotServable("index: more index tensors than self has dims (torch raises)")
        b = _broadcast(ishapes)
        if isinstance(b, str):
            return NotServable(b)
        if not numel(b) or not numel(shape):
            return NotServable("index: an empty index or self: nothing to launch")
        return Problem(self.name, (data, idx.pop()), seat_flags(k=k), (numel(b), numel(shape[k:])),
                       (("index_shapes", ishapes), ("shape", shape)))

    def input_shapes(self, problem):
        ishapes = problem.get("index_shapes")
        return {"x": (tuple(problem.get("shape")), problem.dtypes[0]),
                **{f"indices{j}": (tuple(s), problem.dtypes[1]) for j, s in enumerate(ishapes)}}

    def make_inputs(self, problem, rng):
        shape = tuple(problem.get("shape"))
        out = {"x": (_data_values(rng, shape, problem.dtypes[0]), problem.dtypes[0])}
        for j, s in enumerate(problem.get("index_shapes")):  # negative ones too: they wrap
            out[f"indices{j}"] = (rng.integers(-shape[j], shape[j], tuple(s)), problem.dtypes[1])
        return out

    def oracle(self, problem, inputs):
        shape = tuple(problem.get("shape"))
        ishapes = problem.get("index_shapes")
        idx = tuple(np.asarray(inputs[f"indices{j}"]).reshape(tuple(s)) % shape[j] for j, s in enumerate(ishapes))
        return {"out": np.asarray(inputs["x"]).reshape(shape)[idx]}

    def _out_shape(self, problem):
        shape, ishapes = tuple(problem.get("shape")), problem.get("index_shapes")
        return (*torch.broadcast_shapes(*ishapes), *shape[len(ishapes):])

    def output_specs(self, problem):
        return {"out": (self._out_shape(problem), problem.dtypes[0])}

    def launch(self, config, problem, inputs, outputs):
        ishapes = problem.get("index_shapes")
        launch_index_nd(inputs["x"].reshape(tuple(problem.get("shape"))),
                        [inputs[f"indices{j}"].reshape(tuple(s)) for j, s in enumerate(ishapes)],
                        outputs["out"], config)

    def serve_ops(self):
        return {}  # aten.index.Tensor's route is index_rows' (kernels/index.py), which hands over

    def example_rows(self, scale):
        from nbx_tune.kernels.rows import make_row

        if scale == "small":  # a padded batch's mask read, a gather of pairs, odd shapes, 3 and 4 indices
            cases = (((2, 7), ((2, 1, 1, 1), (1, 1, 1, 7))), ((13, 9, 5), ((6,), (6,))),
                     ((5, 4, 3, 2), ((7, 1), (1, 3), (7, 3))), ((3, 4, 5, 6), ((2, 1), (1, 3), (2, 3), (1, 1))))
            dts = ("bool", "float32", "int64", "float16")
        else:
            cases = (((8, 4096), ((8, 1, 1, 1), (1, 1, 1, 4096))), ((4096, 64, 128), ((3000,), (3000,))),
                     ((64, 64, 4096), ((16, 1), (1, 64))))
            dts = tuple(DATA_DTYPES)
        return [make_row(OP, [dt] + ["int32" if n == 1 else "int64"] * len(i_s), [s, *i_s])
                for dt in dts for n, (s, i_s) in enumerate(cases)]


SPEC = IndexNdSpec()
SPECS = (SPEC,)


def index_nd(self: torch.Tensor, indices) -> torch.Tensor:
    """aten.index.Tensor with 2..4 integer index tensors on self's leading dims: self[i0, i1, ...]."""
    if not isinstance(self, torch.Tensor) or _NAMES.get(self.dtype) is None:
        raise KernelError(f"index: dtype {getattr(self, 'dtype', None)} is not served")
    k = len(indices)
    if not 2 <= k <= MAX_INDICES:
        raise KernelError(f"index: {k} index tensors (served: 1 to {MAX_INDICES})")
    if any(i is None for i in indices):
        raise KernelError("index: a None (sliced) dim among the indices is not served")
    dts = {i.dtype for i in indices}
    if len(dts) != 1 or not dts <= set(_INDEX_NAMES):
        raise KernelError(f"index: index dtypes {sorted(map(str, dts))} are not served "
                          "(one integer dtype; a mask goes to torch)")
    if any(i.device != self.device for i in indices):
        raise KernelError("index: an index on another device")
    if k > self.dim():
        raise KernelError(f"index: {k} indices for {self.dim()} dims (torch raises IndexError)")
    shape = _broadcast([i.shape for i in indices])
    if isinstance(shape, str):
        raise KernelError(shape)
    try:
        rest_stride(self, k)
    except ValueError as e:
        raise KernelError(f"index: {e}") from None
    for j, i in enumerate(indices):
        semantics.check_indices("index", i, self.shape[j], negative=True)
    out = launch.empty((*shape, *self.shape[k:]), self.dtype, self.device)
    if out.numel() == 0:
        return out
    config = config_for(SPEC, (_NAMES[self.dtype], _INDEX_NAMES[dts.pop()]), seat_flags(k=k),
                        (numel(shape), numel(self.shape[k:])))
    launch_index_nd(self, indices, out, config)
    return out

