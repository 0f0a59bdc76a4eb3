"""Skinny and mid-size GEMMs and attention against torch, best of the whole config space,
in one run:

(a) check: every config added in round 3 of issue 23 (NEW_GEMM; the earlier ones passed in
    the earlier device calls), and every TMA config on a column-major B (W.t(): the B_KMAJOR
    descriptors), against the fp64 oracle at odd shapes in bfloat16 (float16 at one shape),
    under the profile's tolerance, two launches bit for bit equal; every prefill attention
    config of the space at causal grouped-query shapes;
(b) GEMMs at the shapes of issue 23 (7B decode, M = 1, 8, 32, 64; a hidden-1536 prefill,
    M = 800; two with B column-major): torch (cuBLAS), the seat's certified config (the
    declared default where none: marked), and EVERY config of matmul's space the profile
    does not refuse there (what a census would choose from), the best unsplit and the best
    split-K reported apart, and the HBM floor (weight bytes over the copy bandwidth measured
    in this run). A coarse sweep of the whole space, then torch, the default and the two
    best timed again side by side. Weights rotate through several buffers (> 160 MB in all)
    so the 50 MB L2 does not hold them between calls, on every side; times are per call
    under CUDA-graph replay, in alternating rounds;
(c) attention: grouped-query prefill (1000 tokens, 32 query / 8 key-value heads, d 128)
    against every prefill config of the space, and decode (1 query, 500 to 4000 keys; batch
    8 at 2048) against the decode configs; torch's SDPA beside them.

Every kernel the run launches is compiled first by a pool of processes (the disk cache of
Triton then serves the timing process), and the checks run in that pool.

    python bench/speed_candidates.py [--skip-check] [--budget-s 270] [--workers 12]
    python bench/speed_candidates.py --smoke     tiny, on the CPU interpreter

Prints a table per part; JSON in $OUT/speed_candidates.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from contextlib import contextmanager

import numpy as np

from nbx_tune.testing.bench import environment, save, table  # noqa: E402

DECODE_GEMMS = [(m, n, k, False) for m in (1, 8, 32, 64)
                for n, k in ((4096, 4096), (11008, 4096), (4096, 11008), (32000, 4096))]
PREFILL_GEMMS = [(800, 1536, 1536, False), (800, 8960, 1536, False), (800, 1536, 8960, False),
                 (800, 151936, 1536, False)]
# B column-major, as a model passes an nn.Linear weight W (N, K): W.t().
TRANSPOSED_GEMMS = [(8, 4096, 4096, True), (64, 4096, 4096, True), (800, 1536, 1536, True)]
# (B, Hq, Hkv, Lq, Lk, D, causal)
ATTN = [(1, 32, 8, 1000, 1000, 128, True)] + [(1, 32, 8, 1, lk, 128, False) for lk in (500, 1000, 2000, 4000)] + \
       [(1, 32, 32, 1, 4000, 128, False), (8, 32, 32, 1, 2048, 128, False)]
# The matmul configs of round 3: (BM, BN, BK, warps, stages, TMA, SPLIT_K, EXTRA_N).
NEW_GEMM = ((64, 128, 64, 4, 4, 1, 1, 64), (64, 128, 64, 4, 5, 1, 1, 64), (64, 128, 64, 4, 4, 0, 1, 64),
            (64, 32, 128, 4, 4, 1, 1, 0))
ROTATE_BYTES = 160 << 20
T0 = time.perf_counter()


def over(budget):
    return time.perf_counter() - T0 > budget


def err_of(got, ref) -> float:
    return float(np.abs(got.double().cpu().numpy() - ref).max() / max(np.abs(ref).max(), 1e-300))


def bits(t):
    import torch

    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def gemm_tuple(c) -> tuple:
    from nbx_tune.kernels import matmul as MM

    return (c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"], c.num_warps, c.num_stages, c.kwargs.get("TMA", 0),
            MM.split_k(c), MM.extra_columns(c))


def new_gemm_configs() -> list:
    from nbx_tune.kernels import matmul as MM

    return [c for c in MM.CONFIGS if gemm_tuple(c) in NEW_GEMM]


def config_named(kernel: str, key: str):
    from nbx_tune.kernels import attention as A, matmul as MM

    return next(c for c in (MM.CONFIGS if kernel == "matmul" else A.CONFIGS) if str(c) == key)


def gemm_operands(m, n, k, transposed, tdt, device, copies=1, seed=0):
    """a (m, k) and `copies` weights (k, n): row-major, or column-major views W.t() of (n, k)."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    a = torch.empty((m, k), dtype=tdt, device=device).uniform_(-1, 1, generator=g)
    shape = (n, k) if transposed else (k, n)
    ws = [torch.empty(shape, dtype=tdt, device=device).uniform_(-1, 1, generator=g) for _ in range(copies)]
    return a, [w.t() if transposed else w for w in ws]


