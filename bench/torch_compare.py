"""The kernel library against torch on real traces: every row a kernel serves, the certified
op against torch's own op at the row's shapes, and each trace's end-to-end total.

    python bench/torch_compare.py [TRACE.tsv ...]      default: every examples/traces/*.tsv
        --budget-s 270     stop timing new rows after this long (the rest: "not timed")
        --rows N           at most N rows per trace, the heaviest (count x bytes) first
        --smoke            tiny traces on the CPU interpreter (TRITON_INTERPRET=1): the
                           script's own check, its numbers mean nothing

Per row, both sides are timed the same way in alternating rounds (_common.side_by_side):
- graph: kernel time per call under CUDA-graph replay (a graph of G calls, replayed);
- eager: milliseconds per call launched from Python in a loop (host launch path included).
Operands rotate through several copies (about 96 MB in all, at most 4) on both sides, so a
weight matrix is not served from the 50 MB L2 on the next call, as in a model; outputs are
allocated per call on both sides (the caching allocator hands back the block just freed).

nbx side: the certified config of the row's seat (the DB named by NBX_TUNE_DB, tables,
shipped tables: kernels/runtime/certified.py), through the public op where one takes the row as is
(mm, addmm, bmm, baddbmm, scaled_dot_product_attention), else the spec's launch. A seat
with no certificate runs the declared default and the row says `default`. torch side: the
row's aten op (torch.ops.aten.*) with its recorded params, on fresh tensors of its shapes.
Ratios are torch / nbx: below 1 means nbx-tune is slower. A trace's total is the sum over
its timed rows of count x time, each side; rows not timed are counted and named.
Identical rows (op, dtypes, shapes, params) are timed once across traces.
Each row also says which GPU its certificate was timed on (`measured_on`: the shipped
table's entry, the session database, or none), and the summary counts the rows below 0.9
whose pick was timed on another GPU (an H200's picks served on an H100 rank otherwise).
What serve() runs: a row whose seat has a torch baseline on this GPU that is faster
(`nbx-tune baseline`, kernels/runtime/torch_rule.py) runs torch's op under serve(): such rows say
`torch`, and the summary's "served" total counts torch's time there (rows to torch, and the
served rows still below 0.9, beside the kernels' own ratio).
Output: a table per trace and a summary on stdout, JSON in $OUT/torch_compare.json.
"""

from __future__ import annotations

import argparse
import glob
import logging
import os
import sys
import time
import traceback
from pathlib import Path

from nbx_tune.testing.bench import environment, save, side_by_side, table  # noqa: E402

from nbx_tune.tuner.timing.torch_baselines import (    GRAPH_CALLS,
    capture,
    cpu_timer as _cpu_timer,
    cuda_timer as _cuda_timer,
    graph_times,
    n_sets,
    operand_sets,
    row_text,
    served,
    tensor as _tensor,
    torch_call,
)

ROOT = Path(__file__).resolve().parent.parent
SMOKE_TRACES = ("llama_small.tsv", "gpt2_small.tsv")
SLOW = 0.9  # a row below this torch/nbx-tune ratio under graphs is counted (issue 23's bar)


# ----------------------------------------------------------------------------- nbx side

def _public(spec, problem, row, ins, outs):
    """The public op's call for a row it takes as is, else None."""
    from nbx_tune import kernels as K

    op = row.base_op
    if spec.name == "matmul":
        from nbx_tune.kernels.matmul import _operands

        a, b = _operands(problem, ins, lambda x: x.transpose(1, 2))  # a `layout=nt` row's b: W.t()
        if op == "aten.mm":
            return lambda: K.mm(a[0], b[0])
        if op == "aten.bmm":
            return lambda: K.bmm(a, b)
        alpha, beta = problem.get("alpha", 1.0), problem.get("beta", 1.0)
        bias = ins.get("bias")
        if bias is None:
            return None
        if op == "aten.addmm":
            return lambda: K.addmm(bias, a[0], b[0], beta=beta, alpha=alpha)
        if op == "aten.baddbmm":
            return lambda: K.baddbmm(bias, a, b, beta=beta, alpha=alpha)
    if spec.name == "attention" and op == "aten.scaled_dot_product_attention":
        causal = dict(problem.flags)["causal"] == "1"
        scale = problem.get("scale")
        return lambda: K.scaled_dot_product_attention(ins["q"], ins["k"], ins["v"], is_causal=causal, scale=scale)
    return None


