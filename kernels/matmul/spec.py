"""The matmul spec: config space, launch key, trace rows, static refusals, inputs, oracle, example rows.
"""

from __future__ import annotations

import dataclasses

import triton

from nbx_tune.kernels import copy, fill
from nbx_tune.kernels.helpers import FLOATS, torch_dtypes
from nbx_tune.kernels.matmul.kernel import (TensorDescriptor, _epilogue, _matmul_kernel, _matmul_splitk_kernel,
                                            _persistent_kernel, _splitk_reduce_kernel, _strides3, _tile_dot, _tma_copy,
                                            alignment, b_kmajor, extra_columns, grouped_tile, launch_matmul,
                                            launch_scheduled, launch_splitk, matmul_args, rows_aligned, schedule,
                                            schedule_refusal, sm_count, split_k, stage_operands, sum_last,
                                            tma_descriptors, tma_ready, uses_tma, vector_elems)
from nbx_tune.kernels.spec import (Config, KernelSpec, KeyDim, NotServable, Problem, one_dtype, seat_flags,
                                   uniform_inputs)
from nbx_tune.oracles import matmul as oracle

TORCH_DTYPES = torch_dtypes(*FLOATS)
INT32_MAX = 2**31 - 1
MAX_BATCH = 65535  # the grid's second axis


def _c(bm, bn, bk, warps, stages, group=8, extra_n=0, tma=0, split=1, sched=0, flatten=0, ws=0, last=0):
    extra = {**({"EXTRA_N": extra_n} if extra_n else {}), **({"TMA": 1} if tma else {}),
             **({"SPLIT_K": split} if split > 1 else {}), **({"SUM_LAST": 1} if last else {}), **({"SCHEDULE": sched} if sched else {}),
             **({"FLATTEN": 1} if flatten else {}), **({"WS": 1} if ws else {})}
    return Config.make(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group, **extra,
                       num_warps=warps, num_stages=stages)