def gemm_problem(m, n, k, dt):
    from nbx_tune.kernels import matmul as MM
    from nbx_tune.kernels.trace import make_row

    return MM.SPEC.problem_from_row(make_row("aten.mm", [dt, dt], [(m, k), (k, n)]))


def attn_problem(shape, dt):
    from nbx_tune.kernels import attention as A
    from nbx_tune.kernels.trace import make_row

    B, Hq, Hkv, Lq, Lk, D, causal = shape
    params = {"attn_mask": "None", **({"is_causal": "True"} if causal else {}),
              **({"enable_gqa": "True"} if Hkv != Hq else {})}
    return A.SPEC.problem_from_row(make_row(A.SDPA, [dt] * 3, [(B, Hq, Lq, D), (B, Hkv, Lk, D), (B, Hkv, Lk, D)],
                                            params))


def shape_name(shape) -> str:
    if len(shape) == 4:
        m, n, k, t = shape
        return f"{m}x{n}x{k}{' B^T' if t else ''}"
    B, Hq, Hkv, Lq, Lk, D, causal = shape
    return f"B{B} H{Hq}/{Hkv} Lq{Lq} Lk{Lk} d{D}{' causal' if causal else ''}"


# ----------------------------------------------------------------------------- pool jobs

def _check_mm(key, cases, device, rtol_of):
    import torch

    from nbx_tune.kernels import matmul as MM
    from nbx_tune.oracles import matmul as mor

    cfg, rows = config_named("matmul", key), []
    for dt, m, n, k, transposed in cases:
        tdt, rtol = getattr(torch, dt), rtol_of[dt]
        name = shape_name((m, n, k, transposed))
        try:
            a, (b,) = gemm_operands(m, n, k, transposed, torch.float32, "cpu", seed=m * n + k)
            a, b = a.to(tdt), b.to(tdt)
            x = (torch.rand(n, generator=torch.Generator().manual_seed(k)) * 2 - 1).to(tdt)
            ref = mor.addmm(x.double().numpy(), a.double().numpy(), b.double().numpy(), 1.5, -0.5)
            a, b, x = a.to(device), b.to(device), x.to(device)
            outs = []
            for _ in range(2):
                c = torch.full((m, n), float("nan"), dtype=tdt, device=device)
                MM.launch_matmul(a, b, c, x.expand(m, n), 1.5, -0.5, cfg)
                outs.append(c)
            e = err_of(outs[0], ref)
            same = torch.equal(bits(outs[0]), bits(outs[1]))
            ok = e <= rtol and same and not torch.isnan(outs[0]).any()
            rows.append(["matmul", dt, name, key, f"{e:.2e}", rtol,
                         "ok" if ok else ("NONDETERMINISTIC" if not same else "WRONG")])
        except Exception as ex:
            rows.append(["matmul", dt, name, key, "-", rtol, f"ERROR {type(ex).__name__}: {ex}"[:120]])
    return rows


def _check_attn(key, cases, device, rtol_of):
    import torch

    from nbx_tune.kernels import attention as A
    from nbx_tune.oracles import attention as aor

    cfg, rows = config_named("attention", key), []
    for dt, shape in cases:
        B, Hq, Hkv, Lq, Lk, D, causal = shape
        tdt, rtol = getattr(torch, dt), rtol_of[dt]
        try:
            rng = np.random.default_rng(Lk + Lq)
            q, kk, v = (torch.from_numpy(rng.standard_normal(s)).to(tdt)
                        for s in ((B, Hq, Lq, D), (B, Hkv, Lk, D), (B, Hkv, Lk, D)))
            ref, ref_lse = aor.efficient_attention(*(t.double().numpy() for t in (q, kk, v)), causal, None, True)
            q, kk, v = q.to(device), kk.to(device), v.to(device)
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
            rows.append(["attention", dt, shape_name(shape), key, f"{e:.2e} lse {le:.1e}", rtol,
                         "ok" if ok else ("NONDETERMINISTIC" if not same else "WRONG")])
        except Exception as ex:
            rows.append(["attention", dt, shape_name(shape), key, "-", rtol, f"ERROR {type(ex).__name__}: {ex}"[:120]])
    return rows


