"""Does the census's timing rank a kernel's configs as a model under CUDA graphs runs them?

    python bench/timing_agreement.py [TRACE.tsv ...] --kernels conv,attention
        --rows N        at most N rows per kernel, the heaviest (count x bytes) first (default 6)
        --configs N     at most N configs a row, in declared order (default: all)
        --budget-s 300  no new row after this long
        --smoke         tiny traces on the CPU interpreter (TRITON_INTERPRET=1, 3 configs a
                        row): the script's own check, its numbers mean nothing

For each row a named kernel serves (identical seats once), every config of the kernel's
space that the profile admits (static refusals out) is timed three ways on the same
operands:
  launch  one launch at a time behind a flushed L2 (tuner/timing.gpu_time: the census's
          timing for kernels declaring timing = "launch")
  stream  graph-replayed bursts on warm and rotating operand sets (tuner/timing.stream_time:
          kernels declaring timing = "stream")
  replay  bench/torch_compare.py's measure: a graph of calls over rotating operand sets,
          side by side with torch's op
A config whose outputs differ from the first config's beyond the dtype's tolerance is left
out (the census's screen, not this study, is what certifies). Per row: torch / replay time of
each way's pick and of replay's best; per kernel: how often each way picked replay's best,
and the median and maximum loss of its pick under replay. lab/gemm_replay_timing made
matmul a stream this way. JSON in $OUT/timing_agreement.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from nbx_tune.testing.bench import environment, save, table  # noqa: E402
from nbx_tune.bench.torch_compare import (SMOKE_TRACES, _tensor, graph_times, n_sets, row_text, served,  # noqa: E402
                           torch_call, weight)

ROOT = Path(__file__).resolve().parent.parent
WAYS = ("launch", "stream")


def operand_sets(spec, problem, device: str) -> list:
    """Input dicts (uniform values, integers zero), as many as torch_compare rotates."""
    shapes = spec.input_shapes(problem)
    return [{n: _tensor(s, dt, device) for n, (s, dt) in shapes.items()}
            for _ in range(n_sets(spec.operand_bytes(problem), device))]


def launcher(spec, problem, config, sets, device: str):
    """fn(i): the config's launch on set i, its outputs allocated per call (as torch's)."""
    import torch

    outs = [(n, s, getattr(torch, dt)) for n, (s, dt) in spec.output_specs(problem).items()]

    def fn(i):
        o = {n: torch.empty(s, dtype=d, device=device) for n, s, d in outs}
        spec.launch(config, problem, sets[i % len(sets)], o)
        return o
    return fn


def agrees(spec, ref: dict, got: dict) -> bool:
    """Outputs within the dtype's tolerance of the reference config's (exact kernels: equal)."""
    import torch

    for n, r in ref.items():
        g = got[n]
        if spec.exact or not r.is_floating_point():
            if not torch.equal(r, g):
                return False
            continue
        tol = 1e-3 if r.dtype == torch.float32 else 4e-2
        scale = r.double().abs().max().item() or 1.0
        if not (g.double() - r.double()).abs().max().item() <= tol * scale:
            return False
    return True


def time_row(row, spec, problem, profile, bench, device: str, max_configs: int | None, rep_ms: float) -> dict:
    import torch

    from nbx_tune.tuner.timing import benchmarkers as timing

    cfgs = [c for c in spec.configs() if spec.static_refusal(profile, c, problem) is None][:max_configs]
    sets = operand_sets(spec, problem, device)
    fns, ways, bad, ref = {}, {w: {} for w in WAYS}, [], None
    for c in cfgs:
        f = launcher(spec, problem, c, sets, device)
        try:
            out = f(0)
            if ref is None:
                ref = out
            elif not agrees(spec, ref, out):
                bad.append(f"{c}: outputs differ from {cfgs[0]}")
                continue
            ways["launch"][str(c)] = bench(lambda f=f: f(0), "full").median_ms
            ways["stream"][str(c)] = timing.time_sets(bench, [lambda f=f, i=i: f(i) for i in range(len(sets))],
                                                      "full").median_ms
            fns[str(c)] = f
        except Exception as e:  # noqa: BLE001 - a config that cannot run here is recorded, not fatal
            bad.append(f"{c}: {type(e).__name__} {str(e).splitlines()[0][:100] if str(e) else ''}")
    f_torch, _ = torch_call(row, device)
    replay = graph_times({"torch": f_torch, **fns}, rep_ms, device=device) if fns else {}
    del sets, fns
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"kernel": spec.name, "row": row_text(row), "configs": len(cfgs), "bad": bad, "replay": replay, **ways}


def summarize(res: dict) -> dict | None:
    """Each way's pick and replay's best, as torch / replay time, and the pick's loss."""
    rep = {k: v for k, v in res["replay"].items() if k != "torch"}
    if not rep:
        return None
    best = min(rep, key=rep.get)
    t = res["replay"]["torch"]
    out = {"best": best, "torch/best": t / rep[best]}
    for w in WAYS:
        pick = min(res[w], key=res[w].get)
        out[w] = {"pick": pick, "torch/pick": t / rep[pick], "loss": rep[pick] / rep[best] - 1,
                  "rank_of_best": sorted(res[w], key=res[w].get).index(best) + 1}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="*")
    ap.add_argument("--kernels", default="matmul")
    ap.add_argument("--rows", type=int, default=6)
    ap.add_argument("--configs", type=int, default=0)
    ap.add_argument("--budget-s", type=float, default=300.0)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"

    import torch

    from nbx_tune.profiles import get_profile
    from nbx_tune.tuner.timing import benchmarkers as timing
    from nbx_tune.kernels.trace import read_trace

    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    profile = get_profile("hopper" if device == "cuda" else "interpreter")
    bench = timing.for_profile(profile)
    traces = args.traces or ([str(ROOT / "examples/traces" / t) for t in SMOKE_TRACES] if args.smoke
                             else sorted(str(p) for p in (ROOT / "examples/traces").glob("*_bf16*.tsv")))
    kernels = set(args.kernels.split(","))
    max_configs = args.configs or (3 if args.smoke else None)
    rep_ms = 1.0 if device == "cpu" else 8.0

    rows, seen = {k: [] for k in kernels}, set()
    for path in traces:
        for row in read_trace(path).rows:
            sp = served(row)
            if sp is None or sp[0].name not in kernels:
                continue
            seat = (sp[0].name, sp[1].dtypes, sp[1].flags, sp[1].dims, row.params.get("layout", "nn"))
            if seat not in seen:
                seen.add(seat)
                rows[sp[0].name].append((weight(row, *sp), row, *sp))
    t0, results = time.perf_counter(), []
    report = {"env": environment(), "device": device, "rows": results}
    for k in sorted(kernels):
        for _, row, spec, problem in sorted(rows[k], key=lambda r: -r[0])[:args.rows]:
            if time.perf_counter() - t0 > args.budget_s:
                break
            res = time_row(row, spec, problem, profile, bench, device, max_configs, rep_ms)
            res["summary"] = summarize(res)
            results.append(res)
            save("timing_agreement.json", report)
            s = res["summary"]
            print(f"{row_text(row)[:80]:80s} " + ("no config ran" if s is None else
                  f"launch {s['launch']['torch/pick']:.3f} stream {s['stream']['torch/pick']:.3f} "
                  f"best {s['torch/best']:.3f} ({res['configs']} configs, {len(res['bad'])} left out, "
                  f"{time.perf_counter() - t0:.0f} s)"), flush=True)
    lines = []
    for k in sorted(kernels):
        ss = [r["summary"] for r in results if r["kernel"] == k and r["summary"]]
        if not ss:
            continue
        for w in WAYS:
            losses = [s[w]["loss"] for s in ss]
            lines.append([k, w, len(ss), f"{sum(1 for s in ss if s[w]['pick'] == s['best'])}/{len(ss)}",
                          f"{100 * statistics.median(losses):.1f} %", f"{100 * max(losses):.1f} %"])
    report["summary"] = lines
    save("timing_agreement.json", report)
    print(f"{environment()['date']} {environment().get('gpu') or device}")
    print(table(lines, ["kernel", "timing", "rows", "picked replay's best", "median loss under replay",
                        "max loss under replay"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
