"""Embedding lookup (`aten.embedding`): out[t, :] = weight[indices[t], :].

A 2-D grid: BLOCK_T indices by BLOCK_D columns per program; the indices are loaded once per
program and the rows gathered with their stride, so a weight whose rows are not contiguous
with each other (a slice of a larger table) needs no copy. Launch key: the number of
indices T (the `default` ladder: 1 for a decode step, the sequence for a prefill) and the
row length D (the `row` ladder). Exact: a gather, checked bit for bit.

Indices must lie in [0, V): the kernel does not check, `embedding` does before each launch
(a replay too: kernels/semantics.py), on the host under the interpreter, with a device
assert on a GPU as torch's CUDA embedding does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nbx_tune.errors import KernelError
from nbx_tune.kernels.runtime import launch, semantics
from nbx_tune.kernels.runtime.certified import config_for
from nbx_tune.kernels.helpers import FLOATS, torch_dtypes
from nbx_tune.kernels.rows import numel
from nbx_tune.kernels.spec import Config, KernelSpec, KeyDim, NotServable, Problem, seat_flags, uniform_inputs
from nbx_tune.oracles import movement as oracle

WEIGHT_DTYPES = torch_dtypes(*FLOATS)
INDEX_DTYPES = torch_dtypes("int64", "int32")
_NAMES = {v: k for k, v in {**WEIGHT_DTYPES, **INDEX_DTYPES}.items()}


@triton.jit
def _embedding_kernel(w_ptr, idx_ptr, out_ptr, T, D, stride_w,
                      BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    pid_t = tl.program_id(0)
    pid_d = tl.program_id(1)
    t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    tm = t < T
    m = tm[:, None] & (d < D)[None, :]
    row = tl.load(idx_ptr + t, mask=tm, other=0).to(tl.int64)
    v = tl.load(w_ptr + row[:, None] * stride_w + d[None, :], mask=m)
    tl.store(out_ptr + t.to(tl.int64)[:, None] * D + d[None, :], v, mask=m)


_embedding_kernel = launch.recorded(_embedding_kernel)  # its calls are replayed (kernels/runtime/launch.py)


def launch_embedding(weight, indices, out, config: Config) -> None:
    """out (T x D, contiguous) = weight[indices]; weight's rows contiguous (stride(1) == 1),
    indices contiguous."""
    T, D = indices.numel(), weight.shape[1]
    grid = (triton.cdiv(T, config["BLOCK_T"]), triton.cdiv(D, config["BLOCK_D"]))
    _embedding_kernel[grid](weight, indices, out, T, D, weight.stride(0), **config.kwargs)


def _c(bt, bd, warps):
    return Config.make(BLOCK_T=bt, BLOCK_D=bd, num_warps=warps, num_stages=1)


# Many indices per program for long rows of few tokens and the reverse: a decode step (T=1)
# wants the row spread over programs, a prefill wants several rows per program.
CONFIGS = (_c(1, 1024, 4), _c(4, 256, 4), _c(8, 512, 8), _c(16, 128, 4), _c(32, 64, 4))
DEFAULTS = (_c(4, 256, 4),)


class EmbeddingSpec(KernelSpec):
    name = "embedding"
    ops = ("aten.embedding",)
    key = (KeyDim("T"), KeyDim("D", "row"))
    dtypes = tuple(WEIGHT_DTYPES)
    exact = True
    description = "embedding lookup: rows of a table by index"

    config_space = CONFIGS
    default_configs = DEFAULTS

    def source_parts(self):
        return (_embedding_kernel, launch_embedding)

    def problem_from_row(self, row):
        if row.op.removesuffix(".default") != "aten.embedding":
            return NotServable(f"{row.op}: overload not served")
        if len(row.shapes) != 2:
            return NotServable(f"aten.embedding takes two tensors, the row has {len(row.shapes)}")
        unknown = set(row.params) - {"padding_idx", "scale_grad_by_freq", "sparse"}
        if unknown:
            return NotServable(f"aten.embedding: unsupported params {', '.join(sorted(unknown))}")
        (w_dt, i_dt), (w_shape, i_shape) = row.dtypes, row.shapes
        if w_dt not in WEIGHT_DTYPES:
            return NotServable(f"weight dtype {w_dt} is not served ({', '.join(WEIGHT_DTYPES)})")
        if i_dt not in INDEX_DTYPES:
            return NotServable(f"index dtype {i_dt} is not served ({', '.join(INDEX_DTYPES)})")
        if len(w_shape) != 2:
            return NotServable(f"a weight of rank {len(w_shape)} (2 expected)")
        T, (V, D) = numel(i_shape), w_shape
        if T == 0 or D == 0 or V == 0:
            return NotServable("an empty lookup: nothing to launch")
        return Problem(self.name, (w_dt, i_dt), seat_flags(), (T, D),
                       (("V", V), ("index_shape", tuple(i_shape))))

    def input_shapes(self, problem):
        T, D = problem.dims
        return {"weight": ((problem.get("V"), D), problem.dtypes[0]),
                "indices": (tuple(problem.get("index_shape")), problem.dtypes[1])}

    def make_inputs(self, problem, rng):
        T, D = problem.dims
        V = problem.get("V")
        # A gather is checked bit for bit, so any distinct values do: float32 uniforms cost a
        # fraction of the normal float64 draw of a 128k-vocabulary table.
        return {"weight": (uniform_inputs(rng, (V, D)), problem.dtypes[0]),
                "indices": (rng.integers(0, V, tuple(problem.get("index_shape"))), problem.dtypes[1])}

    def oracle(self, problem, inputs):
        T, D = problem.dims
        w = inputs["weight"].reshape(problem.get("V"), D)
        idx = inputs["indices"].reshape(tuple(problem.get("index_shape")))
        return {"out": oracle.embedding(w, idx)}

    def output_specs(self, problem):
        return {"out": ((*problem.get("index_shape"), problem.dims[1]), problem.dtypes[0])}

    def serve_ops(self):
        return {"aten.embedding": embedding}

    def launch(self, config, problem, inputs, outputs):
        T, D = problem.dims
        launch_embedding(inputs["weight"].reshape(problem.get("V"), D), inputs["indices"],
                         outputs["out"], config)

    def example_rows(self, scale):
        from nbx_tune.kernels.rows import make_row

        if scale == "small":
            dts = ("float16", "float32")
            cases = (((37, 45), (1, 13)), ((300, 64), (1,)), ((5, 3), (2, 7, 3)))
        else:
            dts = tuple(WEIGHT_DTYPES)
            # tables cut down from Llama's and GPT-2's: the host's fp64 oracle copies the whole table
            cases = (((4000, 4096), (1, 512)), ((50257, 128), (1, 1)), ((1024, 768), (8, 1023)))
        rows = []
        for dt in dts:
            for i, (w, idx) in enumerate(cases):
                rows.append(make_row("aten.embedding", [dt, "int32" if i == 2 else "int64"], [w, idx]))
        return rows


SPEC = EmbeddingSpec()
SPECS = (SPEC,)


def embedding(weight: torch.Tensor, indices: torch.Tensor, padding_idx: int = -1,
              scale_grad_by_freq: bool = False, sparse: bool = False) -> torch.Tensor:
    """aten.embedding: weight[indices] (padding_idx and the rest concern only the gradient)."""
    try:  # the direct launch (kernels/runtime/launch.py)
        key = (SPEC, *launch.tensor_key(weight), *launch.tensor_key(indices))
    except AttributeError:
        raise KernelError("embedding: weight and indices must be tensors") from None
    if weight.dim() == 2 and indices.dtype in (torch.int64, torch.int32):  # before any replay
        semantics.check_indices("embedding", indices, weight.shape[0])
    hit = REMEMBERED.get(key)
    if hit is not None:
        return hit(weight, indices)
    return launch.remember(key, (weight, indices), _embedding_call, weight, indices)


REMEMBERED = launch.REMEMBERED


def _embedding_call(weight: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    w_dt, i_dt = _NAMES.get(weight.dtype), _NAMES.get(indices.dtype)
    if w_dt not in WEIGHT_DTYPES or i_dt not in INDEX_DTYPES:
        raise KernelError(f"embedding: dtypes {weight.dtype}, {indices.dtype} are not served "
                          f"(weight {', '.join(WEIGHT_DTYPES)}; indices {', '.join(INDEX_DTYPES)})")
    if weight.dim() != 2:
        raise KernelError(f"embedding: a weight of rank {weight.dim()} (2 expected)")
    if weight.stride(1) != 1:
        weight = weight.contiguous()
    indices = indices.contiguous()
    out = launch.empty((*indices.shape, weight.shape[1]), weight.dtype, weight.device)
    if out.numel() == 0:
        return out
    config = config_for(SPEC, (w_dt, i_dt), seat_flags(), (indices.numel(), weight.shape[1]))
    launch_embedding(weight, indices, out, config)
    return out
