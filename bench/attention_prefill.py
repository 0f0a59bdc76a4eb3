"""Attention prefill against torch's SDPA (flash backend) under CUDA graphs: every prefill
config of the space at the shapes of issue 23, in one run.

(a) check, in a pool of processes (which also compiles every kernel the timing launches into
    Triton's disk cache): every prefill config the profile does not refuse, at every shape
    (the lever configs at odd shapes too), on contiguous (B, H, L, D) inputs and on a
    model's layout ((B, L, H, D) projections viewed as (B, H, L, D)), against torch's SDPA
    on fp32 copies of the inputs, within the profile's bfloat16 tolerance; torch's own
    bfloat16 error printed beside it;
(b) time, per shape: torch, the config served now (certified, or the declared default:
    marked) and every config of the space, a coarse sweep under CUDA-graph replay, then
    torch, the served config, the best of the space, the best without the Hopper levers
    (TMA, WS, FMA, LPT, PAIR) and the best with each lever timed again side by side, longer.
    K and V rotate through several buffers on both sides.

Shapes timed (all causal, bfloat16): Llama-3-8B prefill 1x32/8x1000x128 and 1x32/8x1024x128,
Llama-2-7B 1x32x512x128, GPT-2 1x12x1024x64. Checked besides: odd shapes (Lq != Lk, lengths
off every block, D = 80, GQA 4:1 and 1:1, causal and not).

    python bench/attention_prefill.py [--budget-s 180] [--check-s 120] [--workers 12]
    python bench/attention_prefill.py --smoke     tiny, on the CPU interpreter

Prints torch / best and the best config per shape; JSON in $OUT/attention_prefill.json.
Exit status 1 when a config gives a wrong result.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

from nbx_tune.testing.bench import environment, save, table  # noqa: E402

# (B, Hq, Hkv, Lq, Lk, D, causal)
SHAPES = [(1, 32, 8, 1000, 1000, 128, True), (1, 32, 8, 1024, 1024, 128, True), (1, 32, 32, 512, 512, 128, True),
          (1, 12, 12, 1024, 1024, 64, True)]
ODD = [(2, 8, 2, 333, 517, 80, True), (1, 6, 6, 45, 300, 64, False)]
SMOKE_SHAPES = [(1, 4, 2, 40, 40, 16, True), (1, 2, 2, 33, 33, 32, True)]
SMOKE_ODD = [(1, 4, 1, 21, 45, 24, True)]
LEVERS = ("TMA", "WS", "FMA", "LPT", "PAIR")
ROTATE_BYTES = 64 << 20
T0 = time.perf_counter()


def shape_name(s) -> str:
    B, Hq, Hkv, Lq, Lk, D, causal = s
    L = f"L{Lq}" if Lq == Lk else f"Lq{Lq} Lk{Lk}"
    return f"B{B} H{Hq}/{Hkv} {L} d{D}{' causal' if causal else ''}"


def problem(s, dt):
    from nbx_tune.kernels import attention as A
    from nbx_tune.kernels.trace import make_row

    B, Hq, Hkv, Lq, Lk, D, causal = s
    params = {"attn_mask": "None", **({"is_causal": "True"} if causal else {}),
              **({"enable_gqa": "True"} if Hkv != Hq else {})}
    return A.SPEC.problem_from_row(make_row(A.SDPA, [dt] * 3, [(B, Hq, Lq, D), (B, Hkv, Lk, D), (B, Hkv, Lk, D)],
                                            params))


def space(profile, p) -> list:
    """The prefill configs of the space the profile does not refuse at problem p."""
    from nbx_tune.kernels import attention as A

    return [c for c in A.CONFIGS if "SPLIT_KV" not in c.kwargs and A.SPEC.static_refusal(profile, c, p) is None]


def levers(c) -> tuple:
    return tuple(n for n in LEVERS if c.kwargs.get(n))


def config_named(key):
    from nbx_tune.kernels import attention as A

    return next(c for c in A.CONFIGS if str(c) == key)


def inputs(s, tdt, device, layout, seed):
    """q, k, v of shape s; layout "bhld" contiguous, "blhd" a model's projections transposed."""
    import torch

    B, Hq, Hkv, Lq, Lk, D, _ = s
    g = torch.Generator(device=device).manual_seed(seed)
    out = []
    for h, L in ((Hq, Lq), (Hkv, Lk), (Hkv, Lk)):
        shape = (B, h, L, D) if layout == "bhld" else (B, L, h, D)
        t = torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(tdt)
        out.append(t if layout == "bhld" else t.transpose(1, 2))
    return out


