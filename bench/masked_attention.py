"""Masked attention (kernels/masked_attention/) against torch's SDPA with the same mask, and
flex attention where it compiles, side by side, at Mistral-7B and Gemma-2 shapes (bf16).

Per shape, one layer's attention as transformers calls it under a sliding window and a
left-padded batch: a bool mask (B, 1, Lq, Lk), K and V repeated to the query heads
(transformers' repeat_kv: with a mask it does not pass enable_gqa). Timed side by side:
- torch: F.scaled_dot_product_attention(q, k_rep, v_rep, attn_mask=mask), the model's call;
- served: the family's SDPA route on the same arguments (the mask recognised once, then
  computed, never read), on the config served now (certified, or the default: marked);
- best: the family's best config of its space (coarse sweep, then timed again beside torch);
- gqa: the family's public op on the unrepeated K/V (window and seq_lens, no mask), best of the
  --top fastest configs of the best side's sweep;
- read: the family reading the mask (no recognition), likewise;
- flex: torch's flex_attention with a block mask of the same pattern, compiled (if it runs);
- torch gqa: torch's SDPA on the unrepeated K/V with enable_gqa (if its masked path takes it).
Every output is checked against torch's SDPA on fp32 copies (exit 1 on a wrong one).

    python bench/masked_attention.py [--rep-ms 200] [--sweep-ms 30] [--only mistral|gemma] [--shapes TEXT]
    python bench/masked_attention.py --smoke      tiny shapes on the CPU interpreter (fp32)

Prints torch / family ratios (> 1: the family is faster); JSON in $OUT/masked_attention.json.
Gemma-2's logit softcap is not served by the family: its shapes run without it on both sides.
"""

from __future__ import annotations

import argparse
import os
import sys

# (name, B, Hq, Hkv, Lq, Lk, D, window, lengths of the padded batch (None: no padding))
MISTRAL = [
    ("mistral prefill 4096", 2, 32, 8, 4096, 4096, 128, 4096, (4096, 3000)),
    ("mistral prefill 8192", 1, 32, 8, 8192, 8192, 128, 4096, None),
    ("mistral prefill 8192 padded", 2, 32, 8, 8192, 8192, 128, 4096, (8192, 6000)),
    ("mistral decode ctx 8192", 8, 32, 8, 1, 8192, 128, 4096, (8192, 8000, 7000, 6000, 5000, 4000, 3000, 2000)),
    ("mistral decode ctx 8192 B1", 1, 32, 8, 1, 8192, 128, 4096, None),
]
GEMMA = [
    ("gemma-2-9b prefill 8192", 1, 16, 8, 8192, 8192, 256, 4096, None),
    ("gemma-2-9b prefill 4096 padded", 2, 16, 8, 4096, 4096, 256, 4096, (4096, 2500)),
    ("gemma-2-9b decode ctx 8192", 8, 16, 8, 1, 8192, 256, 4096, (8192, 7000, 6000, 5000, 4000, 3000, 2000, 1000)),
]
SMOKE = [
    ("smoke prefill", 2, 4, 2, 40, 40, 16, 9, (40, 23)),
    ("smoke decode", 2, 4, 2, 1, 70, 32, 20, (70, 31)),
]
RTOL = {"bfloat16": 2e-2, "float32": 1e-4}


def inputs(s, dtype, device, seed=0):
    """q, k, v (B, H, L, D) as a model's projections viewed (B, L, H, D) -> (B, H, L, D), the
    bool mask transformers builds for the window and left padding, the key ranges, and K/V
    repeated to the query heads."""
    import torch

    _, B, Hq, Hkv, Lq, Lk, D, window, lens = s
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(B, Lq, Hq, D, generator=g, device=device, dtype=torch.float32).to(dtype).transpose(1, 2)
    k = torch.randn(B, Lk, Hkv, D, generator=g, device=device, dtype=torch.float32).to(dtype).transpose(1, 2)
    v = torch.randn(B, Lk, Hkv, D, generator=g, device=device, dtype=torch.float32).to(dtype).transpose(1, 2)
    pos = torch.arange(Lq, device=device)[:, None] + (Lk - Lq)
    j = torch.arange(Lk, device=device)[None, :]
    keep = (j <= pos) & (j > pos - window)
    n = torch.tensor(lens if lens else [Lk] * B, device=device)
    start = Lk - n
    mask = keep[None, None] & (j[None, None] >= start[:, None, None, None])  # (B, 1, Lq, Lk)
    ranges = torch.stack([start, torch.full_like(start, Lk)], 1).to(torch.int32)
    group = Hq // Hkv
    rep = [t[:, :, None].expand(B, Hkv, group, Lk, D).reshape(B, Hq, Lk, D) for t in (k, v)]
    return q, k, v, mask, ranges, rep, n


