"""The fused ops against the patterns they replace, side by side in one run, at Llama-7B's
shapes (a decode step's and a 512-token prefill's, bf16): `rotary` (q of 32 heads of 128,
against transformers' apply_rotary_pos_emb for one tensor: 5 torch launches), `rotary_qk`
(q and k of 8 heads in one launch: 10), `silu_mul`
(the MLP's 11008 columns, against silu(gate) * up: 2 launches), and `add_rms_norm` /
`add_layer_norm` (a residual add and the norm of the sum, against the add and the norm: 2
launches; GPT-2's 768 columns for the layer norm), and `rope_cos_sin` (the rotary
embedding's cos and sin tables of a forward's positions, against LlamaRotaryEmbedding's
code: 9 launches), and `cat_kv` (a decode step's KV cache grown, keys and values, against
DynamicLayer.update's two cats). Per case: device time
(every launch queued ahead of the GPU), eager wall time per call (the host's launch cost
included: what a decode step pays), each one's error against fp64, and the ratios.

    python bench/fused_ops.py              # on the GPU, after a census of the fused ops' seats
    python bench/fused_ops.py --no-census  # the declared defaults
    python bench/fused_ops.py --smoke      # the CPU interpreter, tiny shapes: checks the script runs

Writes fused_ops.json under $OUT (or bench_out/).
"""

from __future__ import annotations

import os
import sys

SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

from nbx_tune.testing.bench import (certify_recorded, environment, per_call_ms, save, side_by_side, table,  # noqa: E402
                                   wall_ms)


def cases(torch, dev, dt):
    """(name, fused op, torch's pattern, args)."""
    from nbx_tune import kernels as K
    from nbx_tune.kernels.serving import custom_ops

    def r(*shape):
        return torch.randn(*shape, device=dev, dtype=dt)

    def rope(s, h, d):  # q as the model makes it: a (B, S, H, D) projection viewed as (B, H, S, D)
        return (r(1, s, h, d).transpose(1, 2), r(1, s, d).clamp(-1, 1), r(1, s, d).clamp(-1, 1))

    def rope_qk(s, h, hk, d):  # q and k (grouped-query: hk heads) against one cos and sin
        q, cos, sin = rope(s, h, d)
        return (q, r(1, s, hk, d).transpose(1, 2), cos, sin)

    (s_dec, s_pre, h, hk, d, f, n, n_gpt2) = (1, 9, 3, 1, 16, 37, 40, 24) if SMOKE else (1, 512, 32, 8, 128, 11008,
                                                                                          4096, 768)
    ctx = 7 if SMOKE else 2048
    inv_freq = 1.0 / 10000 ** (torch.arange(0, d, 2, device=dev).float() / d)
    return [(f"rotary decode 1x{h}x{s_dec}x{d}", K.rotary, custom_ops.rotary, rope(s_dec, h, d)),
            (f"rotary prefill 1x{h}x{s_pre}x{d}", K.rotary, custom_ops.rotary, rope(s_pre, h, d)),
            (f"rotary_qk decode q {h}, k {hk} heads", K.rotary_qk, custom_ops.rotary_qk, rope_qk(s_dec, h, hk, d)),
            (f"rotary_qk prefill {s_pre}", K.rotary_qk, custom_ops.rotary_qk, rope_qk(s_pre, h, hk, d)),
            (f"silu_mul decode 1x{s_dec}x{f}", K.silu_mul, custom_ops.silu_mul, (r(1, s_dec, f), r(1, s_dec, f))),
            (f"silu_mul prefill 1x{s_pre}x{f}", K.silu_mul, custom_ops.silu_mul, (r(1, s_pre, f), r(1, s_pre, f))),
            (f"add_rms_norm decode 8x1x{n}", K.add_rms_norm, custom_ops.add_rms_norm,
             (r(8, 1, n), r(8, 1, n), r(n), 1e-6)),
            (f"add_rms_norm prefill 1x{s_pre}x{n}", K.add_rms_norm, custom_ops.add_rms_norm,
             (r(1, s_pre, n), r(1, s_pre, n), r(n), 1e-6)),
            (f"add_layer_norm prefill 4x{s_pre}x{n_gpt2}", K.add_layer_norm, custom_ops.add_layer_norm,
             (r(4, s_pre, n_gpt2), r(4, s_pre, n_gpt2), r(n_gpt2), r(n_gpt2), 1e-5)),
            (f"rope_cos_sin decode 8x1, head dim {d}", K.rope_cos_sin, custom_ops.rope_cos_sin,
             (torch.full((8, 1), 2047, device=dev), inv_freq, 1.0, dt)),
            (f"rope_cos_sin prefill 1x{s_pre}", K.rope_cos_sin, custom_ops.rope_cos_sin,
             (torch.arange(s_pre, device=dev)[None], inv_freq, 1.0, dt)),
            (f"cat_kv decode 8x{hk}x{ctx}x{d} + 1", K.cat_kv, custom_ops.cat_kv,
             (r(8, hk, ctx, d), r(8, 1, hk, d).transpose(1, 2), r(8, hk, ctx, d), r(8, 1, hk, d).transpose(1, 2), -2))]


