"""Copies: dtype casts (`aten._to_copy`), clones and `copy_`, and `aten.cat`, on one
strided copy kernel.

`copy` serves `_to_copy` / `clone` / `copy_`: out[i] = x[i] converted to out's dtype, any
strides on either side (a clone of a transposed tensor, `.contiguous()`, a broadcast
`copy_`). `cat` of two non-empty inputs laid out as rows of contiguous elements (contiguous
ones, rotary's halves of a contiguous tensor, a KV cache grown by a token) writes the whole
output in one launch of `_cat2_kernel`, in 2-D tiles; any other cat writes each
input into its slice of the output with the copy kernel, one launch per non-empty input
(torch skips legacy 1-D empty inputs, and so does `cat`).

Launch key: the element count on the `elements` ladder (of the output, for `cat`); the
layout (`flat`: both sides contiguous alike; `strided`: indexed through merged strides) is
a flag, because it changes the code. Both specs are exact: a copy or a cast has one right
answer (round to nearest even), checked bit for bit in every dtype.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from nbx_tune.errors import KernelError
from nbx_tune.kernels.runtime import launch, semantics
from nbx_tune.kernels.runtime.certified import config_for
from nbx_tune.kernels.helpers import FLOATS, contiguous_strides, torch_dtypes
from nbx_tune.kernels.rows import format_shape, numel
from nbx_tune.kernels.spec import Config, KernelSpec, KeyDim, NotServable, Problem, seat_flags, wide_range_inputs
from nbx_tune.oracles import movement as oracle

FLOAT_DTYPES = torch_dtypes(*FLOATS)
INT_DTYPES = torch_dtypes("int32", "int64")
TORCH_DTYPES = torch_dtypes(*FLOATS, "int32", "int64", "bool")
_NAMES = {v: k for k, v in TORCH_DTYPES.items()}
INDEX_LIMIT = 2**31 - 2**17  # beyond this offsets are computed in int64
MAX_RANK = 4  # dims after merging


# ----------------------------------------------------------------------------- device code


@triton.jit
def block_start(blk, BLOCK_SIZE: tl.constexpr, INT64: tl.constexpr):
    """Index of block `blk`'s first element, in int64 where offsets may pass int32 (the
    launcher's INT64: sizes over INDEX_LIMIT)."""
    if INT64:
        start = blk.to(tl.int64) * BLOCK_SIZE
    else:
        start = blk * BLOCK_SIZE
    return start


@triton.jit
def strided_offsets(offs, NDIM: tl.constexpr, D1, D2, D3, S0, S1, S2, S3):
    """Offsets of row-major element indices `offs` in a tensor of NDIM merged dims (at most
    4, `copy_plan`'s): sizes D1..D3 of the innermost dims (D1 innermost), S1..S3 their
    strides, S0 the outermost's. Two calls on one `offs` share their divisions (CSE)."""
    rem = offs
    off = offs * 0
    if NDIM > 1:
        i = rem % D1
        rem = rem // D1
        off += i * S1
    if NDIM > 2:
        i = rem % D2
        rem = rem // D2
        off += i * S2
    if NDIM > 3:
        i = rem % D3
        rem = rem // D3
        off += i * S3
    return off + rem * S0


@triton.jit
def _copy_kernel(x_ptr, y_ptr, n, D1, D2, D3,
                 SX0, SX1, SX2, SX3, SY0, SY1, SY2, SY3,
                 NDIM: tl.constexpr, FLAT: tl.constexpr, INT64: tl.constexpr,
                 BLOCK_SIZE: tl.constexpr):
    """y[i] = x[i] cast to y's dtype. FLAT: both contiguous alike. Else element i of the
    merged shape is decomposed over D1..D3 (innermost first); SX/SY are the strides, S?0
    the outermost dim's."""
    offs = block_start(tl.program_id(0), BLOCK_SIZE, INT64) + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    if FLAT:
        x_off = offs
        y_off = offs
    else:
        x_off = strided_offsets(offs, NDIM, D1, D2, D3, SX0, SX1, SX2, SX3)
        y_off = strided_offsets(offs, NDIM, D1, D2, D3, SY0, SY1, SY2, SY3)
    x = tl.load(x_ptr + x_off, mask=mask)
    tl.store(y_ptr + y_off, x.to(y_ptr.dtype.element_ty), mask=mask)


_copy_kernel = launch.recorded(_copy_kernel)  # its calls are replayed (kernels/runtime/launch.py)