def _warm(kernel, key, shapes, dt, device):
    """One launch of config `key` at each shape, as the timing will launch it: its compile
    lands in Triton's disk cache. Returns the errors."""
    import torch

    from nbx_tune.kernels import attention as A, matmul as MM

    cfg, tdt, errs = config_named(kernel, key), getattr(torch, dt), []
    for shape in shapes:
        try:
            if kernel == "matmul":
                m, n, k, transposed = shape
                a, (b,) = gemm_operands(m, n, k, transposed, tdt, device)
                MM.launch_matmul(a, b, torch.empty((m, n), dtype=tdt, device=device), None, 1.0, 0.0, cfg)
            else:
                B, Hq, Hkv, Lq, Lk, D, causal = shape
                q = torch.randn((B, Hq, Lq, D), dtype=tdt, device=device)
                kv = [torch.randn((B, Hkv, Lk, D), dtype=tdt, device=device) for _ in range(2)]
                A.launch_attention(q, *kv, torch.empty_like(q), torch.empty((B, Hq, Lq), device=device),
                                   D ** -0.5, causal, cfg)
            if device == "cuda":
                torch.cuda.synchronize()
        except Exception as ex:
            errs.append((kernel, shape_name(shape), key, f"{type(ex).__name__}: {str(ex)[:100]}"))
    return errs


def _job(job):
    import logging

    logging.getLogger("nbx_tune").setLevel(logging.ERROR)
    kind, *rest = job
    return {"check_mm": _check_mm, "check_attn": _check_attn, "warm": _warm}[kind](*rest)


def run_jobs(jobs, device, workers):
    """Each job's result, in order: in a pool of spawned processes on a GPU (compiles and
    checks in parallel), in this process on the CPU."""
    if device == "cpu" or workers <= 1:
        return [_job(j) for j in jobs]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as ex:
        return list(ex.map(_job, jobs))


def check_jobs(profile, device, dtypes, gemm_cases, tma_cases, attn_cases) -> list:
    """Pool jobs of part (a), one per config: its shapes run in one process (one compile)."""
    from nbx_tune.kernels import attention as A, matmul as MM

    rtol = {dt: profile.rtol(dt) for dt in dtypes}
    jobs = []
    # The first dtype at every shape, the others at the last shape: every compile costs seconds.
    cases = [(dtypes[0], *s) for s in gemm_cases] + [(dt, *gemm_cases[-1]) for dt in dtypes[1:]]
    new = {str(c) for c in new_gemm_configs()}
    for c in MM.CONFIGS:
        todo = (cases if str(c) in new else []) + ([(dtypes[0], *s) for s in tma_cases] if MM.uses_tma(c) else [])
        if todo:  # refusals aside: a config must be right at any shape it is launched at
            jobs.append(("check_mm", str(c), todo, device, rtol))
    for c in A.CONFIGS:
        if "SPLIT_KV" not in c.kwargs:
            todo = [(dtypes[0], s) for s in attn_cases
                    if A.SPEC.static_refusal(profile, c, attn_problem(s, dtypes[0])) is None]
            if todo:
                jobs.append(("check_attn", str(c), todo, device, rtol))
    return jobs


def gemm_space(profile, p, smoke=False) -> list:
    from nbx_tune.kernels import matmul as MM

    space = [c for c in MM.CONFIGS if MM.SPEC.static_refusal(profile, c, p) is None]
    if smoke:  # the interpreter: a few of each kind
        space = [c for c in space if gemm_tuple(c) in NEW_GEMM] + space[:3]
    return space


def attn_space(profile, p, decode) -> list:
    from nbx_tune.kernels import attention as A

    cands = [c for c in A.CONFIGS if ("SPLIT_KV" in c.kwargs) == decode] + (list(A.CONFIGS[:5]) if decode else [])
    return [c for c in cands if A.SPEC.static_refusal(profile, c, p) is None]