def rel_err(got, ref) -> float:
    return float((got.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def flex_fn(q, k, v, s, n):
    """flex_attention with the same pattern, compiled; None where it does not run here."""
    try:
        import torch
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return None
    _, B, Hq, Hkv, Lq, Lk, D, window, _ = s
    off, start = Lk - Lq, (Lk - n).to(torch.int32)

    def keep(b, h, i, j):
        return (j <= i + off) & (j > i + off - window) & (j >= start[b])

    try:
        bm = create_block_mask(keep, B, None, Lq, Lk, device=q.device)
        comp = torch.compile(flex_attention)
        fn = lambda: comp(q, k, v, block_mask=bm, enable_gqa=Hq != Hkv)  # noqa: E731
        fn()
        return fn
    except Exception as e:  # its compile or its shape limits: reported, not fatal
        print(f"  flex attention: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}")
        return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--rep-ms", type=float, default=200.0)
    ap.add_argument("--sweep-ms", type=float, default=30.0)
    ap.add_argument("--only", choices=("mistral", "gemma"))
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--shapes", default="", help="only the shapes whose name holds this text")
    ap.add_argument("--top", type=int, default=4, help="configs the gqa and read sides sweep: the best side's fastest")
    args = ap.parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch
    import torch.nn.functional as F

    from nbx_tune.kernels.masked_attention import CONFIGS, SPEC
    from nbx_tune.kernels.masked_attention.kernel import BOOL_MASK, launch_masked_attention
    from nbx_tune.kernels.masked_attention.ops import serve_masked_sdpa
    from nbx_tune.kernels.masked_attention.pattern import recognise
    from nbx_tune.kernels.masked_attention.spec import seat_of
    from nbx_tune.kernels.runtime import certified
    from nbx_tune.kernels.spec import Problem
    from nbx_tune.testing.bench import report, side_by_side, wall_ms

    device = "cpu" if args.smoke else "cuda"
    dt = "float32" if args.smoke else "bfloat16"
    tdt = getattr(torch, dt)
    shapes = SMOKE if args.smoke else (MISTRAL if args.only == "mistral" else GEMMA if args.only == "gemma"
                                       else MISTRAL + GEMMA)
    shapes = [x for x in shapes if args.shapes in x[0]]
    timer = (lambda fn, rep: wall_ms(fn, rep)) if args.smoke else None
    profile = certified.state().profile
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    rows, data, wrong = [], [], 0
    for s in shapes:
        name, B, Hq, Hkv, Lq, Lk, D, window, lens = s
        q, k, v, mask, ranges, (kr, vr), n = inputs(s, tdt, device)
        ref = F.scaled_dot_product_attention(q.float(), kr.float(), vr.float(), attn_mask=mask)
        if torch.isnan(ref).any():  # rows that see no key (left padding): the family gives 0, as torch's CPU
            print(f"  {name}: torch gives NaN on {int(torch.isnan(ref).any(-1).sum())} rows that see no key here")
            ref = torch.nan_to_num(ref, nan=0.0)
        scale = D ** -0.5
        out = torch.empty((B, Lq, Hq, D), dtype=tdt, device=device).transpose(1, 2)

        def family(cfg, kk, vv, read=False):
            if read:
                return lambda: launch_masked_attention(q, kk, vv, out, scale, cfg, mask=mask, mask_kind=BOOL_MASK)
            return lambda: launch_masked_attention(q, kk, vv, out, scale, cfg, causal=True, offset=Lk - Lq,
                                                   window=window if window < Lk else 0,
                                                   ranges=ranges if lens else None)

        def problem(kv_heads, read=False):
            w = 0 if read or window >= Lk else window
            dtypes, flags, dims = seat_of(dt, "bool" if read else "none", not read, w, bool(lens) and not read,
                                          B, Hq, kv_heads, Lq, Lk, D, D)
            return Problem(SPEC.name, dtypes, flags, dims, (("Hkv", kv_heads), ("Hq", Hq)))

        def check(fn):
            got = fn()  # the served route returns its output; a launch writes `out`
            got = out if got is None else got
            sync()
            e = rel_err(got, ref)
            return e, bool(e <= RTOL[dt] and not torch.isnan(got).any())

        served = lambda: serve_masked_sdpa(q, kr, vr, mask)  # noqa: E731
        e_served, ok = check(served)
        errs = {"served": e_served}
        wrong += not ok
        fns = {"torch": lambda: F.scaled_dot_product_attention(q, kr, vr, attn_mask=mask), "served": served}
        picks, ranked = {}, []
        for label, kk, vv, kvh, read in (("best", kr, vr, Hq, False), ("gqa", k, v, Hkv, False),
                                         ("read", kr, vr, Hq, True)):
            p = problem(kvh, read)
            space = [c for c in CONFIGS if not SPEC.static_refusal(profile, c, p)]
            if Lq > 16 and not args.smoke:  # prefill: the small tiles are for small-smem devices
                space = [c for c in space if c["BLOCK_M"] >= 64] or space
            if label != "best":  # the other sides: the fastest few of the best's sweep (compiles cost minutes)
                space = [c for c in space if str(c) in ranked[:args.top]] or space[:args.top]
            if args.smoke:
                space = space[:2]
            sweep = {}
            for c in space:
                try:
                    e, ok = check(family(c, kk, vv, read))
                except Exception as ex:  # a config that does not compile here: reported
                    print(f"  {name} {label} {c}: {type(ex).__name__}: {str(ex)[:100]}")
                    continue
                if not ok:
                    print(f"  {name} {label} {c}: WRONG rel err {e:.2e}")
                    wrong += 1
                    continue
                sweep[str(c)] = (c, side_by_side({"x": family(c, kk, vv, read)}, args.sweep_ms, 1, timer)["x"], e)
            if not sweep:
                continue
            best = min(sweep.values(), key=lambda t: t[1])
            if label == "best":
                ranked = [k3 for k3, _ in sorted(sweep.items(), key=lambda kv: kv[1][1])]
            picks[label] = str(best[0])
            errs[label] = best[2]
            fns[label] = family(best[0], kk, vv, read)
        if Hkv != Hq:  # torch on the unrepeated K/V, where its masked kernels take GQA
            try:
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
                fns["torch gqa"] = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
            except RuntimeError as e:
                print(f"  torch gqa: {str(e).splitlines()[0][:120]}")
        flex = None if args.no_flex or args.smoke else flex_fn(q, k, v, s, n)
        if flex is not None:
            fo = flex()
            sync()
            errs["flex"] = rel_err(fo, ref)
            fns["flex"] = flex
        t = side_by_side(fns, args.rep_ms, 4, timer)
        found = recognise(mask, Lq, Lk)  # the seat the served route launches on
        served_cfg = "mask read" if found is None else certified.config_for(SPEC, *seat_of(
            dt, "none", found.causal, found.window, found.ranges is not None, B, Hq, Hq, Lq, Lk, D, D))
        ratio = {k2: t["torch"] / t[k2] for k2 in t if k2 != "torch"}
        rows.append([name, f"{t['torch']:.3f}"] + [f"{t[c]:.3f} ({ratio[c]:.2f}x)" if c in t else "-"
                                                  for c in ("served", "best", "gqa", "read", "flex", "torch gqa")])
        data.append({"shape": s, "ms": t, "torch_over": ratio, "picks": picks, "served_config": str(served_cfg),
                     "errors": errs})
        print(f"{name}: torch {t['torch']:.3f} ms; " + ", ".join(f"{c} {ratio[c]:.2f}x" for c in ratio)
              + f"; best {picks.get('best')}; served {served_cfg}", flush=True)
    report("masked_attention.json", ["shape", "torch ms", "served ms (torch/it)", "best ms", "gqa ms", "read ms",
                                     "flex ms", "torch gqa ms"], rows, data)
    if wrong:
        print(f"{wrong} wrong result(s)")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