# Small tiles for small shapes and 32-64 KB shared memory (Turing, AMD, Apple); medium
# tiles for Ampere/Ada; wide tiles and deep pipelines for Hopper/Blackwell's 227 KB. The
# deepest Hopper tiles (128x256x64 at 5 stages: 240 KB in fp16) are meant to be refused by
# the shared-memory prune there: the space is the same on every device. Tiles over 64 KB
# that were never within 3 % of the best at any shape of the H200 sweep
# (bench/speed_candidates.py), nor a shipped table's winner, are left out: each costs
# every census a compile and a timing at every seat.
CONFIGS = (
    _c(16, 32, 64, 2, 2), _c(32, 32, 32, 4, 2), _c(32, 32, 64, 4, 2), _c(32, 64, 32, 4, 2),
    _c(64, 32, 32, 4, 2), _c(32, 64, 64, 4, 3), _c(64, 32, 64, 4, 3), _c(64, 64, 32, 4, 2),
    _c(64, 64, 32, 4, 3), _c(64, 64, 64, 4, 3), _c(64, 64, 64, 4, 4), _c(64, 64, 128, 4, 3),
    _c(64, 128, 32, 4, 3), _c(128, 64, 32, 4, 3), _c(64, 128, 64, 4, 3), _c(128, 64, 64, 4, 3),
    _c(64, 128, 32, 4, 4), _c(128, 64, 32, 4, 4), _c(64, 128, 64, 4, 5),
    _c(128, 128, 32, 4, 3), _c(128, 128, 32, 8, 3), _c(128, 128, 32, 4, 4), _c(128, 128, 64, 4, 3),
    _c(128, 128, 64, 4, 4), _c(128, 128, 64, 8, 4), _c(128, 128, 64, 4, 5), _c(128, 128, 64, 8, 5),
    _c(64, 256, 32, 4, 4), _c(64, 256, 64, 4, 4), _c(128, 256, 64, 8, 3), _c(128, 256, 64, 8, 5),
    # Tiles 192 wide (128 + 64 in a second accumulator), for sizes where 128 and 256 both
    # leave the last wave mostly empty (3072^3); slower elsewhere, so the tuner picks them
    # only where they win.
    _c(128, 128, 32, 8, 6, extra_n=64),
    # A and B through TMA descriptors: faster than pointer loads at large and unaligned
    # sizes on devices with a TMA unit, refused unlaunched on the others.
    _c(128, 256, 64, 8, 3, tma=1), _c(128, 256, 64, 8, 4, tma=1), _c(128, 128, 64, 4, 3, tma=1),
    _c(128, 128, 64, 8, 4, tma=1), _c(128, 128, 32, 8, 5, extra_n=64, tma=1),
    # Split-K (`_matmul_splitk_kernel`): decode GEMMs (M <= 64) have N / BLOCK_N tiles, too
    # few programs to keep enough loads in flight on 132 SMs; splitting K multiplies them.
    # With BLOCK_M >= M, B is read once (GEMV-style). Refused where K is short or the tiles
    # already fill the machine (`split_refusal`).
    _c(16, 64, 128, 4, 4, split=4), _c(16, 128, 128, 4, 4, split=4), _c(64, 128, 64, 4, 4, split=4),
    _c(64, 128, 128, 4, 3, split=4), _c(64, 128, 128, 4, 3, tma=1, split=4),
    # The same skinny tiles unsplit, for decode GEMMs whose N alone gives hundreds of tiles
    # (an LM head: N = 32000 is 250 tiles of 128), where split-K is refused.
    _c(16, 128, 128, 4, 4),
    # Split-K whose last split sums the partials (SUM_LAST): no second launch. It beats the
    # two-launch split only on single-row decode GEMMs; at M = 64 and mid-size products the
    # last split's serial sum costs more than the launch it saves (lab/gemm_sum_last).
    _c(16, 128, 128, 4, 4, split=4, last=1), _c(16, 128, 128, 4, 4, split=2, last=1),
    # Mid-size GEMMs through TMA in smaller tiles (800 x 1536 x 1536: 84 tiles of 128 x 128,
    # 156 of 64 x 128, 312 of 64 x 64 for 132 SMs), deep pipelines.
    _c(64, 128, 64, 4, 4, tma=1), _c(64, 64, 128, 4, 4, tma=1), _c(64, 256, 64, 4, 4, tma=1),
    # 64 x 192 tiles (a second accumulator): 800 rows x N = 1536 is 104 of them, one wave on
    # 132 SMs, where 128 x 128 leaves 48 SMs idle and 64 x 128 (156) needs a second wave.
    _c(64, 128, 64, 4, 4, extra_n=64, tma=1), _c(64, 128, 64, 4, 5, extra_n=64, tma=1),
    _c(64, 128, 64, 4, 4, extra_n=64),
    # M = 64 decode unsplit in 32-wide tiles: 4096 columns are 128 programs (64 at 64 wide)
    # with no split-K workspace pass.
    _c(64, 32, 128, 4, 4, tma=1),
    # Persistent (SCHEDULE 1: one program per SM walks the tiles; FLATTEN overlaps a tile's
    # epilogue with the next one's loads, WS specializes warps), through TMA.
    _c(128, 128, 64, 4, 5, tma=1, sched=1, flatten=1), _c(128, 128, 64, 4, 4, tma=1, sched=1, flatten=1, ws=1),
    _c(128, 256, 64, 8, 3, tma=1, sched=1, flatten=1), _c(64, 256, 64, 4, 4, tma=1, sched=1, flatten=1),
    _c(64, 128, 64, 4, 5, tma=1, sched=1), _c(64, 64, 128, 4, 4, tma=1, sched=1, flatten=1),
    _c(128, 128, 64, 8, 4, tma=1, sched=1),
)

# Served when a seat has no certificate: the first that fits the device.
DEFAULTS = (_c(128, 128, 32, 4, 3), _c(64, 64, 32, 4, 2), _c(32, 32, 32, 4, 2))


