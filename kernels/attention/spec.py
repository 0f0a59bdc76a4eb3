"""The attention spec: config space, launch key, trace rows, static refusals, inputs, oracle, example rows.
"""

from __future__ import annotations

import math

import torch
import triton

from nbx_tune.kernels.attention.kernel import (TensorDescriptor, _attn_combine_kernel, _attn_decode_kernel,
                                               _attn_fwd_kernel, _attn_fwd_rows, _attn_step, _block, _tma_strides,
                                               kv_descriptors, launch_attention, launch_attention_decode)
from nbx_tune.kernels.helpers import FLOATS, torch_dtypes
from nbx_tune.kernels.rows import format_shape
from nbx_tune.kernels.spec import Config, KernelSpec, KeyDim, NotServable, Problem, one_dtype, seat_flags
from nbx_tune.oracles import attention as oracle

TORCH_DTYPES = torch_dtypes(*FLOATS)
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
MAX_HEAD_DIM = 256
MAX_GRID_Y = 65535  # the grid's second axis holds batch * query heads
INT32_MAX = 2**31 - 1
LSE_ALIGN = 32  # the memory-efficient kernel pads its logsumexp rows to a multiple of 32

SDPA = "aten.scaled_dot_product_attention"
FLASH = "aten._scaled_dot_product_flash_attention"
EFFICIENT = "aten._scaled_dot_product_efficient_attention"
FLASH_CPU = "aten._scaled_dot_product_flash_attention_for_cpu"


def _c(bm, bn, warps, stages, split=0, pack=1, tma=0, ws=0, fma=0, lpt=0, pair=0):
    extra = {"SPLIT_KV": split} if split else ({"PACK": pack} if pack > 1 else {})
    for name, on in (("TMA", tma), ("WS", ws), ("FMA", fma), ("LPT", lpt), ("PAIR", pair)):
        if on:
            extra[name] = 1
    return Config.make(BLOCK_M=bm, BLOCK_N=bn, **extra, num_warps=warps, num_stages=stages)