def warm_jobs(profile, gemms, attn, dt, device, smoke) -> list:
    by_cfg = {}
    for s in gemms:
        for c in gemm_space(profile, gemm_problem(*s[:3], dt), smoke):
            by_cfg.setdefault(("matmul", str(c)), []).append(s)
    for s in attn:
        for c in attn_space(profile, attn_problem(s, dt), s[3] <= 16):
            by_cfg.setdefault(("attention", str(c)), []).append(s)
    return [("warm", kernel, key, shapes, dt, device) for (kernel, key), shapes in by_cfg.items()]


# ----------------------------------------------------------------------------- (b), (c) timing

def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth (bytes read + written per second) of 1 GiB buffers."""
    import torch

    from nbx_tune.bench.torch_compare import graph_times

    src = torch.empty(1 << 29, dtype=torch.float16, device="cuda").uniform_()
    dst = torch.empty_like(src)
    ms = graph_times({"copy": lambda i: dst.copy_(src)}, 100, calls=4)["copy"]
    del src, dst
    return 2 * (1 << 30) / (ms * 1e-3)


def sweep_times(fns, calls, device, failed):
    """`torch_compare.graph_times` at short rounds, except that a fn whose capture raises is
    left out (named in `failed`) instead of costing the whole shape."""
    from nbx_tune.testing.bench import side_by_side
    from nbx_tune.bench.torch_compare import _cuda_timer, capture, graph_times

    if device == "cpu":
        return graph_times(fns, 2, calls=calls, device=device)
    graphs = {}
    for s, f in fns.items():
        try:
            graphs[s] = capture(f, calls)
        except Exception as e:
            failed[s] = f"{type(e).__name__}: {str(e)[:100]}"
    t = side_by_side({s: g.replay for s, g in graphs.items()}, 2, rounds=4, timer=_cuda_timer)
    return {s: v / calls for s, v in t.items()}


def sweep_then_confirm(fns, base, groups, calls_sweep, calls_final, device, failed=None):
    """Every fn timed coarsely (graph replay, short rounds), then `base` (torch, default) and
    the best of each group timed again side by side, longer. Returns (sweep, final, best per group)."""
    from nbx_tune.bench.torch_compare import graph_times

    sweep = sweep_times(fns, calls_sweep, device, {} if failed is None else failed)
    groups = {g: [s for s in names if s in sweep] for g, names in groups.items()}
    best = {g: min(names, key=sweep.get) if names else None for g, names in groups.items()}
    final = graph_times({s: fns[s] for s in [*base, *{b for b in best.values() if b}]}, 20, calls=calls_final,
                        device=device)
    return sweep, final, best


@contextmanager
def shape_errors(out: list, name: str, device: str):
    """One shape's timing: an error becomes the shape's row instead of ending the run, and
    the next shape starts with the CUDA cache emptied."""
    try:
        yield
    except Exception as e:
        traceback.print_exc(limit=2)
        out.append({"shape": name, "error": f"{type(e).__name__}: {str(e)[:150]}"})
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()


def gemm_times(profile, bw, shapes, budget, dt="bfloat16", device="cuda", smoke=False, failed=frozenset()) -> list:
    import torch

    from nbx_tune.kernels.runtime import certified
    from nbx_tune.kernels import matmul as MM

    tdt = getattr(torch, dt)
    out = []
    for m, n, k, transposed in shapes:
        name = shape_name((m, n, k, transposed))
        if over(budget):
            out.append({"shape": name, "error": "not timed (budget)"})
            continue
        with shape_errors(out, name, device):
            p = gemm_problem(m, n, k, dt)
            cert = certified.config_for(MM.SPEC, p.dtypes, p.flags, p.dims)
            is_cert = certified.state().memo[("matmul", p.dtypes, p.flags, p.dims)][1] is None
            wbytes = k * n * tdt.itemsize
            R = max(2, min(8, -(-ROTATE_BYTES // wbytes)))
            a, ws = gemm_operands(m, n, k, transposed, tdt, device, copies=R)
            c = torch.empty((m, n), dtype=tdt, device=device)

            def ours(cfg):
                return lambda i: MM.launch_matmul(a, ws[i % R], c, None, 1.0, 0.0, cfg)

            fns = {"torch": lambda i: torch.mm(a, ws[i % R]), "default" if not is_cert else "cert": ours(cert)}
            groups = {"unsplit": [], "split": []}
            for cfg in gemm_space(profile, p, smoke):
                if ("matmul", name, str(cfg)) in failed:
                    continue
                fns[str(cfg)] = ours(cfg)
                groups["split" if MM.split_k(cfg) > 1 else "unsplit"].append(str(cfg))
            failed_here = {}
            sweep, final, best = sweep_then_confirm(fns, list(fns)[:2], groups, R * -(-8 // R), R * -(-24 // R),
                                                    device, failed_here)
            base = list(fns)[1]
            floor = wbytes / bw * 1e3
            row = {"shape": name, "torch_ms": final["torch"], "cert_ms": final[base], "cert": str(cert),
                   "certified": is_cert, "floor_ms": floor, "sweep": sweep, "space": len(fns) - 2,
                   "capture_failed": failed_here,
                   **{f"best_{g}": best[g] for g in groups},
                   **{f"best_{g}_ms": final.get(best[g]) for g in groups}}
            out.append(row)
            print(f"  {name}: torch {final['torch']:.4f} {base} {final[base]:.4f} best unsplit "
                  f"{row['best_unsplit_ms'] or float('nan'):.4f} best split {row['best_split_ms'] or float('nan'):.4f} "
                  f"floor {floor:.4f} ({len(fns) - 2} configs, {len(failed_here)} failed to capture)", flush=True)
            del a, ws, c
    return out


def attn_times(profile, shapes, budget, dt="bfloat16", device="cuda", failed=frozenset()) -> list:
    import torch
    import torch.nn.functional as F

    from nbx_tune.kernels import attention as A
    from nbx_tune.kernels.runtime import certified

    tdt = getattr(torch, dt)
    out = []
    for shape in shapes:
        B, Hq, Hkv, Lq, Lk, D, causal = shape
        name = shape_name(shape)
        if over(budget):
            out.append({"shape": name, "error": "not timed (budget)"})
            continue
        with shape_errors(out, name, device):
            p = attn_problem(shape, dt)
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
                   "cert" if is_cert else "default": ours(cert)}
            space = [str(c) for c in attn_space(profile, p, Lq <= A.DECODE_MAX_LQ)
                     if ("attention", name, str(c)) not in failed]
            for cfg in space:
                fns[cfg] = ours(config_named("attention", cfg))
            failed_here = {}
            sweep, final, best = sweep_then_confirm(fns, list(fns)[:2], {"space": space}, R * -(-4 // R),
                                                    R * -(-12 // R), device, failed_here)
            base = list(fns)[1]
            row = {"shape": name, "torch_ms": final["torch"], "cert_ms": final[base], "cert": str(cert),
                   "certified": is_cert, "sweep": sweep, "best": best["space"], "best_ms": final.get(best["space"]),
                   "capture_failed": failed_here}
            out.append(row)
            print(f"  {name}: torch {final['torch']:.4f} {base} {final[base]:.4f} best "
                  f"{row['best_ms'] or float('nan'):.4f} ({len(space)} configs, {len(failed_here)} failed to capture)",
                  flush=True)
            del q, kvs, o
    return out


def r(a, b):
    return "-" if not a or not b else f"{a / b:.3f}"


def ms(x):
    return f"{x:.4f}" if x else "-"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--budget-s", type=float, default=270.0)
    ap.add_argument("--workers", type=int, default=min(12, max(1, (os.cpu_count() or 2) - 2)))
    args = ap.parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    import logging

    from nbx_tune.profiles import current_profile, get_profile

    logging.getLogger("nbx_tune").setLevel(logging.ERROR)
    report = {"env": environment()}
    if args.smoke:
        profile, device, dtypes = get_profile("interpreter"), "cpu", ("float16", "float32")
        gemm_cases, tma_cases = [(3, 45, 300, False), (17, 40, 531, False)], [(5, 48, 64, True)]
        attn_cases = [(1, 2, 1, 3, 70, 24, True)]
        tprofile = get_profile("hopper")  # what the timed candidates are pruned by: the GPU's
        gemms, attn, dt = [(3, 64, 1100, False), (3, 64, 1024, True)], \
            [(1, 4, 2, 1, 300, 16, False), (1, 4, 2, 40, 40, 16, True)], "float16"
    else:
        profile, device, dtypes = current_profile(), "cuda", ("bfloat16", "float16")
        gemm_cases = [(1, 4096, 4096, False), (64, 4096, 4096, False), (37, 1000, 2008, False), (5, 999, 777, False)]
        tma_cases = [(37, 1008, 2000, True)]
        attn_cases = [(1, 32, 8, 333, 333, 128, True), (1, 8, 8, 45, 300, 80, True)]
        tprofile = profile
        gemms = PREFILL_GEMMS + [g for g in DECODE_GEMMS if g[0] == 64] + TRANSPOSED_GEMMS + \
            [g for g in DECODE_GEMMS if g[0] < 64]
        attn, dt = ATTN, "bfloat16"

    jobs = [] if args.skip_check else check_jobs(profile, device, dtypes, gemm_cases, tma_cases, attn_cases)
    warm = warm_jobs(tprofile, gemms, attn, dt, device, args.smoke) if device == "cuda" else []
    print(f"{len(jobs)} check jobs, {len(warm)} configs to compile, {args.workers} processes", flush=True)
    results = run_jobs(jobs + warm, device, args.workers)
    rows = [x for res in results[:len(jobs)] for x in res]
    warm_errors = [x for res in results[len(jobs):] for x in res]
    report["check"], report["warm_errors"] = rows, warm_errors
    bad = [x for x in rows if x[-1] != "ok"]
    print(table(bad, ["kernel", "dtype", "shape", "config", "err", "rtol", "verdict"]))
    print(f"check: {len(rows) - len(bad)} of {len(rows)} ok; compiled in {time.perf_counter() - T0:.0f} s"
          f"{'; ' + str(len(warm_errors)) + ' configs failed to launch, first: ' + str(warm_errors[0]) if warm_errors else ''}",
          flush=True)
    save("speed_candidates.json", report)

    bw = 1e10 if args.smoke else copy_bandwidth()  # smoke: the timing code at toy sizes, numbers mean nothing
    report["copy_GBps"] = bw / 1e9
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s", flush=True)
    # Attention first, then the GEMMs furthest from torch in the first device call: what the
    # budget cuts off is the decode rows already at torch's level.
    failed = {x[:3] for x in warm_errors}  # left out of the timing: a capture that raises loses its whole shape
    report["attention"] = attn_times(tprofile, attn, args.budget_s, dt, device, failed)
    save("speed_candidates.json", report)
    report["gemm"] = gemm_times(tprofile, bw, gemms, args.budget_s, dt, device, args.smoke, failed)
    save("speed_candidates.json", report)

    env = report["env"]
    print(f"\n{env['date']} {env['gpu']} driver {env['driver']} Triton {env['triton']} torch {env['torch']}; "
          f"copy {bw / 1e9:.0f} GB/s; ratios torch / ours (below 1: slower than torch)")
    g = [[x["shape"], ms(x["torch_ms"]), ms(x["cert_ms"]), "cert" if x["certified"] else "default",
          ms(x.get("best_unsplit_ms")), ms(x.get("best_split_ms")), r(x["torch_ms"], x["cert_ms"]),
          r(x["torch_ms"], x.get("best_unsplit_ms")), r(x["torch_ms"], x.get("best_split_ms")),
          r(x["floor_ms"], min(v for v in (x.get("best_unsplit_ms"), x.get("best_split_ms"), 1e9) if v)),
          x.get("best_unsplit") or "-", x.get("best_split") or "-"]
         if "error" not in x else [x["shape"], x["error"][:60]] + [""] * 10 for x in report["gemm"]]
    print(table(g, [f"M x N x K ({dt})", "torch ms", "cert ms", "cert?", "unsplit ms", "split ms", "t/cert",
                    "t/unsplit", "t/split", "floor/best", "best unsplit config", "best split config"]))
    a = [[x["shape"], ms(x["torch_ms"]), ms(x["cert_ms"]), "cert" if x["certified"] else "default",
          ms(x.get("best_ms")), r(x["torch_ms"], x["cert_ms"]), r(x["torch_ms"], x.get("best_ms")),
          x.get("best") or "-"]
         if "error" not in x else [x["shape"], x["error"][:60]] + [""] * 6 for x in report["attention"]]
    print(table(a, [f"attention ({dt})", "torch ms", "cert ms", "cert?", "best of space ms", "t/cert", "t/best",
                    "best config"]))
    print(f"total {time.perf_counter() - T0:.0f} s; JSON {save('speed_candidates.json', report)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