# Split-K pays a pass over its fp32 workspace: with this many output tiles every device the
# profiles describe is already full (the H200 has 132 SMs), and splitting only adds that pass.
SPLIT_MAX_TILES = 256
SPLIT_MIN_BLOCKS = 2  # K blocks each split must have at least: else the split is mostly overhead


def split_refusal(config: Config, problem: Problem) -> tuple[str, str] | None:
    """("not_applicable", why) for a split-K config at a seat it cannot help (judged at the
    seat's largest shape; a split-K config is correct at any shape)."""
    sk = split_k(config)
    if sk == 1:
        return None
    Bn, M, N, K = problem.dims
    bk = config["BLOCK_K"]
    if K < SPLIT_MIN_BLOCKS * sk * bk:
        return ("not_applicable", f"SPLIT_K {sk} over K {K}: fewer than {SPLIT_MIN_BLOCKS} blocks of {bk} per split")
    tiles = Bn * -(-M // config["BLOCK_M"]) * -(-N // config["BLOCK_N"])
    if tiles >= SPLIT_MAX_TILES:
        return ("not_applicable", f"{tiles} output tiles without a split (>= {SPLIT_MAX_TILES}): nothing to gain")
    if sk * Bn * M * N > INT32_MAX:
        return ("not_applicable", f"a workspace of {sk} x {Bn * M * N} elements (indexed in int32)")
    return None


def _broadcastable(shape, target) -> bool:
    if len(shape) > len(target):
        return False
    return all(s in (1, t) for s, t in zip(reversed(shape), reversed(target)))


class MatmulSpec(KernelSpec):
    name = "matmul"
    ops = ("aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm")
    key = (KeyDim("B"), KeyDim("M"), KeyDim("N"), KeyDim("K"))
    dtypes = tuple(TORCH_DTYPES)
    description = "tiled GEMM with grouped ordering: mm, addmm, bmm, baddbmm"

    config_space = CONFIGS
    default_configs = DEFAULTS
    # Timed as a model under CUDA graphs runs it: one flushed launch at a time ranked the
    # configs of 10-50 us GEMMs otherwise than graph replay, and picked slower ones there
    # (lab/gemm_replay_timing/NOTES.md).
    timing = "stream"

    def static_refusal(self, profile, config, problem):
        why = split_refusal(config, problem) or schedule_refusal(config, problem)
        if why:
            return why
        if uses_tma(config):
            if TensorDescriptor is None:
                return ("no_tma", f"TMA loads need host-side tensor descriptors, which Triton "
                                  f"{triton.__version__} lacks (3.4 and later have them)")
            if not profile.has_tma:
                return ("no_tma", f"TMA loads need an NVIDIA sm_90 or later device; profile {profile.name} has none")
        return super().static_refusal(profile, config, problem)

    def smem_bytes(self, config, problem):
        # The software pipeliner keeps num_stages copies of an A tile and a B tile.
        esize = 4 if problem.dtypes[0] == "float32" else 2
        width = config["BLOCK_M"] + config["BLOCK_N"] + extra_columns(config)
        return max(config.num_stages, 1) * width * config["BLOCK_K"] * esize

    def source_parts(self):
        return (_matmul_kernel, _epilogue, _matmul_splitk_kernel, _splitk_reduce_kernel, split_k, sum_last, launch_splitk,
                grouped_tile, _tile_dot, _persistent_kernel, schedule, sm_count,
                launch_scheduled, schedule_refusal,
                extra_columns, uses_tma, tma_ready, _tma_copy, b_kmajor, tma_descriptors,
                matmul_args, vector_elems, rows_aligned, stage_operands, launch_matmul, alignment,
                _strides3,
                # stage_operands' copies (aligned=0 seats): the copy and fill kernels and launchers.
                copy.copy_plan, copy.launch_copy_plan, copy._copy_kernel, copy.block_start, copy.strided_offsets,
                fill.launch_fill, fill._fill_kernel)

    def example_rows(self, scale):
        from nbx_tune.kernels.rows import make_row

        if scale == "small":
            M, N, K, B = 37, 45, 29, 3
        else:
            M, N, K, B = 2049, 3071, 1537, 5
        rows = []
        for dt in self.dtypes:
            d2, d3 = [dt] * 2, [dt] * 3
            rows += [
                make_row("aten.mm", d2, [(M, K), (K, N)]),
                make_row("aten.addmm", d3, [(N,), (M, K), (K, N)], {"beta": "0.5", "alpha": "2.0"}),
                make_row("aten.addmm", d3, [(M, N), (M, K), (K, N)]),
                make_row("aten.bmm", d2, [(B, M, K), (B, K, N)]),
                make_row("aten.baddbmm", d3, [(B, 1, N), (B, M, K), (B, K, N)], {"alpha": "0.25"}),
            ]
        return rows

    # -- trace rows -> problems
    def problem_from_row(self, row):
        op = row.base_op
        batched = op in ("aten.bmm", "aten.baddbmm")
        has_input = op in ("aten.addmm", "aten.baddbmm")
        want = 3 if has_input else 2
        if len(row.shapes) != want:
            return NotServable(f"{op} takes {want} tensors, the row has {len(row.shapes)}")
        dtype = one_dtype(row, TORCH_DTYPES)
        if isinstance(dtype, NotServable):
            return dtype
        a, b = row.shapes[-2], row.shapes[-1]
        rank = 3 if batched else 2
        if len(a) != rank or len(b) != rank:
            return NotServable(f"{op} needs rank-{rank} operands, got {len(a)} and {len(b)}")
        if not batched:
            a, b = (1, *a), (1, *b)
        Bn, M, K = a
        if b[0] != Bn or b[1] != K:
            return NotServable(f"shapes {'x'.join(map(str, a))} and {'x'.join(map(str, b))} do not multiply")
        N = b[2]
        if min(Bn, M, N, K) == 0:
            return NotServable("an empty product: nothing to launch")
        if max(Bn * M * K, Bn * K * N, Bn * M * N) > INT32_MAX:
            return NotServable("an operand of 2^31 elements or more (the kernel indexes in int32)")
        if Bn > MAX_BATCH:
            return NotServable(f"batch {Bn} > {MAX_BATCH} (the grid's second axis)")
        try:
            alpha = row.params.float("alpha", 1.0)
            beta = row.params.float("beta", 1.0)
        except ValueError as e:
            return NotServable(f"bad alpha/beta: {e}")
        extra = [("alpha", alpha)]
        has_bias = has_input and beta != 0
        if has_input:
            bias_shape = row.shapes[0]
            target = (Bn, M, N) if batched else (M, N)
            if not _broadcastable(bias_shape, target):
                return NotServable(f"input {'x'.join(map(str, bias_shape)) or '()'} does not broadcast to {'x'.join(map(str, target))}")
            extra += [("beta", beta), ("bias_shape", tuple(bias_shape))]
        # The operands' strides follow from the shapes and the row's `layout` (the recorder
        # writes `t` for an operand stored transposed, a linear layer's W.t(); no param: both
        # row-major), so the seat's alignment flag is the one the launch computes.
        layout = row.params.str("layout", "nn")
        if layout not in LAYOUTS:
            return NotServable(f"layout={layout!r}: one of {', '.join(LAYOUTS)}")
        if layout != "nn":
            extra.append(("layout", layout))
        aligned = alignment(*_strides(Bn, M, N, K, layout), N, K, vector_elems(TORCH_DTYPES[dtype]))
        return Problem(self.name, (dtype,), matmul_flags(int(has_bias), aligned, layout), (Bn, M, N, K),
                       tuple(sorted(extra)))

    def resized(self, problem, dims):
        # Without a bias (whose shape follows M and N) a GEMM is its dims and flags; the
        # alignment flag must come out the same.
        Bn, M, N, K = dims
        if dict(problem.flags)["bias"] != "0" or max(Bn * M * K, Bn * K * N, Bn * M * N) > INT32_MAX:
            return None
        vec = vector_elems(TORCH_DTYPES[problem.dtypes[0]])
        strides = _strides(Bn, M, N, K, problem.get("layout", "nn"))
        if str(alignment(*strides, N, K, vec)) != dict(problem.flags)["aligned"]:
            return None
        return dataclasses.replace(problem, dims=tuple(dims))

    # -- inputs, oracle, outputs, launch
    def input_shapes(self, problem):
        """a and b as stored: an operand of layout `t` is held transposed and read as its
        transpose, as a model's weight is (`_operands`)."""
        Bn, M, N, K = problem.dims
        dt = problem.dtypes[0]
        ta, tb = (side == "t" for side in problem.get("layout", "nn"))
        shapes = {"a": ((Bn, K, M) if ta else (Bn, M, K), dt), "b": ((Bn, N, K) if tb else (Bn, K, N), dt)}
        if dict(problem.flags)["bias"] == "1":
            shapes["bias"] = (tuple(problem.get("bias_shape")), dt)
        return shapes

    def make_inputs(self, problem, rng):
        return {name: (uniform_inputs(rng, shape), dt)
                for name, (shape, dt) in self.input_shapes(problem).items()}

    def oracle(self, problem, inputs):
        alpha = problem.get("alpha", 1.0)
        a, b = _operands(problem, inputs, lambda x: x.transpose(0, 2, 1))
        if "bias" in inputs:
            return {"c": oracle.baddbmm(inputs["bias"], a, b, alpha, problem.get("beta", 1.0))}
        prod = oracle.bmm(a, b)
        return {"c": prod if alpha == 1.0 else alpha * prod}  # the product itself: see screen.make_case

    def output_specs(self, problem):
        Bn, M, N, _ = problem.dims
        return {"c": ((Bn, M, N), problem.dtypes[0])}

    def serve_ops(self):
        from nbx_tune.kernels.matmul.ops import addmm, baddbmm, bmm, mm  # ops.py imports this module

        return {"aten.mm": mm, "aten.addmm": addmm, "aten.bmm": bmm, "aten.baddbmm": baddbmm}

    def launch(self, config, problem, inputs, outputs):
        Bn, M, N, _ = problem.dims
        bias = inputs.get("bias")
        if bias is not None:
            bias = bias.expand(Bn, M, N)
        a, b = _operands(problem, inputs, lambda x: x.transpose(1, 2))
        launch_matmul(a, b, outputs["c"], bias, problem.get("alpha", 1.0), problem.get("beta", 1.0), config)


LAYOUTS = ("nn", "nt", "tn", "tt")  # a's and b's: n row-major, t stored transposed


def _strides(Bn: int, M: int, N: int, K: int, layout: str):
    """a's and b's strides, (batch, row, column), as a row's layout stores them."""
    sa = (M * K, 1, M) if layout[0] == "t" else (M * K, K, 1)
    sb = (K * N, 1, K) if layout[1] == "t" else (K * N, N, 1)
    return sa, sb


def _operands(problem, inputs, transpose):
    """a and b as the product reads them, from the stored inputs (`input_shapes`)."""
    layout = problem.get("layout", "nn")
    a, b = inputs["a"], inputs["b"]
    return (transpose(a) if layout[0] == "t" else a), (transpose(b) if layout[1] == "t" else b)


SPEC = MatmulSpec()


def matmul_flags(bias: int, aligned: int, layout: str = "nn") -> tuple:
    """A GEMM seat's flags. How the operands are stored is part of the seat: a weight read
    along K (a linear layer's W.t(), layout `nt`) wants other tiles than one read along N,
    and a seat shared by both ran a linear layer on the other layout's pick (0.59-0.76 of
    torch, docs/benchmarks.md). Row-major seats keep the flags they had before."""
    if layout == "nn":
        return seat_flags(bias=bias, aligned=aligned)
    return seat_flags(bias=bias, aligned=aligned, layout=layout)
