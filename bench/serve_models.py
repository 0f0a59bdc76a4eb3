"""A real model on the certified kernels: transformers' Llama with Llama-2-7B's dimensions
(a few layers, random weights, nothing downloaded), prefill and one decode step with a
static KV cache, under torch and under `nbx_tune.serve()`, eager and in CUDA graphs.

    python3 bench/serve_models.py                 # H200: 2 layers, prefill of 512, bf16
    python3 bench/serve_models.py --smoke         # CPU interpreter, a tiny Llama, fp32, eager only
    python3 bench/serve_models.py --no-census     # time on what the database holds already

First the user's workflow, trace -> census -> serve: the launches of exactly the calls that
are timed (a prefill, and a decode step on the filled cache) are recorded into
serve_models_trace.tsv, and `nbx-tune census` of that trace runs in a child process into the
database of NBX_TUNE_DB (--smoke: a fresh temporary one), stopped with Ctrl-C's effect after
--census-budget-s (what it certified by then is kept). Then the timing.

Variants: torch, torch with serve()'s fusions alone (kernels/serving/fusions/engine.py: the RMS norm as
torch's one-launch F.rms_norm; rotary and SwiGLU as the library's ops, which outside serve()
run torch's own pattern), and serve(). Prints one row per variant: wall time per call (ms,
the host's launch path included, which is what eager serving costs), torch's time over it (>= 1: serve is as fast), and each
variant's logits against an fp32 torch run of the same weights (max|out - ref| / max|ref|),
beside torch's own bf16 error, so serve's error reads against what bf16 costs anyway. Then
what serve ran: per op, launches on certified configs, on defaults, and on torch, with why.
A default-config launch is a miss (a seat the census did not certify); a host-to-device copy
falls through to torch by design. Writes serve_models.json under $OUT (else bench_out/).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch  # noqa: E402

from nbx_tune.testing.bench import environment, out_dir, per_call_ms, save, table  # noqa: E402

# serve() leaves a copy between the host and a device to torch (kernels/copy.py says "a copy
# to D from S is not served"): torch by design, not a miss. cuda from cuda:0 would be one.
_CROSS_DEVICE = re.compile(r"a copy to (\w+)\S* from (\w+)\S* is not served")


def by_design(reason: str) -> bool:
    m = _CROSS_DEVICE.search(reason)
    return bool(m) and m.group(1) != m.group(2)


def totals(stats: dict) -> dict:
    """Launches of one call: certified, default (misses), torch by design, torch otherwise."""
    t = {"certified": 0, "default": 0, "torch_by_design": 0, "torch": 0}
    for s in stats.values():
        t["certified"] += s["certified"]
        t["default"] += s["default"]
        for why, n in s["reasons"].items():
            t["torch_by_design" if by_design(why) else "torch"] += n
    return t


def run_census(trace, budget_s: float, extra=()) -> dict:
    """`nbx-tune census --model trace` in a child process, as a user runs it, into the database
    this process serves from (NBX_TUNE_DB is inherited). Past budget_s it gets SIGINT (the
    census marks its run interrupted and keeps every seat certified so far), then a dry run
    reports the coverage it left. `extra`: more census arguments (`--baseline`)."""
    cmd = [sys.executable, "-m", "nbx_tune.cli.app", "census", "--model", str(trace), "--json", *extra]
    log = out_dir() / "serve_models_census.log"
    t0 = time.time()
    with open(log, "w") as err:
        # Its own process group: the interrupt reaches the census's candidate worker too.
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)
        try:
            stdout, _ = proc.communicate(timeout=budget_s)
            status = "done" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                stdout, _ = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                stdout, _ = proc.communicate()
            status = f"stopped at the {budget_s:.0f} s budget"
    seconds = time.time() - t0
    try:
        rep = json.loads(stdout)
    except ValueError:  # interrupted or failed: read what the database holds now
        dry = subprocess.run([c for c in cmd if c != "--baseline"] + ["--dry-run"], capture_output=True, text=True)
        try:
            rep = json.loads(dry.stdout)
        except ValueError:
            rep = {}
    coverage = rep.get("coverage", {})
    seats = ", ".join(f"{v['seats']} {k}" for k, v in coverage.items()) or "no report"
    print(f"census of {trace}: {seats} seats, {status}, in {seconds:.0f} s (log: {log})")
    return {"seconds": round(seconds, 1), "status": status, "coverage": coverage,
            "trace": str(trace), "launches": rep.get("launches"), "run_id": rep.get("run_id")}


def build(args, dtype, device):
    from transformers import LlamaConfig, LlamaForCausalLM

    if args.smoke:
        cfg = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          intermediate_size=172, vocab_size=320, max_position_embeddings=128,
                          attn_implementation="sdpa")
    else:  # Llama-2-7B's dimensions, fewer layers
        cfg = LlamaConfig(hidden_size=4096, num_hidden_layers=args.layers, num_attention_heads=32,
                          num_key_value_heads=32, intermediate_size=11008, vocab_size=32000,
                          max_position_embeddings=4096, attn_implementation="sdpa")
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # as from_pretrained(dtype=...): rotary buffers stay fp32
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(default)
    return cfg, model


class Runner:
    """Prefill and decode of one model on transformers' DynamicCache (what `generate` uses):
    a prefill starts from an empty cache (causal attention, no mask); the decode step reads
    a cache filled by one prefill, whose tensors are put back after every step, so every
    call, and every replay of a graph, runs the same launches on the same live inputs."""

    def __init__(self, cfg, model, ids, seq):
        import inspect

        from transformers import DynamicCache

        self.model, self.ids = model, ids
        self.new_cache = lambda: DynamicCache(config=cfg)
        # transformers 5.25 renamed past_key_values to cache (the old name warns)
        self.kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self.next_id = ids[:, -1:].clone()
        self.cache = None

    def prefill(self):
        # With a fresh cache, as generate runs it: without one, transformers checks the
        # positions for packed sequences, a host sync no CUDA graph can hold.
        return self.model(input_ids=self.ids, use_cache=True, **{self.kw: self.new_cache()}).logits

    def fill(self):
        self.cache = self.new_cache()
        self.model(input_ids=self.ids, use_cache=True, **{self.kw: self.cache})

    def decode(self):
        layers = self.cache.layers
        kept = [(layer.keys, layer.values) for layer in layers]
        logits = self.model(input_ids=self.next_id, use_cache=True, **{self.kw: self.cache}).logits
        for layer, (k, v) in zip(layers, kept):
            layer.keys, layer.values = k, v
        return logits


def rel_err(out, ref) -> float:
    out, ref = out.double(), ref.double()
    return ((out - ref).abs().max() / ref.abs().max()).item()


def graphed(fn, ctx):
    """fn captured in a CUDA graph under the context `ctx()` (warmed up first on a side
    stream, as torch advises): a callable replaying it and returning its output tensor."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), ctx():
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with ctx(), torch.cuda.graph(g):
        out = fn()

    def replay():
        g.replay()
        return out
    return replay


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _fused:
    """torch with serve()'s fusions alone: the part of serve()'s lead a torch user could get
    by calling F.rms_norm (rotary and SwiGLU have no torch op: they run their pattern)."""

    def __enter__(self):
        from nbx_tune.kernels.serving.fusions import engine as fusions

        fusions.acquire()
        return self

    def __exit__(self, *exc):
        from nbx_tune.kernels.serving.fusions import engine as fusions

        fusions.release()
        return False


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--reps", type=int, default=20, help="calls per timing round (4 turned rounds)")
    p.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny model, eager only")
    p.add_argument("--no-census", action="store_true",
                   help="skip trace and census: serve from what the database holds")
    p.add_argument("--census-budget-s", type=float, default=180,
                   help="stop the census after this long (what it certified is kept)")
    args = p.parse_args()
    if args.smoke and not os.environ.get("NBX_TUNE_DB"):  # keep the user's database clean
        db = os.path.join(tempfile.mkdtemp(prefix="nbx-serve-smoke-"), "smoke.db")
        os.environ["NBX_TUNE_DB"] = f"sqlite:///{db}"

    import nbx_tune
    from nbx_tune.kernels.serving import serve as serving

    device = "cpu" if args.smoke else "cuda"
    dtype = torch.float32 if args.smoke else torch.bfloat16
    seq = 24 if args.smoke else args.seq
    reps = 2 if args.smoke else args.reps
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    t_start = time.time()

    cfg, model = build(args, dtype, device)
    torch.manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (1, seq), device=device)
    result = {"env": environment(), "layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size,
              "seq": seq, "dtype": str(dtype).removeprefix("torch."), "variants": {}, "stats": {}}

    with torch.inference_mode():
        # fp32 reference of the same weights (rotary buffers are fp32 already).
        ref_model = build(args, torch.float32, device)[1]
        ref_model.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
        r = Runner(cfg, ref_model, ids, seq)
        r.fill()
        ref = {"prefill": r.prefill().float(), "decode": r.decode().float()}
        del ref_model, r

        run = Runner(cfg, model, ids, seq)
        run.fill()
        from nbx_tune.kernels.runtime import certified
        from nbx_tune.kernels.serving.fusions import engine as fusions
        from nbx_tune.tuner.trace.recorder import Recorder
        from nbx_tune.kernels.trace import write_trace

        # The trace: the very calls timed below, on this device (the decode on the filled cache).
        rows = []
        for phase in ("prefill", "decode"):
            with Recorder() as rec:
                getattr(run, phase)()
            launches = {}
            for row in rec.rows:
                launches[row.op] = launches.get(row.op, 0) + row.count
            result.setdefault("launches", {})[phase] = launches
            rows += rec.rows
        result["census"] = None
        if not args.no_census:
            trace = out_dir() / "serve_models_trace.tsv"
            write_trace(trace, rows, [f"bench/serve_models.py: prefill {seq} and decode 1, "
                                      f"{cfg.num_hidden_layers} layers, {result['dtype']}"])
            result["census"] = run_census(trace, args.census_budget_s)
            certified.reload()  # serve from what the census wrote
        fns = {}
        fns["torch eager"] = {"prefill": run.prefill, "decode": run.decode}
        # serve eager: the first calls compile the kernels; the stats are one call of each.
        with nbx_tune.serve():
            run.prefill()
            run.decode()
            for phase in ("prefill", "decode"):
                serving.reset_stats()
                getattr(run, phase)()
                result["stats"][phase] = serving.stats()
                result.setdefault("fused", {})[phase] = fusions.stats()

        fns["serve eager"] = {"prefill": run.prefill, "decode": run.decode}
        fns["torch+fusions eager"] = dict(fns["torch eager"])
        # serve() is entered around a whole timing loop, never around one call: entering
        # installs its overrides (about 1 ms), a cost of a program's start, not of a launch.
        ctxs = {}
        for mode in ("eager", "graph"):
            ctxs.update({f"torch {mode}": _nothing, f"torch+fusions {mode}": _fused,
                         f"serve {mode}": nbx_tune.serve})
        if device == "cuda":
            for name in ("torch graph", "torch+fusions graph", "serve graph"):
                fns[name] = {}
                for phase in ("prefill", "decode"):
                    try:
                        fns[name][phase] = graphed(getattr(run, phase), ctxs[name])
                    except Exception as e:  # a capture that fails is a result, not a crash
                        result["variants"].setdefault(name, {})[f"{phase}_error"] = \
                            f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                        torch.cuda.synchronize()

        for phase in ("prefill", "decode"):
            for name, f in fns.items():
                if phase not in f:
                    continue
                with ctxs[name]():
                    out = f[phase]()
                sync()
                result["variants"].setdefault(name, {})[f"{phase}_err"] = rel_err(out, ref[phase])
            times = {n: [] for n in fns if phase in fns[n]}
            names = list(times)
            for rnd in range(4):  # turned rounds: drift of clocks reaches every variant alike
                k = rnd % len(names)
                for n in names[k:] + names[:k]:
                    with ctxs[n]():
                        times[n].append(per_call_ms(fns[n][phase], reps, sync))
            for n, v in times.items():
                result["variants"][n][f"{phase}_ms"] = sorted(v)[len(v) // 2]

    v = result["variants"]
    rows = []
    for name, d in v.items():  # against plain torch: what the user runs without nbx-tune
        base = "torch graph" if "graph" in name else "torch eager"
        row = [name]
        for phase in ("prefill", "decode"):
            ms = d.get(f"{phase}_ms")
            b = v.get(base, {}).get(f"{phase}_ms")
            row += [f"{ms:.3f}" if ms else d.get(f"{phase}_error", "-")[:40],
                    f"{b / ms:.2f}" if ms and b else "-",
                    f"{d[f'{phase}_err']:.1e}" if f"{phase}_err" in d else "-"]
        rows.append(row)
    print(f"Llama {cfg.hidden_size} hidden x {cfg.num_hidden_layers} layers, prefill {seq}, decode 1 "
          f"(DynamicCache), {result['dtype']}, {result['env']['gpu']}")
    print(table(rows, ["variant", "prefill ms", "torch/it", "err vs fp32", "decode ms", "torch/it",
                       "err vs fp32"]))
    for phase in ("prefill", "decode"):
        st = result["stats"][phase]
        tot = result.setdefault("totals", {})[phase] = totals(st)
        launches = result["launches"][phase]
        uncovered = {op: n for op, n in launches.items() if op not in serving.routes()}
        print(f"\nserve, one {phase} ({sum(launches.values())} launches): {tot['certified']} certified, "
              f"{tot['default']} default, {tot['torch_by_design']} on torch by design (host-device copies), "
              f"{tot['torch']} fell through to torch, "
              f"{sum(uncovered.values())} of ops no kernel covers: "
              + (", ".join(f"{op} {n}" for op, n in sorted(uncovered.items(), key=lambda kv: -kv[1]))
                 or "none"))
        print(serving.format_stats(st, result["fused"][phase]))
    result["default_launches"] = sum(t["default"] for t in result["totals"].values())
    # The seats those launches missed (a seat the census did not reach, or one the trace
    # planned otherwise than the launch found it).
    result["missed_seats"] = sorted(certified.launch_stats()["misses"])
    census = result.get("census")
    print(f"\ndefault-config launches: {result['default_launches']} "
          f"(prefill {result['totals']['prefill']['default']}, decode {result['totals']['decode']['default']}; "
          + (f"census {census['status']}, {census['seconds']:.0f} s)" if census else "no census run)"))
    for label in result["missed_seats"] if census else ():
        print(f"missed seat: {label}")
    result["seconds"] = time.time() - t_start
    print(f"\nwrote {save('serve_models.json', result)} in {result['seconds']:.0f} s")


if __name__ == "__main__":
    main()