def rel_err(got, ref) -> float:
    return float((got.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


# ----------------------------------------------------------------------------- (a) pool jobs

def _check(key, shapes, dt, device, rtol):
    """Config `key` at each shape and layout against torch on fp32 copies; every launch also
    compiles what the timing launches. Rows: [shape, layout, config, levers, err, torch err, verdict]."""
    import torch
    import torch.nn.functional as F

    from nbx_tune.kernels import attention as A

    cfg, tdt, rows = config_named(key), getattr(torch, dt), []
    for s in shapes:
        B, Hq, Hkv, L, Lk, D, causal = s
        for layout in ("bhld", "blhd"):
            try:
                q, k, v = inputs(s, tdt, device, layout, seed=L + Lk + D)
                ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal,
                                                     enable_gqa=Hkv != Hq)
                theirs = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=Hkv != Hq)
                o = torch.full((B, Hq, L, D), float("nan"), dtype=tdt, device=device)
                lse = torch.empty((B, Hq, L), dtype=torch.float32, device=device)
                A.launch_attention(q, k, v, o, lse, D ** -0.5, causal, cfg)
                e, te = rel_err(o, ref), rel_err(theirs, ref)
                ok = e <= rtol and not torch.isnan(o).any()
                rows.append([shape_name(s), layout, key, "+".join(levers(cfg)) or "-", f"{e:.2e}", f"{te:.2e}",
                             "ok" if ok else "WRONG"])
            except Exception as ex:
                rows.append([shape_name(s), layout, key, "+".join(levers(cfg)) or "-", "-", "-",
                             f"ERROR {type(ex).__name__}: {str(ex)[:100]}"])
        if device == "cuda":
            torch.cuda.synchronize()
    return rows


def _job(job):
    import logging

    logging.getLogger("nbx_tune").setLevel(logging.ERROR)
    return _check(*job)


def run_jobs(jobs, device, workers, deadline_s):
    """Each job's rows, in order: in a pool of spawned processes on a GPU, in this process on
    the CPU. A job not done by deadline_s after the start (a compile that hangs, or a worker
    that crashed: multiprocessing.Pool replaces it and the job's result never comes) gets an
    ERROR row, so one config cannot cost the others."""
    if device == "cpu" or workers <= 1:
        return [_job(j) for j in jobs]
    import multiprocessing

    pool = multiprocessing.get_context("spawn").Pool(workers)
    try:
        pending = [pool.apply_async(_job, (j,)) for j in jobs]
        out = []
        for j, r in zip(jobs, pending):
            try:
                out.append(r.get(timeout=max(0.1, deadline_s - (time.perf_counter() - T0))))
            except Exception as e:
                why = "not done in time (hung or crashed)" if isinstance(e, multiprocessing.TimeoutError) \
                    else f"{type(e).__name__}: {e}"[:100]
                out.append([[shape_name(s), "-", j[0], "+".join(levers(config_named(j[0]))) or "-", "-", "-",
                             f"ERROR {why}"] for s in j[1]])
        return out
    finally:
        pool.terminate()  # this run's own workers


# ----------------------------------------------------------------------------- (b) timing

