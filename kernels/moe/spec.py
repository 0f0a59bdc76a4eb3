"""The grouped expert GEMM's spec: config space, launch key, trace rows, inputs, oracle.

A seat is (experts E, top-k, hidden H, intermediate I, tokens per expert M) with the dtype
signature (activations, weights): the best tiles follow the rows each expert's GEMMs get (M =
ceil(T * top-k / E): a decode step gives an expert a row or two, a prefill hundreds) and the
weights' shape. The weights' dtype is its own field so that fp8 weights can take seats of their
own later. One config serves all four launches of a layer (its BLOCK_M is the padding of the
sorted order both GEMMs read), so a certificate covers every expert launch.

The screen draws routings skewed towards a few experts (a Zipf-like preference, shuffled): at
small token counts most experts get no pair and a few get most of them, and every load leaves
a remainder against the row block.
"""

from __future__ import annotations

import numpy as np

from nbx_tune.kernels.elementwise import _tanh_f32, _unary_math
from nbx_tune.kernels.helpers import FLOATS, torch_dtypes
from nbx_tune.kernels.matmul.kernel import grouped_tile
from nbx_tune.kernels.moe.kernel import (_expert_runs, _moe_count_kernel, _moe_down_kernel, _moe_gate_up_kernel,
                                         _moe_scatter_kernel, _moe_topk_sum_kernel, _row_block, launch_moe, max_blocks,
                                         scatter_block)
from nbx_tune.kernels.rows import format_shape
from nbx_tune.kernels.spec import Config, KernelSpec, KeyDim, NotServable, Problem, seat_flags, uniform_inputs
from nbx_tune.oracles import moe as oracle

OP = "nbx_tune.moe_experts"
TORCH_DTYPES = torch_dtypes(*FLOATS)
ID_DTYPES = ("int64", "int32")
INT32_MAX = 2**31 - 1
FLAGS = seat_flags()
EMPTY = NotServable("an empty layer: nothing to launch")


def _c(bm, bn, bk, group, warps, stages):
    return Config.make(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group, num_warps=warps, num_stages=stages)


# Rows per block 16 for decode (an expert sees a row or a few: a taller block only pads),
# 32-64 for mid loads, 64-128 for prefill; wide K blocks where M is small (the weights'
# stream is all there is), deep pipelines where Hopper's shared memory holds them. The
# gate/up kernel keeps two B tiles per stage (`smem_bytes`).
CONFIGS = (
    _c(16, 32, 32, 1, 4, 2), _c(16, 64, 64, 1, 4, 3), _c(16, 64, 128, 1, 4, 3), _c(16, 128, 64, 1, 4, 3),
    _c(16, 128, 128, 1, 4, 3), _c(16, 64, 256, 1, 4, 3), _c(16, 128, 128, 1, 8, 4), _c(16, 256, 64, 1, 4, 4),
    _c(32, 64, 64, 8, 4, 3), _c(32, 64, 128, 8, 4, 3), _c(32, 128, 64, 8, 4, 4), _c(32, 128, 128, 8, 4, 3),
    _c(64, 64, 64, 8, 4, 3), _c(64, 128, 64, 8, 4, 3), _c(64, 128, 64, 16, 8, 4), _c(64, 256, 64, 16, 8, 3),
    _c(64, 128, 128, 8, 8, 3),
    _c(128, 64, 64, 16, 4, 3), _c(128, 128, 64, 16, 8, 3), _c(128, 128, 64, 32, 8, 4), _c(128, 256, 64, 16, 8, 3),
    _c(128, 128, 32, 8, 4, 4),
)

# Served before a seat is certified, by tokens per expert (`default_config`).
DEFAULTS = (_c(16, 64, 128, 1, 4, 3), _c(64, 128, 64, 8, 4, 3), _c(128, 128, 64, 16, 8, 3), _c(16, 32, 32, 1, 4, 2))
DEFAULT_ROWS = (16, 128)  # M up to 16: the first default; up to 128: the second; else the third