# BLOCK_M 16 for decode (Lq = 1..16: a taller tile is wasted rows); 32-64 for small-smem
# devices and head dim 256; 128 x 64/128 with 8 warps and 3-4 stages for Ampere/Hopper at
# D <= 128 (the shape of Triton's own fused-attention tutorial). 16 x 16 at one stage is the
# fallback that fits fp32 at D = 256 in 48 KB. The space is the same on every device: the
# shared-memory prune refuses the tiles a device cannot hold (e.g. 128 x 128 x 3 stages at
# D = 256).
CONFIGS = (
    _c(16, 16, 2, 1), _c(16, 32, 4, 2), _c(16, 64, 4, 2), _c(16, 128, 4, 2), _c(16, 128, 4, 3),
    _c(32, 32, 4, 2), _c(32, 64, 4, 2), _c(32, 64, 4, 3), _c(32, 128, 4, 2),
    _c(64, 32, 4, 2), _c(64, 32, 4, 3), _c(64, 64, 4, 2), _c(64, 64, 4, 3), _c(64, 64, 4, 4),
    _c(64, 128, 4, 2), _c(64, 128, 4, 3), _c(64, 128, 8, 3),
    _c(128, 32, 4, 2), _c(128, 32, 8, 3), _c(128, 64, 4, 3), _c(128, 64, 8, 2), _c(128, 64, 8, 3),
    _c(128, 64, 8, 4), _c(128, 128, 8, 2), _c(128, 128, 8, 3),
    # Decode (`_attn_decode_kernel`, at most DECODE_MAX_LQ queries): the query heads of a
    # key/value head packed into one tile's rows, the keys split SPLIT_KV ways so that a
    # batch of one still has B * Hkv * SPLIT_KV programs. (128-wide splits and a 64-wide
    # unsplit tile, never within 3 % of the best on the H200, are left out.)
    _c(16, 128, 4, 2, split=1), _c(16, 64, 4, 3, split=4), _c(16, 64, 4, 3, split=8),
    _c(16, 64, 4, 3, split=16), _c(32, 64, 4, 3, split=4),
    # Grouped-query prefill: PACK query heads of a key/value head in one program's rows, so
    # K/V tiles cross from L2 once per PACK heads. Refused where PACK does not divide the group.
    _c(64, 64, 4, 3, pack=2), _c(64, 64, 4, 3, pack=4), _c(128, 64, 8, 3, pack=2), _c(128, 64, 8, 3, pack=4),
    _c(128, 128, 8, 3, pack=4),
    # Prefill with the levers of Triton's fused-attention tutorial: FMA (the scale folded
    # into the exponent's subtraction), TMA (K/V through descriptors; refused without a TMA
    # unit), WS (the unmasked loop warp-specialized, with TMA), LPT (causal: every head's
    # longest query block first, one grid axis), PAIR (causal: a long and a short query block
    # per program); LPT and PAIR are refused where not causal.
    # 64-row tiles with 4 warps (one warp group) give a short prefill's few heads more
    # programs than SMs; 128-row tiles with 8 warps are the tutorial's.
    _c(64, 64, 4, 3, fma=1), _c(64, 64, 4, 4, fma=1), _c(64, 128, 4, 3, fma=1), _c(64, 64, 4, 3, fma=1, lpt=1),
    _c(64, 64, 4, 3, tma=1, fma=1), _c(64, 64, 4, 4, tma=1, fma=1), _c(64, 128, 4, 2, tma=1, fma=1),
    _c(64, 128, 4, 3, tma=1, fma=1), _c(64, 64, 4, 3, tma=1, fma=1, lpt=1), _c(64, 64, 4, 3, pack=4, tma=1, fma=1),
    _c(64, 64, 4, 3, tma=1, ws=1, fma=1),
    _c(128, 64, 8, 3, fma=1), _c(128, 128, 8, 2, fma=1), _c(128, 64, 8, 3, fma=1, lpt=1),
    _c(128, 64, 8, 3, tma=1, fma=1), _c(128, 64, 8, 4, tma=1, fma=1),
    _c(128, 128, 8, 2, tma=1, fma=1), _c(128, 128, 8, 3, tma=1, fma=1),
    _c(128, 64, 8, 3, tma=1, fma=1, lpt=1), _c(128, 128, 8, 2, tma=1, fma=1, lpt=1),
    _c(128, 64, 8, 3, pack=4, tma=1, fma=1), _c(128, 64, 8, 3, pack=4, tma=1, fma=1, lpt=1),
    _c(128, 128, 8, 2, pack=2, tma=1, fma=1, lpt=1),
    _c(128, 64, 8, 3, tma=1, ws=1, fma=1), _c(128, 128, 8, 2, tma=1, ws=1, fma=1),
    _c(128, 64, 8, 3, tma=1, ws=1, fma=1, lpt=1),
    _c(64, 64, 4, 3, tma=1, fma=1, pair=1), _c(128, 64, 8, 3, fma=1, pair=1), _c(128, 64, 8, 3, tma=1, fma=1, pair=1),
    _c(128, 128, 8, 2, tma=1, fma=1, pair=1), _c(128, 64, 8, 3, pack=4, tma=1, fma=1, pair=1),
)
DECODE_MAX_LQ = 16

# Served when a seat has no certificate: the first that fits the device.
DEFAULTS = (_c(128, 64, 8, 3), _c(64, 64, 4, 2), _c(64, 32, 4, 2), _c(32, 32, 4, 2), _c(16, 16, 2, 1))

# Params each op's schema has, besides the tensors (a row naming another is not served).
_PARAMS = {
    SDPA: {"attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"},
    FLASH: {"dropout_p", "is_causal", "return_debug_mask", "scale"},
    EFFICIENT: {"attn_bias", "compute_log_sumexp", "dropout_p", "is_causal", "scale"},
    FLASH_CPU: {"dropout_p", "is_causal", "attn_mask", "scale"},
}
_MASK_PARAM = {SDPA: "attn_mask", EFFICIENT: "attn_bias", FLASH_CPU: "attn_mask"}