def time_shape(profile, s, dt, device, broken, sweep_calls, final_calls):
    import torch
    import torch.nn.functional as F

    from nbx_tune.kernels import attention as A
    from nbx_tune.kernels.runtime import certified
    from nbx_tune.bench.speed_candidates import sweep_then_confirm

    B, Hq, Hkv, L, _, D, causal = s  # timed shapes are square (self-attention prefill)
    tdt = getattr(torch, dt)
    p = problem(s, dt)
    served = certified.config_for(A.SPEC, p.dtypes, p.flags, p.dims)
    memo = certified.state().memo.get(("attention", p.dtypes, p.flags, p.dims))
    is_cert = bool(memo) and memo[1] is None
    R = 1 if device == "cpu" else max(2, min(8, -(-ROTATE_BYTES // (2 * B * Hkv * L * D * tdt.itemsize))))
    q = torch.randn((B, Hq, L, D), dtype=tdt, device=device)
    kvs = [(torch.randn((B, Hkv, L, D), dtype=tdt, device=device),
            torch.randn((B, Hkv, L, D), dtype=tdt, device=device)) for _ in range(R)]
    o = torch.empty_like(q)
    lse = torch.empty((B, Hq, L), dtype=torch.float32, device=device)

    def ours(cfg):
        return lambda i: A.launch_attention(q, *kvs[i % R], o, lse, D ** -0.5, causal, cfg)

    served_name = "cert" if is_cert else "default"
    fns = {"torch": lambda i: F.scaled_dot_product_attention(q, *kvs[i % R], is_causal=causal, enable_gqa=Hkv != Hq),
           served_name: ours(served)}
    cands = [c for c in space(profile, p) if str(c) not in broken]
    for c in cands:
        fns[str(c)] = ours(c)
    groups = {"best": [str(c) for c in cands], "plain": [str(c) for c in cands if not levers(c)]}
    for n in LEVERS:
        groups[n] = [str(c) for c in cands if n in levers(c)]
    failed = {}
    sweep, final, best = sweep_then_confirm(fns, ["torch", served_name], groups, R * -(-sweep_calls // R),
                                            R * -(-final_calls // R), device, failed)
    row = {"shape": shape_name(s), "configs": len(cands), "torch_ms": final["torch"], "served": str(served),
           "served_ms": final[served_name], "certified": is_cert, "sweep": sweep, "capture_failed": failed}
    for g, name in best.items():
        row[g] = name
        row[f"{g}_ms"] = final.get(name) if name else None
    del q, kvs, o
    if device == "cuda":
        torch.cuda.empty_cache()
    return row


def ratio(a, b):
    return "-" if not a or not b else f"{a / b:.3f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU interpreter (numbers mean nothing)")
    ap.add_argument("--budget-s", type=float, default=180.0, help="no shape starts its timing after this")
    ap.add_argument("--check-s", type=float, default=120.0, help="checks and compiles not done by then are errors")
    ap.add_argument("--workers", type=int, default=min(12, max(1, (os.cpu_count() or 2) - 2)))
    args = ap.parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    import logging

    from nbx_tune.profiles import current_profile, get_profile

    logging.getLogger("nbx_tune").setLevel(logging.ERROR)
    if args.smoke:
        # The interpreter checks fp16 (its bf16 arithmetic is not faithful); the space is
        # pruned as on the GPU (hopper) and cut to a few configs per lever.
        profile, device, dt, calls = get_profile("hopper"), "cpu", "float16", (1, 1)
        shapes, odd = SMOKE_SHAPES, SMOKE_ODD
        rtol = get_profile("interpreter").rtol(dt)
    else:
        profile, device, dt, shapes, odd, calls = current_profile(), "cuda", "bfloat16", SHAPES, ODD, (4, 12)
        rtol = profile.rtol(dt)
    report = {"env": environment(), "profile": profile.name, "dtype": dt, "rtol": rtol}

    by_cfg: dict = {}
    for s in shapes:
        for c in space(profile, problem(s, dt)):
            by_cfg.setdefault(str(c), []).append(s)
    for s in odd:  # the lever configs at odd shapes too (the others were proven there before)
        for c in space(profile, problem(s, dt)):
            if levers(c) and str(c) in by_cfg:
                by_cfg[str(c)].append(s)
    if args.smoke:
        keep = {}
        for key in by_cfg:
            sig = levers(config_named(key))
            keep.setdefault(sig, key)
        by_cfg = {k: by_cfg[k] for k in keep.values()}
    jobs = [(key, ss, dt, device, rtol) for key, ss in by_cfg.items()]
    print(f"{len(jobs)} configs, {sum(len(j[1]) for j in jobs)} (config, shape) pairs to check and compile, "
          f"{args.workers} processes", flush=True)
    rows = [r for res in run_jobs(jobs, device, args.workers, args.check_s) for r in res]
    bad = [r for r in rows if r[-1] != "ok"]
    report["check"] = rows
    print(table(bad, ["shape", "layout", "config", "levers", "err", "torch err", "verdict"]) if bad else "")
    print(f"check: {len(rows) - len(bad)} of {len(rows)} ok (rtol {rtol}, torch's SDPA in fp32 as the reference; "
          f"torch's own {dt} error up to {max((float(r[5]) for r in rows if r[5] != '-'), default=0):.2e}); "
          f"{time.perf_counter() - T0:.0f} s", flush=True)
    save("attention_prefill.json", report)

    broken = {r[2] for r in bad}  # a config that failed anywhere is not timed
    if args.smoke:
        broken |= {c for c in {str(x) for s in shapes for x in space(profile, problem(s, dt))} if c not in by_cfg}
    report["timing"] = []
    for s in shapes:
        if time.perf_counter() - T0 > args.budget_s:
            report["timing"].append({"shape": shape_name(s), "error": "not timed (budget)"})
            continue
        try:
            row = time_shape(profile, s, dt, device, broken, *calls)
            report["timing"].append(row)
            print(f"  {row['shape']}: torch {row['torch_ms']:.4f} ms, best {row['best_ms']:.4f} ms "
                  f"({row['configs']} configs timed, {len(row['capture_failed'])} failed to capture)", flush=True)
        except Exception as e:
            traceback.print_exc(limit=3)
            report["timing"].append({"shape": shape_name(s), "error": f"{type(e).__name__}: {str(e)[:150]}"})
        save("attention_prefill.json", report)

    env = report["env"]
    print(f"\n{env['date']} {env['gpu']} driver {env['driver']} Triton {env['triton']} torch {env['torch']}; "
          f"{dt}, kernel time under CUDA-graph replay; ratios torch / ours (below 1: slower than torch)")
    header = ["shape", "torch ms", "best ms", "torch/best", "torch/served", "no lever", *(f"best {n}" for n in LEVERS),
              "best config"]
    t = []
    for x in report["timing"]:
        if "error" in x:
            t.append([x["shape"], x["error"][:60]] + [""] * (len(header) - 2))
            continue
        t.append([x["shape"], f"{x['torch_ms']:.4f}", f"{x['best_ms']:.4f}",
                  ratio(x["torch_ms"], x["best_ms"]),
                  ratio(x["torch_ms"], x["served_ms"]) + ("" if x["certified"] else " (default)"),
                  ratio(x["torch_ms"], x["plain_ms"]),
                  *(ratio(x["torch_ms"], x[f"{n}_ms"]) for n in LEVERS), x["best"]])
    print(table(t, header))
    print(f"total {time.perf_counter() - T0:.0f} s; JSON {save('attention_prefill.json', report)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
