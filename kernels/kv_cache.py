"""A KV cache's two cats in one launch (`nbx_tune.cat_kv`): transformers' DynamicLayer.update
grows the keys and the values by a step's states, `cat([keys, k], -2)` and `cat([values,
v], -2)`, two launches a layer that a decode step pays 32 times over. Exact, in fp16, bf16,
fp32 and int64.

Each cat is the cat family's two-input pass (`kernels/copy.py`: the output as rows, a
program writing a tile of them, each column from the first input or the second), the keys'
tiles in the first programs and the values' after them. Where a cat is not two non-empty
inputs laid out as rows (a prefill's first step cats an empty cache: a copy), both are
written the cat family's way, one launch per input.

Launch key: the element count of both outputs on the `elements` ladder.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nbx_tune.errors import KernelError
from nbx_tune.kernels.serving import custom_ops  # noqa: F401  (defines the torch op serve_ops names)
from nbx_tune.kernels.runtime import launch
from nbx_tune.kernels.runtime.certified import config_for
from nbx_tune.kernels.copy import (CAT_SPEC, CONFIGS, DEFAULTS, INDEX_LIMIT, TORCH_DTYPES, _inputs_of, _legacy_empty,
                                   _one_launch, block_start, cat2_tile, cat_shape, launch_cat, row_stride)
from nbx_tune.kernels.rows import format_shape, numel
from nbx_tune.kernels.spec import KernelSpec, KeyDim, NotServable, Problem, seat_flags
from nbx_tune.oracles import movement as oracle

OP = "nbx_tune.cat_kv"
_NAMES = {v: k for k, v in TORCH_DTYPES.items()}
_FLAGS = seat_flags()


@triton.jit
def _cat2_tile(x0_ptr, x1_ptr, y_ptr, pid, rows, inner0, inner1, rs0, rs1, col_blocks,
               INT64: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    """Tile `pid` of y = cat(x0, x1), y contiguous rows of inner0 + inner1 elements: the cat
    family's `_cat2_kernel` as a function (that kernel's source is part of the cat family's
    certified hash, so it is not rewritten to call this)."""
    pid_r = pid // col_blocks
    c = (pid - pid_r * col_blocks) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    r = block_start(pid_r, BLOCK_ROWS, INT64) + tl.arange(0, BLOCK_ROWS)
    width = inner0 + inner1
    in_rows = (r < rows)[:, None]
    first = (c < inner0)[None, :]
    second = ((c >= inner0) & (c < width))[None, :]
    a = tl.load(x0_ptr + (r[:, None] * rs0 + c[None, :]), mask=in_rows & first)
    b = tl.load(x1_ptr + (r[:, None] * rs1 + (c - inner0)[None, :]), mask=in_rows & second)
    tl.store(y_ptr + (r[:, None] * width + c[None, :]), tl.where(first, a, b), mask=in_rows & (first | second))


@triton.jit
def _cat_pair_kernel(k0_ptr, k1_ptr, k_ptr, k_rows, k_inner0, k_inner1, k_rs0, k_rs1, k_col_blocks, K_PROGRAMS,
                     v0_ptr, v1_ptr, v_ptr, v_rows, v_inner0, v_inner1, v_rs0, v_rs1, v_col_blocks,
                     INT64: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    """k = cat(k0, k1) in the first K_PROGRAMS programs, v = cat(v0, v1) in the rest."""
    pid = tl.program_id(0)
    if pid < K_PROGRAMS:
        _cat2_tile(k0_ptr, k1_ptr, k_ptr, pid, k_rows, k_inner0, k_inner1, k_rs0, k_rs1, k_col_blocks,
                   INT64, BLOCK_ROWS, BLOCK_COLS)
    else:
        _cat2_tile(v0_ptr, v1_ptr, v_ptr, pid - K_PROGRAMS, v_rows, v_inner0, v_inner1, v_rs0, v_rs1, v_col_blocks,
                   INT64, BLOCK_ROWS, BLOCK_COLS)


_cat_pair_kernel = launch.recorded(_cat_pair_kernel)  # its calls are replayed (kernels/runtime/launch.py)


def _geometry(x0, x1, out, dim: int, block: int):
    """The `_cat2_tile` arguments of out = cat((x0, x1), dim), and its program count."""
    after = numel(tuple(out.shape)[dim + 1:])
    rows = numel(tuple(out.shape)[:dim])
    inner = [x.shape[dim] * after for x in (x0, x1)]
    rs = [row_stride(tuple(x.shape), x.stride(), dim) for x in (x0, x1)]
    width = inner[0] + inner[1]
    br, bc = cat2_tile(rows, width, block)
    extent = (rows + br) * max(width, *rs) + width  # past every offset formed, masked rows included
    col_blocks = triton.cdiv(width, bc)
    return (rows, inner[0], inner[1], rs[0], rs[1], col_blocks), triton.cdiv(rows, br) * col_blocks, (br, bc), extent


def _one_pass(x0, x1, out, dim: int) -> bool:
    """cat((x0, x1), dim) is one `_cat2_tile` pass: both non-empty, laid out as rows."""
    return x0.numel() > 0 and x1.numel() > 0 and out.is_contiguous() and _one_launch(x0, dim) and _one_launch(x1, dim)


def launch_cat_kv(k0, k1, v0, v1, k_out, v_out, dim: int, config) -> None:
    """k_out = cat((k0, k1), dim) and v_out = cat((v0, v1), dim): one launch where both are a
    two-input pass with one tile shape, else each the cat family's way."""
    dim = dim % k_out.dim()
    if _one_pass(k0, k1, k_out, dim) and _one_pass(v0, v1, v_out, dim):
        k_args, k_programs, k_tile, k_extent = _geometry(k0, k1, k_out, dim, config["BLOCK_SIZE"])
        v_args, v_programs, v_tile, v_extent = _geometry(v0, v1, v_out, dim, config["BLOCK_SIZE"])
        if k_tile == v_tile:
            _cat_pair_kernel[(k_programs + v_programs,)](
                k0, k1, k_out, *k_args, k_programs, v0, v1, v_out, *v_args,
                INT64=max(k_extent, v_extent) > INDEX_LIMIT, BLOCK_ROWS=k_tile[0], BLOCK_COLS=k_tile[1],
                num_warps=config.num_warps, num_stages=config.num_stages)
            return
    launch_cat((k0, k1), k_out, dim, config)
    launch_cat((v0, v1), v_out, dim, config)