def certify(all_cases) -> None:
    """A census of the fused ops' seats, recorded from the torch ops, into a fresh database."""
    def run():
        for _, _, pattern, args in all_cases:
            pattern(*args)
    certify_recorded(run, "nbx-fused-", SMOKE)


def eager_us(fn, sync, calls: int) -> float:
    """Wall time per call of `calls` back-to-back eager calls, after one to warm up."""
    fn()
    return per_call_ms(fn, calls, sync) * 1e3


def rel_err(out, ref) -> float:
    if isinstance(out, tuple):  # rotary_qk's q and k: the worse
        return max(rel_err(o, r) for o, r in zip(out, ref))
    out, ref = out.double(), ref.double()
    return ((out - ref).abs().max() / ref.abs().max()).item()


def main() -> None:
    import torch

    from nbx_tune.kernels.runtime import certified
    from nbx_tune.oracles import rope as rope_oracle

    dev = "cpu" if SMOKE else "cuda"
    dt = torch.float32 if SMOKE else torch.bfloat16
    sync = (lambda: None) if SMOKE else torch.cuda.synchronize
    all_cases = cases(torch, dev, dt)
    if "--no-census" not in sys.argv:
        certify(all_cases)
    rows, raw = [], {}
    for name, fused, pattern, args in all_cases:
        if name.startswith("rope_cos_sin"):  # cos and sin in fp64 of the model's fp32 angles
            ref = tuple(torch.from_numpy(t).to(dev) for t in rope_oracle.cos_sin(
                args[0].cpu().numpy(), args[1].cpu().numpy(), args[2]))
        else:
            ref = pattern(*[a.double() if isinstance(a, torch.Tensor) else a for a in args])  # fp64, the same inputs
        err_f, err_t = rel_err(fused(*args), ref), rel_err(pattern(*args), ref)
        dev_ms = side_by_side({"torch": lambda: pattern(*args), "fused": lambda: fused(*args)}, 1 if SMOKE else 200,
                              timer=(lambda fn, rep: wall_ms(fn, rep)) if SMOKE else None)
        calls = 3 if SMOKE else 2000
        wall = {"torch": eager_us(lambda: pattern(*args), sync, calls),
                "fused": eager_us(lambda: fused(*args), sync, calls)}
        raw[name] = {"device_ms": dev_ms, "eager_us": wall, "err": {"torch": err_t, "fused": err_f}}
        rows.append([name, f"{dev_ms['torch'] * 1e3:.1f}", f"{dev_ms['fused'] * 1e3:.1f}",
                     f"{dev_ms['torch'] / dev_ms['fused']:.2f}", f"{wall['torch']:.1f}", f"{wall['fused']:.1f}",
                     f"{wall['torch'] / wall['fused']:.2f}", f"{err_t:.1e}", f"{err_f:.1e}"])
    env = environment()
    misses = certified.launch_stats()["misses"]
    save("fused_ops.json", {"env": env, "dtype": str(dt), "cases": raw, "misses": misses})
    print(f"{env['date']} {env['gpu']} driver {env['driver']} Triton {env['triton']} torch {env['torch']}")
    print(table(rows, [f"case ({str(dt).removeprefix('torch.')})", "torch dev us", "fused dev us", "dev x",
                       "torch eager us", "fused eager us", "eager x", "torch err", "fused err"]))
    if misses and not SMOKE:
        print(f"seats served uncertified: {misses}")


if __name__ == "__main__":
    main()