def size_limit(B: int, Hq: int, D: int, Dv: int, slab: int) -> str | None:
    """Why a call of these sizes is beyond the kernels (the rule the spec and the public op
    share), or None: head dims past MAX_HEAD_DIM, more (batch x query heads) than the grid's
    second axis takes, or one head's slab of `slab` elements past int32 indexing."""
    if max(D, Dv) > MAX_HEAD_DIM:
        return f"head dim {max(D, Dv)} > {MAX_HEAD_DIM}"
    if B * Hq > MAX_GRID_Y:
        return f"batch x heads {B * Hq} > {MAX_GRID_Y} (the grid's second axis)"
    if slab > INT32_MAX:
        return "one head's slab holds 2^31 elements or more (indexed in int32)"
    return None

class AttentionSpec(KernelSpec):
    name = "attention"
    ops = (SDPA, FLASH, EFFICIENT, FLASH_CPU)
    # BH = batch * query heads (the grid's second axis: how many programs run at short
    # sequences), Lq (query blocks, and for causal the triangle's size), Lk (the key loop's
    # length), D and Dv (the head dims: the tile widths, registers and shared memory of a
    # config; the `default` ladder is exact up to 64 and 16 wide above, and no 16-wide bucket
    # straddles a power of two, so every problem of a seat loads its head dims in the same
    # power-of-two blocks and has the same shared-memory need).
    key = (KeyDim("BH"), KeyDim("Lq"), KeyDim("Lk"), KeyDim("D"), KeyDim("Dv"))
    dtypes = tuple(TORCH_DTYPES)
    description = "flash-attention forward (online softmax), causal or not, GQA, head dims 1..256"

    config_space = CONFIGS
    default_configs = DEFAULTS

    def static_refusal(self, profile, config, problem):
        pack = config.kwargs.get("PACK", 1)
        if pack > 1 and (problem.get("Hq") // problem.get("Hkv")) % pack:
            return ("not_applicable", f"PACK {pack} query heads per program: the group is "
                                      f"{problem.get('Hq') // problem.get('Hkv')} heads")
        if config.kwargs.get("TMA"):
            if TensorDescriptor is None:
                return ("no_tma", f"TMA loads need host-side tensor descriptors, which Triton "
                                  f"{triton.__version__} lacks (3.4 and later have them)")
            if not profile.has_tma:
                return ("no_tma", f"TMA loads need an NVIDIA sm_90 or later device; profile {profile.name} has none")
            esize = DTYPE_BYTES[problem.dtypes[0]]
            dims = [d for d in problem.dims[3:] if d * esize % 16]
            if dims:
                return ("not_applicable", f"TMA: a row of head dim {dims[0]} is not a multiple of 16 bytes "
                                          "(each call would read a copy)")
        elif config.kwargs.get("WS"):
            return ("not_applicable", "WS without TMA: warp specialization needs TMA loads")
        for lever in ("LPT", "PAIR"):
            if config.kwargs.get(lever) and dict(problem.flags)["causal"] != "1":
                return ("not_applicable", f"{lever} balances causal query blocks; not causal")
        sk = config.kwargs.get("SPLIT_KV")
        if sk is not None:
            _, Lq, Lk, _, _ = problem.dims
            causal = dict(problem.flags)["causal"] == "1"
            if Lq > DECODE_MAX_LQ:
                return ("not_applicable", f"the decode kernel is for at most {DECODE_MAX_LQ} queries, Lq is {Lq}")
            if sk > 1 and (causal or Lk < 2 * sk * config["BLOCK_N"]):
                keys = f"causal: at most Lq = {Lq} keys seen" if causal else f"Lk {Lk}"
                return ("not_applicable", f"SPLIT_KV {sk} of {config['BLOCK_N']}-key blocks: {keys}, "
                                          "fewer than 2 blocks per slice")
        return super().static_refusal(profile, config, problem)

    def smem_bytes(self, config, problem):
        # The pipeliner keeps num_stages copies of a K tile (BLOCK_N x BLOCK_D) and a V tile
        # (BLOCK_N x BLOCK_DV); the Q tile (BLOCK_M x BLOCK_D) is staged once for the dot.
        # The row max / row sum reduce within a warp (MMA layout): no cross-warp scratch.
        _, _, _, D, Dv = problem.dims
        esize = DTYPE_BYTES[problem.dtypes[0]]
        bd, bdv = _block(D), _block(Dv)
        stages = max(config.num_stages, 1)
        return (stages * config["BLOCK_N"] * (bd + bdv) + config["BLOCK_M"] * bd) * esize

    def source_parts(self):
        return (_attn_step, _attn_fwd_rows, _attn_fwd_kernel, launch_attention, _tma_strides, kv_descriptors,
                _attn_decode_kernel, _attn_combine_kernel, launch_attention_decode, _block)

    # -- example rows
    def example_rows(self, scale):
        from nbx_tune.kernels.rows import make_row

        rows = []
        for dt in self.dtypes:
            d3 = [dt] * 3
            if scale == "small":
                rows += [
                    # Square causal, D = 16, two batches.
                    make_row(FLASH, d3, [(2, 2, 37, 16)] * 3, {"is_causal": "True"}),
                    # GQA (4 query heads on 2 kv heads), Lq != Lk, D = 24, a custom scale.
                    make_row(FLASH, d3, [(1, 4, 19, 24), (1, 2, 45, 24), (1, 2, 45, 24)],
                             {"scale": "0.3"}),
                    # Causal with Lq < Lk, D = 80, with the padded logsumexp.
                    make_row(EFFICIENT, d3, [(1, 2, 29, 80), (1, 2, 41, 80), (1, 2, 41, 80)],
                             {"attn_bias": "None", "compute_log_sumexp": "True", "is_causal": "True"}),
                    # Causal with Lq > Lk (rows past Lk see every key), Dv != D, no logsumexp.
                    make_row(EFFICIENT, d3, [(1, 3, 45, 16), (1, 3, 23, 16), (1, 3, 23, 24)],
                             {"attn_bias": "None", "compute_log_sumexp": "False", "is_causal": "True"}),
                    # GQA causal with Lq != Lk and a custom scale on the CPU backend op.
                    make_row(FLASH_CPU, d3, [(1, 4, 33, 24), (1, 2, 21, 24), (1, 2, 21, 24)],
                             {"is_causal": "True", "attn_mask": "None", "scale": "0.25"}),
                    make_row(FLASH_CPU, d3, [(2, 2, 27, 40)] * 3, {"attn_mask": "None"}),
                    # The recorded whole op: GQA causal, Lq != Lk.
                    make_row(SDPA, d3, [(1, 4, 23, 32), (1, 2, 39, 32), (1, 2, 39, 32)],
                             {"attn_mask": "None", "is_causal": "True", "enable_gqa": "True"}),
                    make_row(SDPA, d3, [(1, 2, 21, 80)] * 3, {"attn_mask": "None", "scale": "0.125"}),
                ]
            else:
                kv8 = (1, 8, 1024, 128)
                rows += [
                    # Llama-2-7B prefill at 512.
                    make_row(SDPA, d3, [(1, 32, 512, 128)] * 3, {"attn_mask": "None", "is_causal": "True"}),
                    # Llama-3-8B-like GQA: 32 query heads on 8 kv heads.
                    make_row(SDPA, d3, [(1, 32, 1024, 128), kv8, kv8],
                             {"attn_mask": "None", "is_causal": "True", "enable_gqa": "True"}),
                    # GPT-2-like, not causal.
                    make_row(SDPA, d3, [(4, 12, 1024, 64)] * 3, {"attn_mask": "None"}),
                    # Decode: one query against 4096 cached keys, GQA.
                    make_row(SDPA, d3, [(1, 32, 1, 128), (1, 8, 4096, 128), (1, 8, 4096, 128)],
                             {"attn_mask": "None", "enable_gqa": "True"}),
                    # Phi-2-like D = 80, causal, an odd length.
                    make_row(FLASH, d3, [(2, 32, 777, 80)] * 3, {"is_causal": "True"}),
                    # D = 96, not causal, with the padded logsumexp, odd lengths.
                    make_row(EFFICIENT, d3, [(2, 16, 333, 96), (2, 16, 517, 96), (2, 16, 517, 96)],
                             {"attn_bias": "None", "compute_log_sumexp": "True"}),
                    # Gemma-like D = 256, causal, Lq < Lk.
                    make_row(EFFICIENT, d3, [(1, 8, 1000, 256), (1, 8, 1100, 256), (1, 8, 1100, 256)],
                             {"attn_bias": "None", "compute_log_sumexp": "True", "is_causal": "True"}),
                    make_row(FLASH_CPU, d3, [(1, 8, 300, 64)] * 3,
                             {"is_causal": "True", "attn_mask": "None"}),
                ]
        return rows

    # -- trace rows -> problems
    def problem_from_row(self, row):
        op = row.base_op
        allowed = _PARAMS.get(op)
        if allowed is None:
            return NotServable(f"{op} is not an attention op")
        unknown = sorted(set(row.params) - allowed)
        if unknown:
            return NotServable(f"{op}: unknown param(s) {', '.join(unknown)}")
        mask_param = _MASK_PARAM.get(op)
        if op == SDPA and len(row.shapes) == 4:  # with an attn_mask: the masked attention family's seat
            from nbx_tune.kernels.masked_attention.spec import SPEC as MASKED

            return MASKED.problem_from_row(row)
        if len(row.shapes) != 3:
            what = f" ({mask_param} given)" if mask_param and len(row.shapes) == 4 else ""
            return NotServable(f"{op}: serves query, key and value only, the row has "
                               f"{len(row.shapes)} tensors{what}")
        if mask_param and row.params.get(mask_param, "None") != "None":
            return NotServable(f"{op}: {mask_param}={row.params[mask_param]} is not served")
        dtype = one_dtype(row, TORCH_DTYPES)
        if isinstance(dtype, NotServable):
            return dtype
        try:
            dropout = row.params.float("dropout_p", 0.0)
            causal = row.params.bool("is_causal", False)
            scale = row.params.float("scale", None)
            gqa = row.params.bool("enable_gqa", False)
            debug = row.params.bool("return_debug_mask", False)
            want_lse = row.params.bool("compute_log_sumexp", None)
        except ValueError as e:
            return NotServable(f"{op}: bad param: {e}")
        if dropout != 0.0:
            return NotServable(f"dropout_p={dropout}: dropout is random, a certified kernel is not")
        if debug:
            return NotServable("return_debug_mask=True (the debug attention mask) is not served")
        if op == EFFICIENT and want_lse is None:
            return NotServable(f"{op}: compute_log_sumexp is required")
        qs, ks, vs = row.shapes
        if len(qs) != 4 or len(ks) != 4 or len(vs) != 4:
            return NotServable(f"query, key and value must be 4-D (batch, heads, seq, dim), got "
                               f"{format_shape(qs)}, {format_shape(ks)}, {format_shape(vs)}")
        B, Hq, Lq, D = qs
        Bk, Hkv, Lk, Dk = ks
        if ks[:3] != vs[:3]:
            return NotServable(f"key {format_shape(ks)} and value {format_shape(vs)} differ in batch, heads or length")
        Dv = vs[3]
        if Bk != B:
            return NotServable(f"query batch {B} != key batch {Bk}")
        if Dk != D:
            return NotServable(f"query head dim {D} != key head dim {Dk}")
        if min(B, Hq, Lq, D, Hkv, Lk, Dv) == 0:
            return NotServable("an empty tensor: nothing to launch")
        if Hkv != Hq:
            if Hkv > Hq or Hq % Hkv:
                return NotServable(f"key/value heads {Hkv} do not divide query heads {Hq}")
            if op == SDPA and not gqa:
                return NotServable(f"{Hkv} key/value heads for {Hq} query heads needs enable_gqa=True")
        if op in (FLASH, FLASH_CPU) and Dv != D:
            return NotServable(f"{op} needs one head dim for query, key and value, got {D} and {Dv}")
        if op == FLASH and causal and Lq != Lk:
            # PyTorch's CUDA flash kernel (flash-attn 2) aligns the causal mask to the
            # bottom-right when Lq != Lk; sdpa never routes such a call to it.
            return NotServable(f"{op} with is_causal and Lq {Lq} != Lk {Lk}: the CUDA flash "
                               "kernel aligns the mask bottom-right, this kernel top-left")
        why = size_limit(B, Hq, D, Dv, max(Lq * D, Lk * D, Lk * Dv, Lq * Dv))
        if why:
            return NotServable(why)
        if scale is None:
            scale = 1.0 / math.sqrt(D)
        if not math.isfinite(scale):
            return NotServable(f"scale={scale} is not finite")
        if op == SDPA:
            lse = "none"
        elif op == EFFICIENT:
            lse = "pad32" if want_lse else "none"
        else:
            lse = "exact"
        extra = (("B", B), ("Hkv", Hkv), ("Hq", Hq), ("lse", lse), ("scale", scale))
        return Problem(self.name, (dtype,), seat_flags(causal=int(causal)), (B * Hq, Lq, Lk, D, Dv),
                       extra)

    def resized(self, problem, dims):
        # The sequence lengths only: batch x heads and the head dims stay (the extra holds
        # them); a causal mask over a square stays square.
        BH, _, _, D, Dv = problem.dims
        Lq, Lk = dims[1], dims[2]
        if dict(problem.flags)["causal"] == "1" and (Lq == Lk) != (problem.dims[1] == problem.dims[2]):
            return None
        if max(Lq * D, Lk * D, Lk * Dv, Lq * Dv) > INT32_MAX:
            return None
        return Problem(problem.kernel, problem.dtypes, problem.flags, (BH, Lq, Lk, D, Dv), problem.extra)

    # -- inputs, oracle, outputs, launch
    def input_shapes(self, problem):
        _, Lq, Lk, D, Dv = problem.dims
        B, Hq, Hkv = problem.get("B"), problem.get("Hq"), problem.get("Hkv")
        dt = problem.dtypes[0]
        return {"q": ((B, Hq, Lq, D), dt), "k": ((B, Hkv, Lk, D), dt), "v": ((B, Hkv, Lk, Dv), dt)}

    def make_inputs(self, problem, rng):
        # Standard normal: with the default scale the scores are ~N(0, 1), a softmax neither
        # flat nor one-hot; a custom scale sharpens or flattens it.
        return {name: (rng.standard_normal(shape), dt)
                for name, (shape, dt) in self.input_shapes(problem).items()}

    def oracle(self, problem, inputs):
        causal = dict(problem.flags)["causal"] == "1"
        scale = problem.get("scale")
        mode = problem.get("lse")
        q, k, v = inputs["q"], inputs["k"], inputs["v"]
        if mode == "none":
            return {"out": oracle.scaled_dot_product_attention(q, k, v, causal, scale)}
        if mode == "pad32":
            out, lse = oracle.efficient_attention(q, k, v, causal, scale, compute_log_sumexp=True)
        else:
            out, lse = oracle.flash_attention(q, k, v, causal, scale)
        return {"out": out, "lse": lse}

    def output_specs(self, problem):
        _, Lq, _, _, Dv = problem.dims
        B, Hq = problem.get("B"), problem.get("Hq")
        specs = {"out": ((B, Hq, Lq, Dv), problem.dtypes[0])}
        mode = problem.get("lse")
        if mode == "exact":
            specs["lse"] = ((B, Hq, Lq), "float32")
        elif mode == "pad32":
            specs["lse"] = ((B, Hq, -(-Lq // LSE_ALIGN) * LSE_ALIGN), "float32")
        return specs

    def serve_ops(self):
        from nbx_tune.kernels.attention.ops import _serve_sdpa  # ops.py imports this module

        return {SDPA: _serve_sdpa}

    def launch(self, config, problem, inputs, outputs):
        q = inputs["q"]
        lse = outputs.get("lse")
        if lse is None:  # the op does not return it: the kernel writes a scratch row
            B, Hq, Lq = q.shape[:3]
            lse = torch.empty((B, Hq, Lq), dtype=torch.float32, device=q.device)
        launch_attention(q, inputs["k"], inputs["v"], outputs["out"], lse, problem.get("scale"),
                         dict(problem.flags)["causal"] == "1", config)


SPEC = AttentionSpec()