@triton.jit
def _flat_copy_kernel(x_ptr, y_ptr, n, INT64: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                      MASKED: tl.constexpr = True, PERSIST: tl.constexpr = 0, EVICT: tl.constexpr = 0):
    """y = x cast to y's dtype, both contiguous alike (the copy spec's `flat` seats).
    MASKED False: every block is full. PERSIST > 0: a fixed grid (PERSIST programs per SM)
    strides over the blocks. EVICT: the source is loaded evict-first (read once)."""
    pid = tl.program_id(0)
    if PERSIST > 0:
        nprog = tl.num_programs(0)
        for it in range(0, tl.cdiv(tl.cdiv(n, BLOCK_SIZE) - pid, nprog)):
            _flat_copy_block(x_ptr, y_ptr, pid + it * nprog, n, INT64, BLOCK_SIZE, MASKED, EVICT)
    else:
        _flat_copy_block(x_ptr, y_ptr, pid, n, INT64, BLOCK_SIZE, MASKED, EVICT)


@triton.jit
def _flat_copy_block(x_ptr, y_ptr, blk, n, INT64: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                     MASKED: tl.constexpr, EVICT: tl.constexpr):
    offs = block_start(blk, BLOCK_SIZE, INT64) + tl.arange(0, BLOCK_SIZE)
    if MASKED:
        mask = offs < n
        if EVICT:
            x = tl.load(x_ptr + offs, mask=mask, eviction_policy="evict_first")
        else:
            x = tl.load(x_ptr + offs, mask=mask)
        tl.store(y_ptr + offs, x.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        if EVICT:
            x = tl.load(x_ptr + offs, eviction_policy="evict_first")
        else:
            x = tl.load(x_ptr + offs)
        tl.store(y_ptr + offs, x.to(y_ptr.dtype.element_ty))


_flat_copy_kernel = launch.recorded(_flat_copy_kernel)


@triton.jit
def _cat2_kernel(x0_ptr, x1_ptr, y_ptr, rows, inner0, inner1, rs0, rs1, col_blocks,
                 INT64: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    """y = cat(x0, x1) in one pass, y contiguous: y viewed as `rows` rows of inner0 +
    inner1 elements (inner_i: x_i's size on the cat dim times the sizes after it) takes
    column c from x0 where c < inner0, else from x1. x_i is rows of inner_i contiguous
    elements, rs_i apart (inner_i where x_i is contiguous; rotary's halves x[..., :64] of a
    contiguous x: the full row's length). A program writes a BLOCK_ROWS x BLOCK_COLS tile:
    columns stay contiguous (no division per element), so the loads vectorize."""
    pid = tl.program_id(0)
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


_cat2_kernel = launch.recorded(_cat2_kernel)


# ----------------------------------------------------------------------------- launchers

def copy_plan(shape, x_strides, y_strides) -> tuple:
    """(n, flat, sizes, x_strides, y_strides): the shape's dims merged where both sides
    allow, outermost first, at most MAX_RANK (more raises ValueError)."""
    n = numel(shape)
    merged: list[list[int]] = []
    for d, sx, sy in zip(shape, x_strides, y_strides):
        if d == 1:
            continue
        if merged and merged[-1][1] == sx * d and merged[-1][2] == sy * d:
            merged[-1] = [merged[-1][0] * d, sx, sy]
            continue
        merged.append([d, sx, sy])
    if not merged:
        merged = [[1, 1, 1]]
    if len(merged) > MAX_RANK:
        raise ValueError(f"{len(merged)} dims after merging (the copy kernel takes {MAX_RANK})")
    sizes = tuple(m[0] for m in merged)
    sx = tuple(m[1] for m in merged)
    sy = tuple(m[2] for m in merged)
    flat = len(sizes) == 1 and sx == (1,) and sy == (1,) or n == 1
    return (n, flat, sizes, sx, sy)


def launch_copy_plan(x, y, plan, config: Config) -> None:
    n, flat, sizes, sx, sy = plan
    nd = len(sizes)
    d = [sizes[nd - 1 - k] if k < nd - 1 else 1 for k in range(3)]
    lx = [sx[0]] + [sx[nd - 1 - k] if k < nd - 1 else 0 for k in range(3)]
    ly = [sy[0]] + [sy[nd - 1 - k] if k < nd - 1 else 0 for k in range(3)]
    extent = max(sum((k - 1) * abs(s) for k, s in zip(sizes, st)) for st in (sx, sy))
    grid = (triton.cdiv(n, config["BLOCK_SIZE"]),)
    _copy_kernel[grid](x, y, n, d[0], d[1], d[2], *lx, *ly, NDIM=nd, FLAT=flat,
                       INT64=max(n, extent) > INDEX_LIMIT, **config.kwargs)


def launch_copy(x, y, config: Config) -> None:
    """y = x (same shape; x may broadcast by stride 0), cast to y's dtype, any strides."""
    launch_copy_seat(x, y, copy_plan(tuple(y.shape), x.stride(), y.stride()), config)


def launch_copy_seat(x, y, plan, config: Config) -> None:
    """A copy of the copy spec's seats: a flat plan on the flat stream kernel (every
    FLAT_CONFIGS lever), any other on the strided copy kernel."""
    n, flat = plan[0], plan[1]
    if not flat:
        launch_copy_plan(x, y, plan, _base(config))
        return
    grid, kw = stream_launch(n, config, y.device)
    _flat_copy_kernel[grid](x, y, n, INT64=n > INDEX_LIMIT, **kw)


def layout_params(x: torch.Tensor, y: torch.Tensor) -> dict[str, str]:
    """What a trace row of a clone or cast of x into y (torch's output) says beyond shapes,
    so that a census certifies the seat serve() launches (`_copy_into`): nothing for the
    flat copy, else `layout=strided` and x's strides, which the screen copies through."""
    try:
        plan = copy_plan(tuple(y.shape), x.stride(), y.stride())
    except ValueError:
        return {}
    if plan[1] or x.dim() == 0:
        return {}
    return {"layout": "strided", "strides": "x".join(str(s) for s in x.stride())}


def dense(x: torch.Tensor) -> torch.Tensor:
    """x where it is contiguous, else a contiguous copy made by the copy kernel into
    `launch.empty`: unlike `x.contiguous()` (a torch op, which a replay cannot make again),
    an op on a strided view (rotary's rotate_half, a transposed input) is then remembered
    (kernels/runtime/launch.py). Every copy config is exact, so the staging copy takes STAGING
    rather than a seat's certificate: it is part of the op, as `.contiguous()` was."""
    if x.is_contiguous():
        return x
    if x.numel() == 0:
        return launch.empty(x.shape, x.dtype, x.device)
    try:
        plan = copy_plan(tuple(x.shape), x.stride(), contiguous_strides(x.shape))
    except ValueError:  # more dims than the copy kernel takes
        return x.contiguous()
    y = launch.empty(x.shape, x.dtype, x.device)
    launch_copy_plan(x, y, plan, STAGING)
    return y


# ----------------------------------------------------------------------------- configs

def _c(block, warps, **extra):
    return Config.make(BLOCK_SIZE=block, num_warps=warps, num_stages=1, **extra)


# A stream with no loop: the block and the warps are all a config changes (one stage).
CONFIGS = (_c(512, 4), _c(1024, 4), _c(2048, 8), _c(4096, 8), _c(8192, 16))
DEFAULTS = (_c(1024, 4),)
STAGING = DEFAULTS[0]  # `dense`'s copies
# The copy spec's flat seats also take the stream levers (`_flat_copy_kernel`): more bytes
# per thread, a persistent grid of PERSIST programs per SM, evict-first loads (EVICT), a
# block that shrinks until the grid has FILL programs per SM.
FLAT_CONFIGS = CONFIGS + (_c(16384, 16), _c(4096, 8, PERSIST=8), _c(8192, 16, PERSIST=4),
                          _c(8192, 16, EVICT=1), _c(8192, 16, PERSIST=4, EVICT=1), _c(16384, 16, FILL=4))
STREAM_KEYS = ("PERSIST", "EVICT", "FILL")  # meta-parameters only the flat stream kernels take
INTERPRETER_SMS = 4  # the CPU interpreter's stand-in for the SM count of a persistent grid
_sms: dict = {}
_stream_memo: dict = {}


def _base(config: Config) -> Config:
    """config without the stream-only levers: what the strided and cat kernels take."""
    if not any(k in STREAM_KEYS for k, _ in config.meta):
        return config
    return Config(tuple((k, v) for k, v in config.meta if k not in STREAM_KEYS), config.num_warps,
                  config.num_stages)


def stream_launch(n: int, config: Config, device) -> tuple[tuple[int], dict]:
    """(grid, kernel keyword arguments) of a flat stream of n elements under config: one
    program per block, or with PERSIST at most PERSIST programs per SM striding over the
    blocks; FILL: the block halved (down to 4 elements a thread) until the grid has FILL
    programs per SM, so that one config fills the machine over its whole bucket (the
    `elements` ladder spans 16x); MASKED unless every block is full."""
    key = (n, config, device)
    hit = _stream_memo.get(key)
    if hit is not None:
        return hit
    meta = dict(config.meta)
    block, persist, fill = meta["BLOCK_SIZE"], meta.pop("PERSIST", 0), meta.pop("FILL", 0)
    sms = _sms.get(device)
    if sms is None and (persist or fill):
        sms = _sms[device] = (torch.cuda.get_device_properties(device).multi_processor_count
                              if device.type == "cuda" else INTERPRETER_SMS)
    while fill and block > 128 * config.num_warps and triton.cdiv(n, block) < fill * sms:
        block //= 2
    blocks = triton.cdiv(n, block)
    if persist:
        blocks = min(blocks, persist * sms)
        meta["PERSIST"] = persist
    meta["BLOCK_SIZE"] = block
    got = ((blocks,), {**meta, "MASKED": n % block != 0, "num_warps": config.num_warps,
                       "num_stages": config.num_stages})
    if len(_stream_memo) >= 1 << 12:
        _stream_memo.clear()
    _stream_memo[key] = got
    return got


def cast_supported(src: str, dst: str) -> str | None:
    """Why a cast is not served, or None."""
    for dt in (src, dst):
        if dt not in TORCH_DTYPES:
            return f"dtype {dt} is not served ({', '.join(TORCH_DTYPES)})"
    return None


def _inputs_of(dt: str, shape, rng):
    if dt == "bool":
        return rng.integers(0, 2, shape)
    if dt in INT_DTYPES:
        return rng.integers(-1000, 1000, shape)
    # Magnitudes over 2^-18..2^12: casts round across fp16's subnormals and full range.
    return wide_range_inputs(rng, shape, -18, 10)


# ----------------------------------------------------------------------------- copy spec

_COPY_OPS = ("aten._to_copy", "aten.clone", "aten.copy_")


class CopySpec(KernelSpec):
    name = "copy"
    ops = _COPY_OPS
    key = (KeyDim("N", "elements"),)
    dtypes = tuple(TORCH_DTYPES)
    exact = True
    description = "copies and dtype casts: _to_copy, clone, copy_ (any strides)"

    config_space = FLAT_CONFIGS
    default_configs = DEFAULTS

    def source_parts(self):
        return (_copy_kernel, block_start, strided_offsets, copy_plan, launch_copy_plan, launch_copy,
                _flat_copy_kernel, _flat_copy_block,
                launch_copy_seat, stream_launch, _base)

    def static_refusal(self, profile, config, problem):
        if dict(problem.flags).get("layout") != "flat" and _base(config) is not config:
            return ("not_applicable", "the stream levers (PERSIST, EVICT, FILL) are the flat copy's only")
        return super().static_refusal(profile, config, problem)

    def problem_from_row(self, row):
        op = row.op.removesuffix(".default")
        if op not in _COPY_OPS:
            return NotServable(f"{op}: overload not served")
        if op == "aten.copy_":
            if len(row.shapes) != 2:
                return NotServable(f"copy_ takes two tensors, the row has {len(row.shapes)}")
            out_dt, src_dt = row.dtypes
            shape, src_shape = row.shapes
            if tuple(src_shape) != tuple(shape):
                return NotServable(f"copy_ of {format_shape(src_shape)} into {format_shape(shape)}: "
                                   "a broadcast copy is served by the public op only")
            known = {"non_blocking"}
        else:
            if len(row.shapes) != 1:
                return NotServable(f"{op} takes one tensor, the row has {len(row.shapes)}")
            src_dt, shape = row.dtypes[0], row.shapes[0]
            out_dt = row.params.str("dtype", src_dt) if op == "aten._to_copy" else src_dt
            known = {"dtype", "non_blocking"} if op == "aten._to_copy" else set()
            known |= {"layout", "strides"}
        unknown = set(row.params) - known
        if unknown:
            return NotServable(f"{op}: unsupported params {', '.join(sorted(unknown))}")
        why = cast_supported(src_dt, out_dt)
        if why:
            return NotServable(why)
        n = numel(shape)
        if n == 0:
            return NotServable("an empty tensor: nothing to launch")
        extra = [("shape", tuple(shape))]
        layout = row.params.str("layout", "flat")
        if layout == "strided":  # the recorder's note of a copy serve() runs strided (`layout_params`)
            try:
                strides = row.params.ints("strides")
            except ValueError as e:
                return NotServable(f"{op}: bad strides: {e}")
            if strides is None or len(strides) != len(shape) or min(strides, default=0) < 0:
                return NotServable(f"{op}: strides= must give one stride >= 0 per dim of {format_shape(shape)}")
            extra.append(("strides", tuple(strides)))
        elif layout != "flat":
            return NotServable(f"{op}: layout={layout} (flat or strided)")
        return Problem(self.name, (out_dt, src_dt), seat_flags(layout=layout), (n,), tuple(extra))

    def input_shapes(self, problem):
        strides = problem.get("strides")
        if strides is None:
            return {"x": (tuple(problem.get("shape")), problem.dtypes[1])}
        extent = 1 + sum((d - 1) * s for d, s in zip(problem.get("shape"), strides))
        return {"x": ((extent,), problem.dtypes[1])}

    def make_inputs(self, problem, rng):
        return {"x": (_inputs_of(problem.dtypes[1], self.input_shapes(problem)["x"][0], rng), problem.dtypes[1])}

    def oracle(self, problem, inputs):
        shape, strides = tuple(problem.get("shape")), problem.get("strides")
        x = inputs["x"]
        if strides is not None:  # the strided view's elements, in row-major order
            index = sum(np.arange(d).reshape([-1 if i == k else 1 for i in range(len(shape))]) * s
                        for k, (d, s) in enumerate(zip(shape, strides)))
            x = np.asarray(x).reshape(-1)[np.broadcast_to(index, shape)]
        return {"y": oracle.cast(x, problem.dtypes[0]).reshape(shape)}

    def output_specs(self, problem):
        return {"y": (tuple(problem.get("shape")), problem.dtypes[0])}

    def serve_ops(self):
        return {"aten._to_copy": _to_copy, "aten.clone": clone, "aten.copy_": copy_}

    def launch(self, config, problem, inputs, outputs):
        x = inputs["x"]
        if problem.get("strides") is not None:
            x = x.as_strided(tuple(problem.get("shape")), tuple(problem.get("strides")))
        launch_copy(x, outputs["y"], config)

    def example_rows(self, scale):
        from nbx_tune.kernels.rows import make_row

        shapes = ((3, 37, 5), (1000,)) if scale == "small" else ((1, 512, 4096), (8, 320, 4097))
        floats = ("float16", "float32") if scale == "small" else tuple(FLOAT_DTYPES)
        rows = []
        for i, src in enumerate(floats):
            for j, dst in enumerate(floats):
                rows.append(make_row("aten._to_copy", [src], [shapes[(i + j) % 2]], {"dtype": dst}))
            rows.append(make_row("aten.clone", [src], [shapes[i % 2]]))
            rows.append(make_row("aten.copy_", [src, floats[-1 - i]], [shapes[1 - i % 2]] * 2))
        # A router's float ids to integers (truncated toward zero, as torch casts).
        rows += [make_row("aten._to_copy", [floats[-1]], [shapes[0]], {"dtype": "int64"}),
                 make_row("aten._to_copy", [floats[0]], [shapes[1]], {"dtype": "int32"})]
        # An attention mask's `.bool()` (x != 0: NaN is true, -0.0 false, as torch casts).
        rows += [make_row("aten._to_copy", ["int64"], [shapes[1]], {"dtype": "bool"}),
                 make_row("aten._to_copy", [floats[0]], [shapes[0]], {"dtype": "bool"})]
        # The rotary positions (int64 -> float32) and a mask (bool -> int64).
        # A strided clone (a repeat_kv's expanded keys) and a cast of a transposed view: the
        # recorder's layout=strided rows (`layout_params`).
        rows += [make_row("aten.clone", ["float32"], [(2, 2, 3, 7, 8)], {"layout": "strided", "strides": "112x56x0x8x1"}),
                 make_row("aten._to_copy", ["float16"], [(37, 5)], {"dtype": "float32", "layout": "strided",
                                                                 "strides": "1x37"})]
        rows += [make_row("aten._to_copy", ["int64"], [shapes[0]], {"dtype": "float32"}),
                 make_row("aten._to_copy", ["bool"], [shapes[1]], {"dtype": "int64"}),
                 make_row("aten.clone", ["int64"], [shapes[1]])]
        if scale != "small":
            rows.append(make_row("aten._to_copy", ["int32"], [shapes[1]], {"dtype": "bfloat16"}))
        return rows


# ----------------------------------------------------------------------------- cat spec

def _legacy_empty(shape) -> bool:
    return len(shape) == 1 and shape[0] == 0


def cat_shape(shapes, dim: int) -> tuple[tuple[int, ...], int] | str:
    """(output shape, normalized dim), or why the shapes do not concatenate."""
    kept = [tuple(s) for s in shapes if not _legacy_empty(s)]
    if not kept:
        return "every input is empty"
    rank = len(kept[0])
    if not -rank <= dim < rank:
        return f"dim {dim} out of range for rank {rank}"
    dim %= rank
    for s in kept:
        if len(s) != rank or any(a != b for k, (a, b) in enumerate(zip(s, kept[0])) if k != dim):
            return f"shapes {' and '.join(format_shape(x) for x in kept)} do not concatenate on dim {dim}"
    out = list(kept[0])
    out[dim] = sum(s[dim] for s in kept)
    return tuple(out), dim


def row_stride(shape, strides, dim: int) -> int | None:
    """x (shape, strides) as rows of its elements from `dim` on, those contiguous: the
    distance between rows (elements), or None where x is not laid out so."""
    inner, acc = tuple(shape[dim:]), 1
    for d, s in zip(reversed(inner), reversed(tuple(strides[dim:]))):
        if d != 1 and s != acc:
            return None
        acc *= d
    outer = [(d, s) for d, s in zip(shape[:dim], strides[:dim]) if d != 1]
    if not outer:
        return acc
    for (d0, s0), (d1, s1) in zip(outer, outer[1:]):  # the outer dims must merge into one
        if s0 != s1 * d1:
            return None
    return outer[-1][1]


def cat2_tile(rows: int, width: int, block: int) -> tuple[int, int]:
    """(BLOCK_ROWS, BLOCK_COLS) of `_cat2_kernel`: a tile of `block` elements, as wide as a
    row allows (a power of two)."""
    cols = min(triton.next_power_of_2(width), block)
    return max(1, block // cols), cols


def launch_cat2(x0, x1, out, dim: int, config: Config) -> None:
    """out = cat((x0, x1), dim) in one launch; out contiguous, each input rows of
    contiguous elements (`row_stride` not None), neither input empty (x0 and x1 may be one
    tensor: cat((x, x)))."""
    dim = dim % out.dim()
    after = numel(tuple(out.shape)[dim + 1:])
    rows = numel(tuple(out.shape)[:dim])
    inner = [x.shape[dim] * after for x in (x0, x1)]
    rs = [row_stride(tuple(x.shape), x.stride(), dim) for x in (x0, x1)]
    width = inner[0] + inner[1]
    br, bc = cat2_tile(rows, width, config["BLOCK_SIZE"])
    extent = (rows + br) * max(width, *rs) + width  # past every offset formed, masked rows included
    col_blocks = triton.cdiv(width, bc)
    grid = (triton.cdiv(rows, br) * col_blocks,)
    _cat2_kernel[grid](x0, x1, out, rows, inner[0], inner[1], rs[0], rs[1], col_blocks,
                       INT64=extent > INDEX_LIMIT, BLOCK_ROWS=br, BLOCK_COLS=bc,
                       num_warps=config.num_warps, num_stages=config.num_stages)


def _one_launch(x, dim: int) -> bool:
    return row_stride(tuple(x.shape), x.stride(), dim % x.dim()) is not None


def launch_cat(xs, out, dim: int, config: Config) -> None:
    """out = cat(xs, dim): two non-empty inputs laid out as rows (contiguous ones, halves
    of a contiguous tensor) into a contiguous out in one launch (`_cat2_kernel`), else each
    non-empty input copied into its slice of out."""
    kept = [x for x in xs if x.numel()]  # legacy 1-D empties and zero-size slices add nothing
    if len(kept) == 2 and out.is_contiguous() and all(_one_launch(x, dim) for x in kept):
        launch_cat2(kept[0], kept[1], out, dim, config)
        return
    offset = 0
    for x in xs:
        if _legacy_empty(tuple(x.shape)):
            continue
        size = x.shape[dim]
        if x.numel():
            y = out.narrow(dim, offset, size)
            launch_copy_plan(x, y, copy_plan(tuple(x.shape), x.stride(), y.stride()), _base(config))
        offset += size


class CatSpec(KernelSpec):
    name = "cat"
    ops = ("aten.cat",)
    key = (KeyDim("N", "elements"),)
    dtypes = tuple(TORCH_DTYPES)
    exact = True
    description = "concatenation (torch.cat) by strided copies into the output's slices"

    config_space = CONFIGS
    default_configs = DEFAULTS

    def source_parts(self):
        return (_copy_kernel, block_start, strided_offsets, copy_plan, launch_copy_plan, launch_cat, _legacy_empty,
                _cat2_kernel, launch_cat2,
                row_stride, _one_launch, _base, cat2_tile)

    def problem_from_row(self, row):
        if row.op.removesuffix(".default") != "aten.cat":
            return NotServable(f"{row.op}: overload not served")
        unknown = set(row.params) - {"dim"}
        if unknown:
            return NotServable(f"aten.cat: unsupported params {', '.join(sorted(unknown))}")
        if not row.shapes:
            return NotServable("aten.cat of no tensors")
        if len(set(row.dtypes)) != 1:
            return NotServable(f"aten.cat of mixed dtypes {', '.join(row.dtypes)} is not served")
        dt = row.dtypes[0]
        if dt not in TORCH_DTYPES:
            return NotServable(f"dtype {dt} is not served ({', '.join(TORCH_DTYPES)})")
        try:
            dim = row.params.int("dim", 0)
        except ValueError as e:
            return NotServable(f"bad dim: {e}")
        got = cat_shape(row.shapes, dim)
        if isinstance(got, str):
            return NotServable(got)
        out_shape, dim = got
        n = numel(out_shape)
        if n == 0:
            return NotServable("an empty output: nothing to launch")
        try:
            for s in row.shapes:
                if not _legacy_empty(s):
                    copy_plan(s, contiguous_strides(s), contiguous_strides(out_shape))
        except ValueError as e:
            return NotServable(str(e))
        extra = (("dim", dim), ("out_shape", tuple(out_shape)), ("shapes", tuple(tuple(s) for s in row.shapes)))
        return Problem(self.name, (dt,), seat_flags(), (n,), extra)

    def input_shapes(self, problem):
        return {f"x{i}": (tuple(s), problem.dtypes[0]) for i, s in enumerate(problem.get("shapes"))}

    def make_inputs(self, problem, rng):
        return {name: (_inputs_of(dt, shape, rng), dt) for name, (shape, dt) in self.input_shapes(problem).items()}

    def oracle(self, problem, inputs):
        shapes = problem.get("shapes")
        xs = [inputs[f"x{i}"].reshape(tuple(s)) for i, s in enumerate(shapes)]
        return {"out": oracle.cat(xs, problem.get("dim"))}

    def output_specs(self, problem):
        return {"out": (tuple(problem.get("out_shape")), problem.dtypes[0])}

    def serve_ops(self):
        return {"aten.cat": cat}

    def launch(self, config, problem, inputs, outputs):
        shapes = problem.get("shapes")
        xs = [inputs[f"x{i}"].reshape(tuple(s)) for i, s in enumerate(shapes)]
        launch_cat(xs, outputs["out"], problem.get("dim"), config)

    def example_rows(self, scale):
        from nbx_tune.kernels.rows import make_row

        rows = []
        if scale == "small":
            dts = ("float16", "float32", "int64")
            rope = [(1, 3, 7, 5), (1, 3, 7, 5)]
            cache = [(0,), (1, 3, 7, 5)]
            grow = [(1, 3, 6, 5), (1, 3, 1, 5)]
            three = [(5, 3), (5, 1), (5, 9)]
        else:
            dts = (*FLOAT_DTYPES, "int64")
            rope = [(1, 32, 512, 64), (1, 32, 512, 64)]
            cache = [(0,), (1, 32, 512, 128)]
            grow = [(1, 8, 1023, 128), (1, 8, 1, 128)]
            three = [(4097, 31), (4097, 1), (4097, 257)]
        for dt in dts:
            rows += [make_row("aten.cat", [dt, dt], rope, {"dim": "-1"}),
                     make_row("aten.cat", [dt, dt], cache, {"dim": "-2"}),
                     make_row("aten.cat", [dt, dt], grow, {"dim": "2"}),
                     make_row("aten.cat", [dt] * 3, three, {"dim": "1"}),
                     make_row("aten.cat", [dt] * 2, three[:1] * 2)]
        return rows


COPY_SPEC = CopySpec()
CAT_SPEC = CatSpec()
SPECS = (COPY_SPEC, CAT_SPEC)


# ----------------------------------------------------------------------------- public ops

REMEMBERED = launch.REMEMBERED


def _like(x: torch.Tensor, dtype, memory_format) -> torch.Tensor:
    """The output of a copy of x: contiguous through `launch.empty` (a replay makes it
    again) where torch's layout is contiguous, else torch's empty_like (never remembered)."""
    if memory_format is torch.contiguous_format or (memory_format in (None, torch.preserve_format)
                                                    and x.is_contiguous()):
        return launch.empty(x.shape, dtype, x.device)
    return torch.empty_like(x, dtype=dtype, memory_format=memory_format or torch.preserve_format)


def _dtype_name(t: torch.Tensor, what: str) -> str:
    try:
        return _NAMES[t.dtype]
    except KeyError:
        raise KernelError(f"{what}: dtype {t.dtype} is not served ({', '.join(TORCH_DTYPES)})") from None


def _copy_into(x: torch.Tensor, y: torch.Tensor, what: str) -> torch.Tensor:
    why = cast_supported(_dtype_name(x, what), _dtype_name(y, what))
    if why:
        raise KernelError(f"{what}: {why}")
    if y.numel() == 0:
        return y
    try:
        plan = copy_plan(tuple(y.shape), x.stride(), y.stride())
    except ValueError as e:
        raise KernelError(f"{what}: {e}") from None
    config = config_for(COPY_SPEC, (_NAMES[y.dtype], _NAMES[x.dtype]),
                        seat_flags(layout="flat" if plan[1] else "strided"), (plan[0],))
    launch_copy_seat(x, y, plan, config)
    return y


def _to_copy(self: torch.Tensor, *, dtype=None, layout=None, device=None, pin_memory=None,
             non_blocking: bool = False, memory_format=None) -> torch.Tensor:
    """aten._to_copy: a copy of self in `dtype` (strides preserved where torch preserves
    them); the device must be self's."""
    if device is not None and torch.device(device) != self.device:
        raise KernelError(f"_to_copy: a copy to {device} from {self.device} is not served")
    if layout not in (None, torch.strided):
        raise KernelError(f"_to_copy: layout {layout} is not served")
    dtype = dtype or self.dtype
    try:  # the direct launch (kernels/runtime/launch.py); launch.tensor_key(self), inline
        key = (COPY_SPEC, dtype, memory_format, self.shape, self.stride(), self.dtype, self.device,
               self.data_ptr() & 15)
    except AttributeError:
        raise KernelError("_to_copy: the operand must be a tensor") from None
    hit = REMEMBERED.get(key)
    if hit is not None:
        return hit(self)
    return launch.remember(key, (self,), _copy_as, self, dtype, memory_format, "_to_copy")


def _copy_as(x: torch.Tensor, dtype, memory_format, what: str) -> torch.Tensor:
    return _copy_into(x, _like(x, dtype, memory_format), what)


def clone(self: torch.Tensor, *, memory_format=None) -> torch.Tensor:
    """aten.clone: a copy with self's strides (preserve_format) or in `memory_format`."""
    try:  # the direct launch (kernels/runtime/launch.py)
        key = (COPY_SPEC, "clone", memory_format, *launch.tensor_key(self))
    except AttributeError:
        raise KernelError("clone: the operand must be a tensor") from None
    hit = REMEMBERED.get(key)
    if hit is not None:
        return hit(self)
    return launch.remember(key, (self,), _copy_as, self, self.dtype, memory_format, "clone")


def copy_(self: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """aten.copy_: src (broadcast to self's shape) into self, cast to self's dtype."""
    if src.device != self.device:
        raise KernelError(f"copy_: a copy from {src.device} to {self.device} is not served")
    semantics.check_writable("copy_", self, src)  # every call, a replay's too (issue 60)
    # the direct launch (kernels/runtime/launch.py): both layouts; launch.tensor_key, inline
    key = (COPY_SPEC, "copy_", self.shape, self.stride(), self.dtype, self.data_ptr() & 15,
           src.shape, src.stride(), src.dtype, src.data_ptr() & 15, self.device)
    hit = REMEMBERED.get(key)
    if hit is not None:
        return hit(self, src)
    return launch.remember(key, (self, src), _copy_from, self, src)


def _copy_from(self: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    try:
        src = src.expand(self.shape)
    except RuntimeError:
        raise KernelError(f"copy_: {tuple(src.shape)} does not broadcast to {tuple(self.shape)}") from None
    return _copy_into(src, self, "copy_")


def cat(tensors, dim: int = 0) -> torch.Tensor:
    """aten.cat: the tensors (one dtype, legacy 1-D empty ones skipped) joined on dim."""
    tensors = tuple(tensors)
    # A tensor given twice (rotary's cat((freqs, freqs))) is one input of the replay, and
    # the key says which operands it is: two tensors at one address are never remembered.
    if len({id(t) for t in tensors}) == len(tensors):  # by identity (tensors compare elementwise)
        inputs = tensors
    else:
        first = {}  # id -> the operand at its first position
        for t in tensors:
            first.setdefault(id(t), t)
        inputs = tuple(first.values())
    try:  # the direct launch (kernels/runtime/launch.py); launch.tensor_key of each, inline
        keys = [(t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & 15) for t in inputs]
    except AttributeError:
        raise KernelError("cat: the operands must be tensors") from None
    if inputs is tensors:
        key = (CAT_SPEC, dim, *keys)
    else:
        slot = {id(t): i for i, t in enumerate(inputs)}
        key = (CAT_SPEC, dim, tuple(slot[id(t)] for t in tensors), *keys)
    hit = REMEMBERED.get(key)
    if hit is not None:
        return hit(*inputs)
    return launch.remember(key, inputs, _cat_call, tensors, dim)


def _cat_call(tensors, dim: int) -> torch.Tensor:
    if not tensors:
        raise KernelError("cat: no tensors")
    dts = {t.dtype for t in tensors}
    if len(dts) != 1:
        raise KernelError(f"cat: mixed dtypes {sorted(map(str, dts))} are not served")
    dt = _dtype_name(tensors[0], "cat")
    got = cat_shape([tuple(t.shape) for t in tensors], dim)
    if isinstance(got, str):
        raise KernelError(f"cat: {got}")
    out_shape, dim = got
    device = next(t.device for t in tensors if not _legacy_empty(tuple(t.shape)))
    out = launch.empty(out_shape, tensors[0].dtype, device)
    if out.numel() == 0:
        return out
    config = config_for(CAT_SPEC, (dt,), seat_flags(), (out.numel(),))
    try:
        launch_cat(tensors, out, dim, config)
    except ValueError as e:
        raise KernelError(f"cat: {e}") from None
    return out