class CatKVSpec(KernelSpec):
    name = "cat_kv"
    ops = (OP,)
    key = (KeyDim("N", "elements"),)
    dtypes = tuple(TORCH_DTYPES)
    exact = True
    description = "a KV cache's keys and values grown by a step's states, in one launch"

    config_space = CONFIGS
    default_configs = DEFAULTS

    def source_parts(self):  # the cat family's, for the cats written its way
        return (_cat2_tile, _cat_pair_kernel, _geometry, _one_pass, launch_cat_kv, *CAT_SPEC.source_parts())

    def problem_from_row(self, row):
        if row.op.removesuffix(".default") != OP:
            return NotServable(f"{row.op}: overload not served")
        if len(row.shapes) != 4:
            return NotServable(f"{OP} takes 4 tensors, the row has {len(row.shapes)}")
        unknown = set(row.params) - {"dim"}
        if unknown:
            return NotServable(f"{OP}: unsupported params {', '.join(sorted(unknown))}")
        if len(set(row.dtypes)) != 1:
            return NotServable(f"{OP} of mixed dtypes {', '.join(row.dtypes)} is not served")
        dt = row.dtypes[0]
        if dt not in TORCH_DTYPES:
            return NotServable(f"dtype {dt} is not served ({', '.join(TORCH_DTYPES)})")
        try:
            dim = row.params.int("dim", None)
        except ValueError as e:
            return NotServable(f"bad dim: {e}")
        if dim is None:
            return NotServable(f"{OP} row without dim")
        shapes = tuple(tuple(s) for s in row.shapes)
        outs = [cat_shape(pair, dim) for pair in (shapes[:2], shapes[2:])]
        for got in outs:
            if isinstance(got, str):
                return NotServable(got)
        (k_shape, dim), (v_shape, _) = outs
        n = numel(k_shape) + numel(v_shape)
        if n == 0:
            return NotServable("empty outputs: nothing to launch")
        return Problem(self.name, (dt,), _FLAGS, (n,),
                       (("dim", dim), ("out_shapes", (tuple(k_shape), tuple(v_shape))), ("shapes", shapes)))

    def input_shapes(self, problem):
        names = ("keys", "key_states", "values", "value_states")
        return {n: (s, problem.dtypes[0]) for n, s in zip(names, problem.get("shapes"))}

    def make_inputs(self, problem, rng):
        return {name: (_inputs_of(dt, shape, rng), dt) for name, (shape, dt) in self.input_shapes(problem).items()}

    def oracle(self, problem, inputs):
        xs = {n: inputs[n].reshape(s) for n, (s, _) in self.input_shapes(problem).items()}
        dim = problem.get("dim")
        return {"keys_out": oracle.cat([xs["keys"], xs["key_states"]], dim),
                "values_out": oracle.cat([xs["values"], xs["value_states"]], dim)}

    def output_specs(self, problem):
        k, v = problem.get("out_shapes")
        return {"keys_out": (tuple(k), problem.dtypes[0]), "values_out": (tuple(v), problem.dtypes[0])}

    def serve_ops(self):
        return {OP: cat_kv}

    def launch(self, config, problem, inputs, outputs):
        xs = {n: inputs[n].reshape(s) for n, (s, _) in self.input_shapes(problem).items()}
        launch_cat_kv(xs["keys"], xs["key_states"], xs["values"], xs["value_states"], outputs["keys_out"],
                      outputs["values_out"], problem.get("dim"), config)

    def example_rows(self, scale):
        from nbx_tune.kernels.rows import make_row

        if scale == "small":  # a decode step (a grouped-query cache), a prefill's empty cache, an odd width
            dts = ("float16", "float32", "int64")
            cases = (((2, 2, 6, 5), (2, 2, 1, 5)), ((0,), (1, 2, 7, 5)), ((3, 1, 9, 3), (3, 1, 2, 3)))
        else:  # Llama-2-7B's decode step at a batch of 8 and 2048 cached, Llama-3's 8 KV heads, a prefill
            dts = tuple(TORCH_DTYPES)
            cases = (((8, 32, 2048, 128), (8, 32, 1, 128)), ((16, 8, 4096, 128), (16, 8, 1, 128)),
                     ((0,), (1, 8, 1000, 128)), ((3, 2, 1001, 96), (3, 2, 1, 96)))
        return [make_row(OP, [dt] * 4, [c, s, c, s], {"dim": "-2"}) for dt in dts for c, s in cases]


