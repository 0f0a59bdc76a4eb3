"""The split-K GEMM and decode-attention candidates on a GPU, in one run:

(a) check: every new matmul config and every decode (SPLIT_KV) attention config, plus a
    few prefill configs at a causal GQA shape, against the fp64 oracle at odd shapes in
    bfloat16 (and float16 at one shape each), under the profile's tolerance, two launches
    bit for bit equal;
(b) skinny and mid-size GEMMs at the shapes of issue 23 (7B decode, M = 1, 8, 32, 64; a
    hidden-1536 prefill, M = 800): torch (cuBLAS), the seat's certified config (the default
    where none: marked), every new candidate the profile admits there (split-K, unsplit
    skinny tiles), a sample of earlier configs (OLD_SKINNY, OLD_LARGE), and the HBM floor
    (weight bytes over the copy bandwidth measured in this run). Weights rotate through
    several buffers (> 160 MB in all) so the 50 MB L2 does not hold them between calls, on
    every side; times are per call under CUDA-graph replay, in alternating rounds;
(c) attention: grouped-query prefill (1000 tokens, 32 query / 8 key-value heads, d 128) and
    decode (1 query, 500 to 4000 keys; batch 8 at 2048), torch's SDPA against the certified
    config, earlier configs and the decode candidates.

    python bench/speed_candidates.py [--skip-check] [--budget-s 280]
    python bench/speed_candidates.py --smoke     (a) only, tiny, on the CPU interpreter

Prints a table per part; JSON in $OUT/speed_candidates.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import environment, save, table  # noqa: E402

DECODE_GEMMS = [(m, n, k) for m in (1, 8, 32, 64)
                for n, k in ((4096, 4096), (11008, 4096), (4096, 11008), (32000, 4096))]
PREFILL_GEMMS = [(800, 1536, 1536), (800, 8960, 1536), (800, 1536, 8960), (800, 151936, 1536)]
# (B, Hq, Hkv, Lq, Lk, D, causal)
ATTN = [(1, 32, 8, 1000, 1000, 128, True)] + [(1, 32, 8, 1, lk, 128, False) for lk in (500, 1000, 2000, 4000)] + \
       [(1, 32, 32, 1, 4000, 128, False), (8, 32, 32, 1, 2048, 128, False)]
# Earlier configs timed beside the new ones (a sample, not the whole space: each costs a
# compile): skinny tiles for M <= 64, the usual large ones above. (BM, BN, BK, warps, stages, TMA)
OLD_SKINNY = ((16, 32, 64, 2, 2, 0), (32, 32, 64, 4, 2, 0), (32, 64, 64, 4, 3, 0), (64, 64, 64, 4, 4, 0),
              (64, 128, 64, 4, 3, 0), (64, 64, 128, 4, 3, 0))
OLD_LARGE = ((64, 128, 64, 4, 5, 0), (128, 64, 64, 4, 3, 0), (128, 128, 64, 8, 3, 0), (128, 128, 64, 4, 4, 0),
             (128, 256, 64, 8, 3, 0), (128, 128, 64, 8, 4, 1))
PREFILL_TRIED = ((128, 64, 8, 3), (128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 4), (64, 64, 4, 3),
                 (128, 128, 8, 2))
ROTATE_BYTES = 160 << 20
T0 = time.perf_counter()


def over(budget):
    return time.perf_counter() - T0 > budget


def err_of(got, ref) -> float:
    return float(np.abs(got.double().cpu().numpy() - ref).max() / max(np.abs(ref).max(), 1e-300))


def bits(t):
    import torch

    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


# ----------------------------------------------------------------------------- (a) check

def check(profile, device, dtypes, gemm_shapes, attn_shapes, budget) -> list:
    import torch

    from nbx_tune.kernels import attention as A, matmul as MM
    from nbx_tune.kernels.spec import Config
    from nbx_tune.oracles import attention as aor, matmul as mor

    rows = []
    splits = new_gemm_configs()
    g = torch.Generator(device="cpu").manual_seed(0)
    for dt in dtypes:
        tdt = getattr(torch, dt)
        rtol = profile.rtol(dt)
        # The first dtype at every shape, the others at one each: every compile costs seconds.
        for m, n, k in (gemm_shapes if dt == dtypes[0] else gemm_shapes[-1:]):
            a, b, x = ((torch.rand(s, generator=g) * 2 - 1).to(tdt) for s in ((m, k), (k, n), (n,)))
            ref = mor.addmm(x.double().numpy(), a.double().numpy(), b.double().numpy(), 1.5, -0.5)
            a, b, x = a.to(device), b.to(device), x.to(device)
            for cfg in splits:
                if over(budget):
                    rows.append(["matmul", dt, f"{m}x{n}x{k}", str(cfg), "-", rtol, "not run (budget)"])
                    continue
                try:
                    outs = []
                    for _ in range(2):
                        c = torch.full((m, n), float("nan"), dtype=tdt, device=device)
                        MM.launch_matmul(a, b, c, x.expand(m, n), 1.5, -0.5, cfg)
                        outs.append(c)
                    e = err_of(outs[0], ref)
                    same = torch.equal(bits(outs[0]), bits(outs[1]))
                    ok = e <= rtol and same and not torch.isnan(outs[0]).any()
                    rows.append(["matmul", dt, f"{m}x{n}x{k}", str(cfg), f"{e:.2e}", rtol,
                                 "ok" if ok else ("NONDETERMINISTIC" if not same else "WRONG")])
                except Exception as ex:
                    rows.append(["matmul", dt, f"{m}x{n}x{k}", str(cfg), "-", rtol, f"ERROR {type(ex).__name__}: {ex}"[:120]])
        decode = [c for c in A.CONFIGS if "SPLIT_KV" in c.kwargs]
        prefill = [Config.make(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st) for bm, bn, w, st in PREFILL_TRIED]
        for B, Hq, Hkv, Lq, Lk, D, causal in (attn_shapes if dt == dtypes[0] else attn_shapes[:1]):
            q, kk, v = (torch.from_numpy(np.random.default_rng(Lk + Lq).standard_normal(s)).to(tdt)
                        for s in ((B, Hq, Lq, D), (B, Hkv, Lk, D), (B, Hkv, Lk, D)))
            ref, ref_lse = aor.efficient_attention(*(t.double().numpy() for t in (q, kk, v)), causal, None, True)
            q, kk, v = q.to(device), kk.to(device), v.to(device)
            for cfg in (decode if Lq <= A.DECODE_MAX_LQ else prefill):
                shape = f"B{B} H{Hq}/{Hkv} Lq{Lq} Lk{Lk} d{D}{' causal' if causal else ''}"
                if over(budget):
                    rows.append(["attention", dt, shape, str(cfg), "-", rtol, "not run (budget)"])
                    continue
                try:
                    outs = []
                    for _ in range(2):
                        o = torch.full((B, Hq, Lq, D), float("nan"), dtype=tdt, device=device)
                        lse = torch.full((B, Hq, -(-Lq // 32) * 32), float("nan"), device=device)
                        A.launch_attention(q, kk, v, o, lse, 1 / D ** 0.5, causal, cfg)
                        outs.append((o, lse))
                    e = err_of(outs[0][0], ref)
                    le = float(np.abs(outs[0][1][:, :, :Lq].cpu().numpy() - ref_lse[:, :, :Lq]).max())
                    same = all(torch.equal(bits(x), bits(y)) for x, y in zip(outs[0], outs[1]))
                    ok = e <= rtol and le < 1e-3 and same
                    rows.append(["attention", dt, shape, str(cfg), f"{e:.2e} lse {le:.1e}", rtol,
                                 "ok" if ok else ("NONDETERMINISTIC" if not same else "WRONG")])
                except Exception as ex:
                    rows.append(["attention", dt, shape, str(cfg), "-", rtol, f"ERROR {type(ex).__name__}: {ex}"[:120]])
    return rows


# ----------------------------------------------------------------------------- (b), (c) timing

def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth (bytes read + written per second) of 1 GiB buffers."""
    import torch

    from torch_compare import graph_times

    src = torch.empty(1 << 29, dtype=torch.float16, device="cuda").uniform_()
    dst = torch.empty_like(src)
    ms = graph_times({"copy": lambda i: dst.copy_(src)}, 100, calls=4)["copy"]
    del src, dst
    return 2 * (1 << 30) / (ms * 1e-3)