class MoeExpertsSpec(KernelSpec):
    name = "moe_experts"
    ops = (OP,)
    key = (KeyDim("E"), KeyDim("TOPK"), KeyDim("H"), KeyDim("I"), KeyDim("M"))
    dtypes = tuple(TORCH_DTYPES)
    description = "grouped expert GEMMs of a mixture-of-experts layer: gate/up + SwiGLU, down + routing weights"

    config_space = CONFIGS
    default_configs = DEFAULTS
    timing = "stream"  # a layer of several launches, timed as a model under CUDA graphs runs it

    def source_parts(self):
        return (_moe_count_kernel, _expert_runs, _moe_scatter_kernel, _row_block, _moe_gate_up_kernel, _moe_down_kernel,
                _moe_topk_sum_kernel, launch_moe, max_blocks, scatter_block, grouped_tile, _unary_math, _tanh_f32)

    def default_config(self, profile, problem):
        M = problem.dims[4]
        pick = DEFAULTS[0] if M <= DEFAULT_ROWS[0] else DEFAULTS[1] if M <= DEFAULT_ROWS[1] else DEFAULTS[2]
        if not self.static_refusal(profile, pick, problem):
            return pick
        return super().default_config(profile, problem)

    def smem_bytes(self, config, problem):
        # gate/up: an A tile and two B tiles a stage; the down GEMM's one B tile is less.
        esize = 4 if problem.dtypes[0] == "float32" else 2
        return max(config.num_stages, 1) * (config["BLOCK_M"] + 2 * config["BLOCK_N"]) * config["BLOCK_K"] * esize

    # -- trace rows -> problems
    def problem_from_row(self, row):
        if row.base_op != OP:
            return NotServable(f"{row.op}: overload not served")
        if len(row.shapes) != 5:
            return NotServable(f"{OP} takes 5 tensors, the row has {len(row.shapes)}")
        if row.params:
            return NotServable(f"{OP}: unsupported params {', '.join(sorted(row.params))}")
        dt, w13_dt, w2_dt, id_dt, weight_dt = row.dtypes
        if dt not in self.dtypes:
            return NotServable(f"dtype {dt} is not served ({', '.join(self.dtypes)})")
        if w13_dt != dt or w2_dt != dt:
            return NotServable(f"weights {w13_dt}, {w2_dt} with activations {dt}: one dtype expected")
        if id_dt not in ID_DTYPES or weight_dt not in TORCH_DTYPES:
            return NotServable(f"routing {id_dt} ids and {weight_dt} weights: int64/int32 and a float expected")
        x, w13, w2, ids, weights = (tuple(s) for s in row.shapes)
        problem = moe_problem(x, w13, w2, ids, weights, (dt, w13_dt), weight_dt)
        return problem

    def resized(self, problem, dims):
        # E and top-k stay (they shape the routing), H, I and the tokens per expert move:
        # T = floor(M * E / top-k) pairs fill ceil(T * top-k / E) = M rows per expert (E >= top-k).
        E, K, _, _, _ = problem.dims
        _, _, H, I, M = dims
        T = max(1, M * E // K)
        if T * K > INT32_MAX:
            return None
        extra = dict(problem.extra)
        extra["T"] = T
        return Problem(problem.kernel, problem.dtypes, problem.flags, (E, K, H, I, -(-T * K // E)),
                       tuple(sorted(extra.items())))

    # -- inputs, oracle, outputs, launch
    def input_shapes(self, problem):
        E, K, H, I, _ = problem.dims
        T = problem.get("T")
        dt, wdt = problem.dtypes
        return {"hidden": ((T, H), dt), "w_gate_up": ((E, 2 * I, H), wdt), "w_down": ((E, H, I), wdt),
                "topk_ids": ((T, K), "int64"), "topk_weights": ((T, K), problem.get("routing", "float32"))}

    def make_inputs(self, problem, rng):
        E, K, H, I, _ = problem.dims
        T = problem.get("T")
        shapes = self.input_shapes(problem)
        # Activations and weights scaled so that each GEMM's sum stays near 1 (as a model's).
        x = uniform_inputs(rng, (T, H), 2.0)
        w13 = uniform_inputs(rng, (E, 2 * I, H), float(np.sqrt(3.0 / H)))
        w2 = uniform_inputs(rng, (E, H, I), float(np.sqrt(3.0 / I)))
        ids, weights = skewed_routing(rng, T, E, K)
        return {"hidden": (x, shapes["hidden"][1]), "w_gate_up": (w13, shapes["w_gate_up"][1]),
                "w_down": (w2, shapes["w_down"][1]), "topk_ids": (ids, "int64"),
                "topk_weights": (weights, shapes["topk_weights"][1])}

    def oracle(self, problem, inputs):
        return {"out": oracle.moe_experts(inputs["hidden"], inputs["w_gate_up"], inputs["w_down"],
                                          inputs["topk_ids"], inputs["topk_weights"])}

    def output_specs(self, problem):
        _, _, H, _, _ = problem.dims
        return {"out": ((problem.get("T"), H), problem.dtypes[0])}

    def serve_ops(self):
        from nbx_tune.kernels.moe.ops import moe_experts  # ops.py imports this module

        return {OP: moe_experts}

    def launch(self, config, problem, inputs, outputs):
        launch_moe(inputs["hidden"], inputs["w_gate_up"], inputs["w_down"], inputs["topk_ids"],
                   inputs["topk_weights"], outputs["out"], config)

    def example_rows(self, scale):
        if scale == "small":  # odd sizes: remainders against every block
            layers = ((5, 2, 37, 19, 3), (8, 2, 40, 24, 45), (6, 3, 33, 17, 1))
            dts = ("float32", "float16")
        else:  # Mixtral's hidden size at decode (a quarter of its intermediate: the fp32 oracle's copies
            # of its weights stay a few GB), Qwen2-MoE-A2.7B and a DeepSeek-style layer at prefill
            layers = ((8, 2, 4096, 3584, 7), (60, 4, 2048, 1408, 1001), (64, 6, 2048, 1408, 513))
            dts = tuple(TORCH_DTYPES)
        return [moe_row(E, K, H, I, T, dt) for dt in dts for E, K, H, I, T in layers]


def moe_problem(x, w13, w2, ids, weights, dtypes, routing) -> Problem | NotServable:
    """The seat of a layer's shapes, or why none serves them (shapes are tuples)."""
    if len(x) != 2 or len(w13) != 3 or len(w2) != 3 or len(ids) != 2 or ids != weights:
        return NotServable(f"hidden {format_shape(x)}, gate_up {format_shape(w13)}, down {format_shape(w2)}, "
                           f"routing {format_shape(ids)} and {format_shape(weights)}: (T, H), (E, 2I, H), "
                           "(E, H, I), (T, K) and (T, K) expected")
    T, H = x
    E, I2, H2 = w13
    I = I2 // 2
    K = ids[1]
    if I2 % 2 or H2 != H or w2 != (E, H, I) or ids[0] != T:
        return NotServable(f"hidden {format_shape(x)}, gate_up {format_shape(w13)}, down {format_shape(w2)}, "
                           f"routing {format_shape(ids)}: the shapes do not chain")
    if min(T, H, E, I, K) == 0:
        return EMPTY
    if T * K > INT32_MAX:  # element offsets are int64; the sorted pairs are int32
        return NotServable(f"{T * K} (token, slot) pairs: 2^31 or more (the kernel sorts pairs in int32)")
    extra = (("T", T),) if routing == "float32" else (("T", T), ("routing", routing))
    return Problem(SPEC.name, tuple(dtypes), FLAGS, (E, K, H, I, -(-T * K // E)), tuple(sorted(extra)))


def skewed_routing(rng, T: int, E: int, K: int) -> tuple[np.ndarray, np.ndarray]:
    """(T, K) distinct expert ids per token, drawn with a Zipf-like preference for a few
    experts (their order shuffled), and weights that sum to 1 per token."""
    preference = np.log(1.0 / np.arange(1, E + 1) ** 1.2)[rng.permutation(E)]
    scores = preference[None, :] + rng.gumbel(size=(T, E))  # Gumbel top-k: a draw without replacement
    ids = np.argsort(-scores, axis=1, kind="stable")[:, :K].astype(np.int64)
    weights = rng.random((T, K)) + 0.05
    return ids, weights / weights.sum(axis=1, keepdims=True)


def moe_row(E, K, H, I, T, dt, routing="float32"):
    from nbx_tune.kernels.rows import make_row

    return make_row(OP, [dt, dt, dt, "int64", routing], [(T, H), (E, 2 * I, H), (E, H, I), (T, K), (T, K)])


SPEC = MoeExpertsSpec()
SPECS = (SPEC,)