def measured_on(spec, problem) -> str | None:
    """Where the certificate the launch serves was timed: the device named in the shipped
    table's entry, "database" for the session's own census, None for a declared default. A
    pick timed on a sibling device (an H200's on an H100) may rank otherwise here."""
    from nbx_tune.kernels.runtime import certified
    from nbx_tune.kernels.spec import bucket_of, encode_bucket, encode_dtypes, encode_flags
    from nbx_tune.tuner.search.seat_search import shipped

    st = certified.state()
    bucket = bucket_of(st.profile, spec.key, problem.dims)
    hit = st.entries.get((spec.name, problem.dtypes, problem.flags, bucket))
    if hit is None:
        return None
    if hit[1] == "database":
        return "database"
    e = shipped(st.profile.name).get((spec.name, encode_dtypes(problem.dtypes), encode_flags(problem.flags),
                                      encode_bucket(spec.key, bucket)))
    return e["provenance"].get("device_name") if e else hit[1]


def deferred(spec, problem) -> bool:
    """Whether serve() runs torch at the row's seat: its torch baseline on this GPU is faster
    (kernels/runtime/torch_rule.py; recorded by `nbx-tune baseline`). Read after nbx_call's lookup."""
    from nbx_tune.kernels.runtime import certified

    return certified.state().memo[(spec.name, problem.dtypes, problem.flags, problem.dims)][2] is not None


def nbx_call(spec, problem, row, device: str):
    """(fn(i), config text, certified?, path): the certified op of the row on operands of
    the spec's shapes (uniform values; integers zero), rotating like torch's side."""
    import torch

    from nbx_tune.kernels.runtime import certified

    config = certified.config_for(spec, problem.dtypes, problem.flags, problem.dims)
    is_cert = certified.state().memo[(spec.name, problem.dtypes, problem.flags, problem.dims)][1] is None
    sets = []
    inputs, out_specs = operand_sets(spec, problem, device)
    for ins in inputs:
        outs = {n: torch.empty(s, dtype=d, device=device) for n, s, d in out_specs}
        pub = _public(spec, problem, row, ins, outs)
        if pub is None:
            # Outputs allocated per call, as torch's op (and the public ops) allocate theirs:
            # one output per operand set would leave the L2 each call while torch's stays.
            pub = (lambda ins=ins: spec.launch(config, problem, ins, {
                n: torch.empty(s, dtype=d, device=device) for n, s, d in out_specs}))
        sets.append(pub)
    path = "public" if _public(spec, problem, row, ins, outs) is not None else "spec"
    return (lambda i: sets[i % len(sets)]()), str(config), is_cert, path


# ----------------------------------------------------------------------------- timing

def time_pair(fns: dict, device: str, rep_ms: float) -> dict:
    """{side: {"graph": ms, "eager": ms}} for fns {side: fn(i)}: each side's graph of
    GRAPH_CALLS calls and its eager loop, alternating in rounds (side_by_side)."""
    out = {s: {} for s in fns}
    if device == "cpu":
        for s, f in fns.items():
            f(0)
        t = side_by_side({s: (lambda f=f: f(0)) for s, f in fns.items()}, rep_ms, rounds=2, timer=_cpu_timer)
        return {s: {"graph": None, "eager": t[s]} for s in fns}
    graphs = {s: capture(f) for s, f in fns.items()}

    class Eager:
        def __init__(self, f):
            self.f, self.i = f, 0

        def __call__(self):
            self.i += 1
            self.f(self.i)

    t = side_by_side({("graph", s): g.replay for s, g in graphs.items()}, rep_ms, rounds=4, timer=_cuda_timer)
    e = side_by_side({("eager", s): Eager(f) for s, f in fns.items()}, rep_ms / 2, rounds=4, timer=_cuda_timer)
    for s in fns:
        out[s] = {"graph": t[("graph", s)] / GRAPH_CALLS, "eager": e[("eager", s)]}
    del graphs
    return out


# ----------------------------------------------------------------------------- driver

