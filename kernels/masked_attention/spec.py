"""The masked attention spec: config space, launch key, trace rows, static refusals, inputs,
oracle, example rows.
"""

from __future__ import annotations

import math

import numpy as np

from nbx_tune.kernels.attention.kernel import _block as head_block
from nbx_tune.kernels.attention.spec import size_limit as attention_size_limit
from nbx_tune.kernels.helpers import FLOATS, torch_dtypes
from nbx_tune.kernels.masked_attention.kernel import (ADD_MASK, BOOL_MASK, NO_MASK, _full_block, _masked_attn_kernel,
                                                      _masked_block, _masked_combine_kernel, _masked_step,
                                                      launch_masked_attention)
from nbx_tune.kernels.rows import format_shape
from nbx_tune.kernels.spec import Config, KernelSpec, KeyDim, NotServable, Problem, seat_flags
from nbx_tune.oracles import masked_attention as oracle

TORCH_DTYPES = torch_dtypes(*FLOATS)
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "bool": 1}
INT32_MAX = 2**31 - 1
DECODE_MAX_ROWS = 64  # query rows of a key/value head (group x Lq) a split-key config serves

OP = "nbx_tune.masked_attention"  # the public op's trace rows
SDPA = "aten.scaled_dot_product_attention"  # with an attn_mask (the attention family serves it without)
MASK_KINDS = {"none": NO_MASK, "bool": BOOL_MASK, "add": ADD_MASK}


def _c(bm, bn, warps, stages, split=1):
    return Config.make(BLOCK_M=bm, BLOCK_N=bn, SPLIT=split, num_warps=warps, num_stages=stages)


# Prefill tiles as the attention family's (64-128 query rows, 32-128 keys, 4-8 warps, 2-4
# stages); small tiles for small-smem devices and head dim 256. Decode: 16-32 rows (a key/value
# head's query heads packed together) with the keys split SPLIT ways (flash-decoding), so a
# small batch still fills the device.
CONFIGS = (
    _c(16, 16, 2, 1), _c(16, 32, 4, 2), _c(32, 32, 4, 2), _c(32, 64, 4, 2),
    _c(64, 32, 4, 2), _c(64, 64, 4, 2), _c(64, 64, 4, 3), _c(64, 128, 4, 2), _c(64, 128, 4, 3), _c(64, 64, 8, 3),
    _c(128, 32, 4, 2), _c(128, 32, 8, 3), _c(128, 64, 4, 3), _c(128, 64, 8, 2), _c(128, 64, 8, 3), _c(128, 64, 8, 4),
    _c(128, 128, 8, 2), _c(128, 128, 8, 3),
    _c(16, 64, 4, 2), _c(16, 128, 4, 2), _c(16, 64, 4, 3, split=4), _c(16, 64, 4, 3, split=8),
    _c(16, 64, 4, 3, split=16), _c(16, 128, 4, 2, split=8), _c(32, 64, 4, 3, split=4), _c(32, 64, 4, 3, split=8),
)
# Served when a seat has no certificate: the first the profile and the problem admit.
DEFAULTS = (_c(128, 64, 8, 3), _c(64, 64, 4, 2), _c(32, 32, 4, 2), _c(16, 64, 4, 3, split=8), _c(16, 64, 4, 2),
            _c(16, 16, 2, 1))


def size_limit(B: int, Hkv: int, D: int, Dv: int, slab: int) -> str | None:
    """Why a call of these sizes is beyond the kernel, or None: the attention family's rule,
    whose grid's second axis holds batch x query heads; this one's holds batch x key/value heads."""
    return attention_size_limit(B, Hkv, D, Dv, slab)