def new_gemm_configs() -> list:
    """The matmul configs of issue 23: split-K, and the unsplit skinny tiles (BLOCK_M 16, BLOCK_K 128)."""
    from nbx_tune.kernels import matmul as MM

    return [c for c in MM.CONFIGS if MM.split_k(c) > 1 or (c["BLOCK_M"] == 16 and c["BLOCK_K"] == 128)]


def gemm_times(profile, bw, shapes, budget, dt="bfloat16", device="cuda") -> list:
    import torch

    from nbx_tune.kernels import certified, matmul as MM
    from nbx_tune.tuner.trace import make_row
    from torch_compare import graph_times

    tdt = getattr(torch, dt)
    out = []
    for m, n, k in shapes:
        if over(budget):
            out.append({"shape": f"{m}x{n}x{k}", "error": "not timed (budget)"})
            continue
        try:
            p = MM.SPEC.problem_from_row(make_row("aten.mm", [dt, dt], [(m, k), (k, n)]))
            cert = certified.config_for(MM.SPEC, p.dtypes, p.flags, p.dims)
            is_cert = certified.state().memo[("matmul", p.dtypes, p.flags, p.dims)][1] is None
            wbytes = k * n * tdt.itemsize
            R = max(2, min(8, -(-ROTATE_BYTES // wbytes)))
            a = torch.empty((m, k), dtype=tdt, device=device).uniform_(-1, 1)
            ws = [torch.empty((k, n), dtype=tdt, device=device).uniform_(-1, 1) for _ in range(R)]
            c = torch.empty((m, n), dtype=tdt, device=device)
            fns = {"torch": lambda i: torch.mm(a, ws[i % R]),
                   "cert": lambda i, cfg=cert: MM.launch_matmul(a, ws[i % R], c, None, 1.0, 0.0, cfg)}
            olds = {(c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"], c.num_warps, c.num_stages, c.kwargs.get("TMA", 0)): c
                    for c in MM.CONFIGS if "EXTRA_N" not in c.kwargs and MM.split_k(c) == 1}
            tried = [(cfg, True) for cfg in new_gemm_configs()] + \
                    [(olds[x], False) for x in (OLD_SKINNY if m <= 64 else OLD_LARGE) if x in olds]
            is_new = {}
            for cfg, fresh in tried:
                if cfg != cert and MM.SPEC.static_refusal(profile, cfg, p) is None:
                    fns[str(cfg)] = lambda i, cfg=cfg: MM.launch_matmul(a, ws[i % R], c, None, 1.0, 0.0, cfg)
                    is_new[str(cfg)] = fresh
            t = graph_times(fns, 20, calls=R * -(-24 // R), device=device)
            new = {s: v for s, v in t.items() if is_new.get(s)}
            old = {s: v for s, v in t.items() if s in is_new and not is_new[s]}
            best = min(new, key=new.get) if new else None
            best_old = min(old, key=old.get) if old else None
            floor = wbytes / bw * 1e3
            row = {"shape": f"{m}x{n}x{k}", "torch_ms": t["torch"], "cert_ms": t["cert"], "cert": str(cert),
                   "certified": is_cert, "floor_ms": floor, "new": new, "best_new": best,
                   "best_new_ms": new.get(best), "old": old, "best_old": best_old, "best_old_ms": old.get(best_old)}
            out.append(row)
            print(f"  {row['shape']}: torch {t['torch']:.4f} cert {t['cert']:.4f} best new "
                  f"{new.get(best, float('nan')):.4f} best old {old.get(best_old, float('nan')):.4f} "
                  f"floor {floor:.4f}", flush=True)
            del a, ws, c
        except Exception as e:
            traceback.print_exc(limit=2)
            out.append({"shape": f"{m}x{n}x{k}", "error": f"{type(e).__name__}: {str(e)[:150]}"})
        if device == "cuda":
            torch.cuda.empty_cache()
    return out


def attn_times(profile, shapes, budget, dt="bfloat16", device="cuda") -> list:
    import torch
    import torch.nn.functional as F

    from nbx_tune.kernels import attention as A, certified
    from nbx_tune.kernels.spec import Config
    from nbx_tune.tuner.trace import make_row
    from torch_compare import graph_times

    tdt = getattr(torch, dt)
    out = []
    for B, Hq, Hkv, Lq, Lk, D, causal in shapes:
        shape = f"B{B} H{Hq}/{Hkv} Lq{Lq} Lk{Lk} d{D}{' causal' if causal else ''}"
        if over(budget):
            out.append({"shape": shape, "error": "not timed (budget)"})
            continue
        try:
            params = {"attn_mask": "None", **({"is_causal": "True"} if causal else {}),
                      **({"enable_gqa": "True"} if Hkv != Hq else {})}
            p = A.SPEC.problem_from_row(make_row(A.SDPA, [dt] * 3, [(B, Hq, Lq, D), (B, Hkv, Lk, D),
                                                                    (B, Hkv, Lk, D)], params))
            cert = certified.config_for(A.SPEC, p.dtypes, p.flags, p.dims)
            is_cert = certified.state().memo[("attention", p.dtypes, p.flags, p.dims)][1] is None
            kvbytes = 2 * B * Hkv * Lk * D * tdt.itemsize
            R = max(2, min(8, -(-ROTATE_BYTES // kvbytes)))
            q = torch.randn((B, Hq, Lq, D), dtype=tdt, device=device)
            kvs = [(torch.randn((B, Hkv, Lk, D), dtype=tdt, device=device),
                    torch.randn((B, Hkv, Lk, D), dtype=tdt, device=device)) for _ in range(R)]
            o = torch.empty_like(q)
            lse = torch.empty((B, Hq, Lq), dtype=torch.float32, device=device)
            gqa = Hkv != Hq

            def ours(cfg):
                return lambda i: A.launch_attention(q, *kvs[i % R], o, lse, D ** -0.5, causal, cfg)

            fns = {"torch": lambda i: F.scaled_dot_product_attention(q, *kvs[i % R], is_causal=causal, enable_gqa=gqa),
                   "cert": ours(cert)}
            if Lq <= A.DECODE_MAX_LQ:
                tried = [c for c in A.CONFIGS if "SPLIT_KV" in c.kwargs] + [c for c in A.CONFIGS[:5]]
            else:
                tried = [Config.make(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st)
                         for bm, bn, w, st in PREFILL_TRIED]
            for cfg in tried:
                if cfg != cert and A.SPEC.static_refusal(profile, cfg, p) is None:
                    fns[str(cfg)] = ours(cfg)
            t = graph_times(fns, 20, calls=R * -(-12 // R), device=device)
            cand = {s: v for s, v in t.items() if s not in ("torch", "cert")}
            best = min(cand, key=cand.get) if cand else None
            row = {"shape": shape, "torch_ms": t["torch"], "cert_ms": t["cert"], "cert": str(cert),
                   "certified": is_cert, "candidates": cand, "best": best, "best_ms": cand.get(best)}
            out.append(row)
            print(f"  {shape}: torch {t['torch']:.4f} cert {t['cert']:.4f} best {cand.get(best, float('nan')):.4f}",
                  flush=True)
            del q, kvs, o
        except Exception as e:
            traceback.print_exc(limit=2)
            out.append({"shape": shape, "error": f"{type(e).__name__}: {str(e)[:150]}"})
        if device == "cuda":
            torch.cuda.empty_cache()
    return out


def r(a, b):
    return "-" if not a or not b else f"{a / b:.3f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--budget-s", type=float, default=280.0)
    args = ap.parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    import logging

    import torch

    from nbx_tune.profiles import current_profile, get_profile

    logging.getLogger("nbx_tune").setLevel(logging.ERROR)
    report = {"env": environment()}
    if args.smoke:
        profile, device = get_profile("interpreter"), "cpu"
        rows = check(profile, device, ("float16", "float32"), [(3, 45, 300), (17, 40, 531)],
                     [(1, 4, 2, 1, 300, 16, False), (1, 2, 1, 3, 70, 24, True)], args.budget_s)
    else:
        profile, device = current_profile(), "cuda"
        rows = [] if args.skip_check else check(
            profile, device, ("bfloat16", "float16"), [(1, 4096, 4096), (37, 1000, 2008), (5, 999, 777)],
            [(2, 32, 8, 1, 1037, 128, False), (1, 12, 2, 3, 517, 128, False), (3, 8, 8, 1, 4001, 64, False),
             (1, 8, 8, 5, 300, 80, True), (1, 32, 8, 333, 333, 128, True)], args.budget_s * 0.45)
    report["check"] = rows
    bad = [x for x in rows if x[-1] != "ok"]
    print(table(bad, ["kernel", "dtype", "shape", "config", "err", "rtol", "verdict"]))
    print(f"check: {len(rows) - len(bad)} of {len(rows)} ok")
    save("speed_candidates.json", report)

    if args.smoke:  # the timing code at toy sizes on the CPU: its numbers mean nothing
        bw, gemms, attn = 1e10, [(3, 64, 1100)], [(1, 4, 2, 1, 300, 16, False), (1, 4, 2, 40, 40, 16, True)]
        profile = get_profile("hopper")  # what the timed candidates are pruned by: the GPU's
    else:
        bw, gemms, attn = copy_bandwidth(), DECODE_GEMMS + PREFILL_GEMMS, ATTN
    report["copy_GBps"] = bw / 1e9
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s", flush=True)
    dt = "float16" if args.smoke else "bfloat16"
    report["gemm"] = gemm_times(profile, bw, gemms, args.budget_s, dt, device)
    save("speed_candidates.json", report)
    report["attention"] = attn_times(profile, attn, args.budget_s, dt, device)
    save("speed_candidates.json", report)

    env = report["env"]
    print(f"\n{env['date']} {env['gpu']} driver {env['driver']} Triton {env['triton']} torch {env['torch']}; "
          f"copy {bw / 1e9:.0f} GB/s")
    g = [[x["shape"], f"{x['torch_ms']:.4f}", f"{x['cert_ms']:.4f}", "cert" if x["certified"] else "default",
          f"{x['best_new_ms']:.4f}" if x.get("best_new_ms") else "-",
          f"{x['best_old_ms']:.4f}" if x.get("best_old_ms") else "-", r(x["torch_ms"], x["cert_ms"]),
          r(x["torch_ms"], x.get("best_new_ms")), r(x["floor_ms"], x.get("best_new_ms")),
          r(x["floor_ms"], x.get("torch_ms")), x.get("best_new") or "-"]
         if "error" not in x else [x["shape"], x["error"][:60]] + [""] * 9 for x in report["gemm"]]
    print(table(g, [f"M x N x K ({dt})", "torch ms", "cert ms", "cert?", "best new ms", "best old ms", "torch/cert",
                    "torch/new", "floor/new (>= 0.8)", "floor/torch", "best new config"]))
    a = [[x["shape"], f"{x['torch_ms']:.4f}", f"{x['cert_ms']:.4f}", "cert" if x["certified"] else "default",
          f"{x['best_ms']:.4f}" if x.get("best_ms") else "-", r(x["torch_ms"], x["cert_ms"]),
          r(x["torch_ms"], x.get("best_ms")), x.get("best") or "-"]
         if "error" not in x else [x["shape"], x["error"][:60]] + [""] * 6 for x in report["attention"]]
    print(table(a, [f"attention ({dt})", "torch ms", "cert ms", "cert?", "best tried ms", "torch/cert", "torch/best",
                    "best config"]))
    print(f"total {time.perf_counter() - T0:.0f} s; JSON {save('speed_candidates.json', report)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