def weight(row, spec, problem) -> int:
    try:
        return row.count * spec.operand_bytes(problem)
    except NotImplementedError:
        return row.count


def _short(device_name) -> str:
    """"H100" for "NVIDIA H100 80GB HBM3", as the table's column has room for."""
    if not device_name:
        return "-"
    words = [w for w in str(device_name).split() if w not in ("NVIDIA", "AMD", "Instinct")]
    return words[0] if words else str(device_name)


def ratio(a, b):
    return a / b if a and b else None


def fmt(x, nd=4):
    return "-" if x is None else f"{x:.{nd}f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="*")
    ap.add_argument("--budget-s", type=float, default=270.0)
    ap.add_argument("--rows", type=int, default=0, help="at most this many rows per trace (0: all)")
    ap.add_argument("--rep-ms", type=float, default=0.0, help="time per side per measure, ms (default 24, smoke 1)")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)

    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    # A seat without a certificate is marked `default` in the table: no log line per seat.
    log, level = logging.getLogger("nbx_tune"), logging.getLogger("nbx_tune").level
    log.setLevel(logging.ERROR)
    try:
        return run(args)
    finally:
        log.setLevel(level)


def run(args) -> int:
    import torch

    from nbx_tune.kernels.trace import read_trace

    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    traces = args.traces or ([str(ROOT / "examples/traces" / t) for t in SMOKE_TRACES] if args.smoke
                             else sorted(glob.glob(str(ROOT / "examples/traces/*.tsv"))))
    rep_ms = args.rep_ms or (1.0 if device == "cpu" else 24.0)
    max_rows = args.rows or (6 if args.smoke else 0)
    t_start = time.perf_counter()
    done: dict = {}  # row key -> result (timed once across traces)
    report = {"env": environment(), "device": device, "traces": {}}
    torch.manual_seed(0)

    work = []
    for path in traces:
        tr = read_trace(path)
        rows = []
        for row in tr.rows:
            sp = served(row)
            if sp is not None:
                rows.append((weight(row, *sp), row, *sp))
        rows.sort(key=lambda r: -r[0])
        skipped = rows[max_rows:] if max_rows else []
        work.append((path, tr, rows[:max_rows] if max_rows else rows, skipped))

    # Traces take turns, heaviest row first, so a budget cut leaves every trace its main rows.
    order = []
    for i in range(max(len(w[2]) for w in work) if work else 0):
        for path, tr, rows, _ in work:
            if i < len(rows):
                order.append(rows[i][1])
    for row in order:
        key = row.key()
        if key in done:
            continue
        if time.perf_counter() - t_start > args.budget_s:
            done[key] = {"error": "not timed (budget)"}
            continue
        spec, problem = served(row)
        res = {"kernel": spec.name}
        try:
            f_torch, _ = torch_call(row, device)
            f_nbx, cfg, is_cert, how = nbx_call(spec, problem, row, device)
            res.update(config=cfg, certified=is_cert, path=how, measured_on=measured_on(spec, problem),
                       serve_runs="torch" if deferred(spec, problem) else "kernel")
            res.update(time_pair({"nbx": f_nbx, "torch": f_torch}, device, rep_ms))
        except Exception as e:  # one row's failure is its own: recorded, the run goes on
            res["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            traceback.print_exc(limit=2, file=sys.stderr)
            if device == "cuda":
                torch.cuda.synchronize()
        finally:
            f_torch = f_nbx = None
            if device == "cuda":
                torch.cuda.empty_cache()
        done[key] = res
        if len(done) % 20 == 0:  # kept if the stage is cut short
            save("torch_compare.json", {"partial": {row_text(r): done[r.key()] for r in order if r.key() in done}})
        g = ratio(res.get("torch", {}).get("graph"), res.get("nbx", {}).get("graph"))
        print(f"  {row_text(row)[:90]:90s} graph torch/nbx {fmt(g, 3)} {res.get('error', '')}", flush=True)

    summary = []
    for path, tr, rows, skipped in work:
        name = Path(path).stem
        lines, tot = [], {"nbx": {"graph": 0.0, "eager": 0.0}, "torch": {"graph": 0.0, "eager": 0.0}}
        served_ms = {"graph": 0.0, "eager": 0.0}  # what serve() runs: torch at the seats it defers
        untimed = [row_text(r[1]) for r in skipped]
        launches = {"served": 0, "timed": 0, "all": tr.launches}
        for _, row, spec, problem in rows + skipped:
            launches["served"] += row.count
        for _, row, spec, problem in rows:
            r = done.get(row.key(), {"error": "not timed"})
            if all(r.get(s, {}).get("eager") is not None for s in tot):
                launches["timed"] += row.count
                for m in ("graph", "eager"):  # no graph on the CPU: only eager totals there
                    if all(r[s][m] is not None for s in tot):
                        for s in tot:
                            tot[s][m] += row.count * r[s][m]
                        served_ms[m] += row.count * r["torch" if r.get("serve_runs") == "torch" else "nbx"][m]
            else:
                untimed.append(row_text(row) + f" ({r.get('error', '?')})")
            lines.append({"row": row_text(row), "count": row.count, **r})
        gr = ratio(tot["torch"]["graph"], tot["nbx"]["graph"])
        er = ratio(tot["torch"]["eager"], tot["nbx"]["eager"])
        sr = ratio(tot["torch"]["graph"], served_ms["graph"])
        report["traces"][name] = {"rows": lines, "total_ms": tot, "ratio_graph": gr, "ratio_eager": er,
                                  "served_ms": served_ms, "ratio_served_graph": sr,
                                  "launches": launches, "untimed": untimed}
        tab = []
        for ln in lines:
            nb, to = ln.get("nbx", {}), ln.get("torch", {})
            tab.append([ln["row"][:72], ln["count"], fmt(nb.get("graph")), fmt(to.get("graph")),
                        fmt(ratio(to.get("graph"), nb.get("graph")), 3),
                        fmt(ratio(to.get("eager"), nb.get("eager")), 3),
                        (("torch" if ln.get("serve_runs") == "torch" else "cert") if ln.get("certified") else "default")
                        if "config" in ln else ln.get("error", "")[:30],
                        _short(ln.get("measured_on"))])
        print(f"\n== {name}: {len(lines)} served rows, {launches['timed']}/{launches['served']} served launches "
              f"timed ({launches['all']} in the trace)")
        print(table(tab, ["row", "count", "nbx graph ms", "torch graph ms", "torch/nbx graph", "torch/nbx eager",
                          "config", "timed on"]))
        timed = [(ratio(ln["torch"]["graph"], ln["nbx"]["graph"]), ln.get("measured_on")) for ln in lines
                 if ln.get("nbx", {}).get("graph") and ln.get("torch", {}).get("graph")]
        kept = [ratio(ln["torch"]["graph"], ln["nbx"]["graph"]) for ln in lines if ln.get("serve_runs") == "kernel"
                and ln.get("nbx", {}).get("graph") and ln.get("torch", {}).get("graph")]
        to_torch = sum(1 for ln in lines if ln.get("serve_runs") == "torch")
        worst = min((g for g, _ in timed), default=None)
        here = report["env"].get("gpu")
        slow = [on for g, on in timed if g < SLOW]
        elsewhere = sum(1 for on in slow if on not in (None, "database", here))
        summary.append([name, f"{launches['timed']}/{launches['served']}", fmt(tot["nbx"]["graph"], 3),
                        fmt(tot["torch"]["graph"], 3), fmt(gr, 3), fmt(er, 3), fmt(worst, 3),
                        f"{len(slow)} ({elsewhere})", fmt(sr, 3), to_torch,
                        sum(1 for g in kept if g < SLOW), len(untimed)])
        save("torch_compare.json", report)
    env = report["env"]
    print(f"\n{env['date']} {env['gpu']} driver {env['driver']} Triton {env['triton']} torch {env['torch']}")
    print(table(summary, ["trace", "launches timed", "nbx e2e graph ms", "torch e2e graph ms", "torch/nbx graph",
                          "torch/nbx eager", "worst row (graph)", f"rows < {SLOW} (timed on another GPU)",
                          "torch/served graph", "rows to torch", f"served rows < {SLOW}", "rows untimed"]))
    print(f"total {time.perf_counter() - t_start:.0f} s; JSON {save('torch_compare.json', report)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