def seat_of(dtype: str, mask: str, causal: bool, window: int, ranges: bool, B, Hq, Hkv, Lq, Lk, D, Dv):
    """(dtypes, flags, dims) of a launch: the one rule the public op and the trace rows share.
    The key's W is the widest span of keys a row can see (the window, else every key)."""
    flags = seat_flags(mask=mask, causal=int(bool(causal or window)), window=int(window > 0), ranges=int(ranges))
    return (dtype,), flags, (B * Hq, Hq // Hkv, Lq, Lk, D, Dv, min(window, Lk) if window > 0 else Lk)


class MaskedAttentionSpec(KernelSpec):
    name = "masked_attention"
    ops = (OP,)
    # BH = batch * query heads, G the query heads per key/value head (decode packs G x Lq rows
    # in a program), Lq, Lk, the head dims D and Dv, and W: the keys a row can see at most (a
    # sliding window's width, else Lk), which is what a row's loop costs.
    key = (KeyDim("BH"), KeyDim("G"), KeyDim("Lq"), KeyDim("Lk"), KeyDim("D"), KeyDim("Dv"), KeyDim("W"))
    dtypes = tuple(TORCH_DTYPES)
    description = ("attention with a boolean or additive mask (broadcast over batch and heads), sliding-window "
                   "causal and padded batches without a mask read, GQA, prefill and split-key decode")

    config_space = CONFIGS
    default_configs = DEFAULTS

    def source_parts(self):
        return (_masked_step, _masked_block, _full_block, _masked_attn_kernel, _masked_combine_kernel,
                head_block, launch_masked_attention)

    def static_refusal(self, profile, config, problem):
        _, G, Lq, _, _, _, W = problem.dims
        rows = G * Lq
        bm, split = config["BLOCK_M"], config["SPLIT"]
        if bm >= 32 and bm >= 4 * rows:
            return ("not_applicable", f"BLOCK_M {bm} for {rows} query rows per key/value head")
        if split > 1:
            if rows > DECODE_MAX_ROWS:
                return ("not_applicable", f"SPLIT {split} is for at most {DECODE_MAX_ROWS} query rows per "
                                          f"key/value head, this has {rows}")
            if W < 2 * split * config["BLOCK_N"]:
                return ("not_applicable", f"SPLIT {split} of {config['BLOCK_N']}-key blocks: {W} keys seen, "
                                          "fewer than 2 blocks per slice")
        return super().static_refusal(profile, config, problem)

    def smem_bytes(self, config, problem):
        # num_stages copies of a K and a V tile and (with a mask) of the mask tile; Q once.
        _, _, _, _, D, Dv, _ = problem.dims
        esize = DTYPE_BYTES[problem.dtypes[0]]
        stages = max(config.num_stages, 1)
        mask = dict(problem.flags)["mask"]
        mbytes = 0 if mask == "none" else (1 if mask == "bool" else esize)
        return (stages * config["BLOCK_N"] * ((head_block(D) + head_block(Dv)) * esize + config["BLOCK_M"] * mbytes)
                + config["BLOCK_M"] * head_block(D) * esize)

    # -- trace rows -> problems
    def problem_from_row(self, row):
        op = row.base_op
        if op not in (OP, SDPA):
            return NotServable(f"{op} is not a masked attention op")
        try:
            scale = row.params.float("scale", None)
            if op == SDPA:
                unknown = sorted(set(row.params) - {"attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"})
                if row.params.float("dropout_p", 0.0) != 0.0:
                    return NotServable("dropout is random, a certified kernel is not")
                if row.params.bool("is_causal", False):
                    return NotServable("is_causal with an attn_mask: torch refuses it")
                gqa = row.params.bool("enable_gqa", False)
                causal, window, pad = False, 0, None
            else:
                unknown = sorted(set(row.params) - {"is_causal", "window", "ranges", "scale"})
                gqa = True
                causal = row.params.bool("is_causal", False)
                window = int(row.params.get("window", "0"))
                pad = row.params.get("ranges")
        except ValueError as e:
            return NotServable(f"{op}: bad param: {e}")
        if unknown:
            return NotServable(f"{op}: unknown param(s) {', '.join(unknown)}")
        if pad not in (None, "left", "right"):
            return NotServable(f"{op}: ranges={pad}: left or right")
        shapes, dtypes = [tuple(s) for s in row.shapes], list(row.dtypes)
        if pad is not None:
            if len(shapes) < 4 or shapes[-1][-1:] != (2,) or dtypes[-1] != "int32":
                return NotServable(f"{op}: ranges={pad} needs a last int32 (B, 2) tensor")
            shapes, dtypes = shapes[:-1], dtypes[:-1]
        if len(shapes) not in (3, 4):
            return NotServable(f"{op}: query, key, value and an optional mask, the row has {len(shapes)} tensors")
        dt = dtypes[0]
        if dt not in TORCH_DTYPES or dtypes[1:3] != [dt, dt]:
            return NotServable(f"dtypes {','.join(dtypes[:3])}: one of {', '.join(TORCH_DTYPES)} for all three")
        qs, ks, vs = shapes[:3]
        if len(qs) != 4 or len(ks) != 4 or len(vs) != 4:
            return NotServable(f"query, key and value must be 4-D, got {format_shape(qs)}, {format_shape(ks)}, "
                               f"{format_shape(vs)}")
        B, Hq, Lq, D = qs
        _, Hkv, Lk, _ = ks
        Dv = vs[3]
        if ks[0] != B or vs[:3] != ks[:3] or ks[3] != D or Hkv == 0 or Hq % Hkv:
            return NotServable(f"shapes {format_shape(qs)}, {format_shape(ks)}, {format_shape(vs)} do not fit "
                               "(B, Hq, Lq, D), (B, Hkv, Lk, D), (B, Hkv, Lk, Dv), Hkv | Hq")
        if Hkv != Hq and not gqa:
            return NotServable(f"{Hkv} key/value heads for {Hq} query heads needs enable_gqa=True")
        if min(B, Hq, Lq, D, Lk, Dv) == 0:
            return NotServable("an empty tensor: nothing to launch")
        mask, mask_shape = "none", None
        if len(shapes) == 4:
            ms = shapes[3]
            mask = "bool" if dtypes[3] == "bool" else "add"
            if mask == "add" and dtypes[3] != dt:
                return NotServable(f"an additive mask of {dtypes[3]} for {dt} attention")
            if len(ms) > 4 or not all(m in (1, n) for m, n in zip(ms[::-1], (Lk, Lq, Hq, B))):
                return NotServable(f"mask {format_shape(ms)} does not broadcast to {format_shape((B, Hq, Lq, Lk))}")
            mask_shape = (1,) * (4 - len(ms)) + ms
        elif op == SDPA:
            return NotServable(f"{op} without attn_mask: the attention family serves it")
        why = size_limit(B, Hkv, D, Dv, max(Lq * D, Lk * D, Lk * Dv, Lq * Dv))
        if why:
            return NotServable(why)
        scale = 1.0 / math.sqrt(D) if scale is None else scale
        if not math.isfinite(scale):
            return NotServable(f"scale={scale} is not finite")
        if window < 0:
            return NotServable(f"window={window} < 0")
        dtypes_, flags, dims = seat_of(dt, mask, causal, window, pad is not None, B, Hq, Hkv, Lq, Lk, D, Dv)
        extra = (("B", B), ("Hkv", Hkv), ("Hq", Hq), ("mask_shape", mask_shape), ("pad", pad), ("scale", scale),
                 ("window", window))
        return Problem(self.name, dtypes_, flags, dims, extra)

    def resized(self, problem, dims):
        # The sequence lengths only (the mask's follow them); batch x heads and head dims stay.
        BH, G, _, _, D, Dv, _ = problem.dims
        Lq, Lk = dims[2], dims[3]
        if max(Lq * D, Lk * D, Lk * Dv, Lq * Dv) > INT32_MAX:
            return None
        window = problem.get("window")
        extra = dict(problem.extra)
        ms = problem.get("mask_shape")
        if ms is not None:
            extra["mask_shape"] = (ms[0], ms[1], Lq if ms[2] != 1 else 1, Lk if ms[3] != 1 else 1)
        return Problem(problem.kernel, problem.dtypes, problem.flags,
                       (BH, G, Lq, Lk, D, Dv, min(window, Lk) if window else Lk), tuple(sorted(extra.items())))

    # -- inputs, oracle, outputs, launch
    def input_shapes(self, problem):
        _, _, Lq, Lk, D, Dv, _ = problem.dims
        B, Hq, Hkv = problem.get("B"), problem.get("Hq"), problem.get("Hkv")
        dt = problem.dtypes[0]
        shapes = {"q": ((B, Hq, Lq, D), dt), "k": ((B, Hkv, Lk, D), dt), "v": ((B, Hkv, Lk, Dv), dt)}
        mask = dict(problem.flags)["mask"]
        if mask != "none":
            shapes["mask"] = (tuple(problem.get("mask_shape")), "bool" if mask == "bool" else dt)
        if problem.get("pad"):
            shapes["ranges"] = ((B, 2), "int32")
        return shapes

    def make_inputs(self, problem, rng):
        shapes = self.input_shapes(problem)
        out = {n: (rng.standard_normal(shapes[n][0]), shapes[n][1]) for n in ("q", "k", "v")}
        _, _, Lq, Lk, _, _, _ = problem.dims
        if "mask" in shapes:
            ms, mdt = shapes["mask"]
            drop = rng.random(ms) < 0.25
            drop[(0,) * (len(ms) - 2) + (ms[2] // 2,)] = True  # one row sees no key: torch's zeros
            if mdt == "bool":
                out["mask"] = (~drop, "bool")
            else:
                out["mask"] = (np.where(drop, -np.inf, rng.standard_normal(ms)), mdt)
        if "ranges" in shapes:
            B = problem.get("B")
            n = rng.integers(1, Lk + 1, size=B)
            n[0] = Lk  # one sequence unpadded
            lo = Lk - n if problem.get("pad") == "left" else np.zeros(B, dtype=np.int64)
            out["ranges"] = (np.stack([lo, lo + n], 1).astype(np.int64), "int32")
        return out

    def oracle(self, problem, inputs):
        flags = dict(problem.flags)
        _, _, Lq, Lk, _, _, _ = problem.dims
        return {"out": oracle.masked_attention(inputs["q"], inputs["k"], inputs["v"], inputs.get("mask"),
                                               flags["causal"] == "1", Lk - Lq, problem.get("window"),
                                               inputs.get("ranges"), problem.get("scale"))}

    def output_specs(self, problem):
        _, _, Lq, _, _, Dv, _ = problem.dims
        return {"out": ((problem.get("B"), problem.get("Hq"), Lq, Dv), problem.dtypes[0])}

    def serve_ops(self):
        return {}  # SDPA with a mask reaches this family through the attention family's route

    def launch(self, config, problem, inputs, outputs):
        flags = dict(problem.flags)
        _, _, Lq, Lk, _, _, _ = problem.dims
        launch_masked_attention(inputs["q"], inputs["k"], inputs["v"], outputs["out"], problem.get("scale"), config,
                                mask=inputs.get("mask"), mask_kind=MASK_KINDS[flags["mask"]],
                                causal=flags["causal"] == "1", offset=Lk - Lq, window=problem.get("window"),
                                ranges=inputs.get("ranges"))

    def example_rows(self, scale):
        from nbx_tune.kernels.rows import make_row

        rows = []
        for dt in self.dtypes:
            d3 = [dt] * 3
            if scale == "small":
                q, kv = (2, 4, 21, 16), (2, 2, 21, 16)
                rows += [
                    # A bool mask broadcast over the heads; GQA; Lq, Lk off the blocks.
                    make_row(OP, [*d3, "bool"], [q, kv, kv, (2, 1, 21, 21)]),
                    # An additive mask broadcast over batch and heads, D = 80, Lq != Lk.
                    make_row(OP, [*d3, dt], [(2, 2, 9, 80), (2, 2, 33, 80), (2, 2, 33, 80), (9, 33)],
                             {"scale": "0.2"}),
                    # A sliding window (bottom-right causal), left padding.
                    make_row(OP, [*d3, "int32"], [q, kv, kv, (2, 2)], {"window": "5", "ranges": "left"}),
                    # Decode: one query, a window and right padding.
                    make_row(OP, [*d3, "int32"], [(2, 4, 1, 16), (2, 2, 45, 16), (2, 2, 45, 16), (2, 2)],
                             {"window": "17", "ranges": "right"}),
                ]
            else:
                kv8 = (2, 8, 4096, 128)
                rows += [
                    # Mistral-7B prefill at 4096: window 4096, left-padded batch of 2.
                    make_row(OP, [*d3, "int32"], [(2, 32, 4096, 128), kv8, kv8, (2, 2)],
                             {"window": "4096", "ranges": "left"}),
                    # Its decode step with 8192 keys cached.
                    make_row(OP, [*d3, "int32"], [(4, 32, 1, 128), (4, 8, 8192, 128), (4, 8, 8192, 128), (4, 2)],
                             {"window": "4096", "ranges": "left"}),
                    # A materialized bool mask (B, 1, L, L), GQA, odd lengths, D = 80.
                    make_row(OP, [*d3, "bool"], [(2, 16, 777, 80), (2, 4, 777, 80), (2, 4, 777, 80),
                                                 (2, 1, 777, 777)]),
                    make_row(SDPA, [*d3, dt], [(1, 8, 1000, 64)] * 3 + [(1, 1, 1000, 1000)], {}),
                ]
        return rows


SPEC = MaskedAttentionSpec()