SPEC = CatKVSpec()
SPECS = (SPEC,)


# ----------------------------------------------------------------------------- public op

REMEMBERED = launch.REMEMBERED


def cat_kv(keys: torch.Tensor, key_states: torch.Tensor, values: torch.Tensor, value_states: torch.Tensor,
           dim: int):
    """(cat([keys, key_states], dim), cat([values, value_states], dim)): one dtype (fp16,
    bf16, fp32, int64); an empty cache is a legacy 1-D empty tensor, as torch.cat skips."""
    try:  # the direct launch (kernels/runtime/launch.py)
        key = (SPEC, dim, *launch.tensor_key(keys), *launch.tensor_key(key_states), *launch.tensor_key(values),
               *launch.tensor_key(value_states))
    except AttributeError:
        raise KernelError("cat_kv: the operands must be tensors") from None
    hit = REMEMBERED.get(key)
    if hit is not None:
        return hit(keys, key_states, values, value_states)
    return launch.remember(key, (keys, key_states, values, value_states), _cat_kv_call, keys, key_states, values,
                           value_states, dim)


def _cat_kv_call(keys, key_states, values, value_states, dim):
    ts = (keys, key_states, values, value_states)
    if len({t.dtype for t in ts}) != 1 or keys.dtype not in _NAMES:
        raise KernelError(f"cat_kv: dtypes {', '.join(str(t.dtype) for t in ts)}: one of "
                          f"{', '.join(TORCH_DTYPES)} expected")
    outs = []
    for pair in ((keys, key_states), (values, value_states)):
        got = cat_shape([tuple(t.shape) for t in pair], dim)
        if isinstance(got, str):
            raise KernelError(f"cat_kv: {got}")
        shape, d = got
        devices = {t.device for t in pair if not _legacy_empty(tuple(t.shape))}
        if len(devices) != 1:
            raise KernelError(f"cat_kv: {format_shape(pair[0].shape)} and {format_shape(pair[1].shape)} on "
                              f"{len(devices) or 'no'} devices")
        outs.append(launch.empty(shape, keys.dtype, devices.pop()))
    k_out, v_out = outs
    n = k_out.numel() + v_out.numel()
    if n:
        launch_cat_kv(keys, key_states, values, value_states, k_out, v_out, d,
                      config_for(SPEC, (_NAMES[keys.dtype],), _FLAGS, (n,)))
    return k_out, v_out
