"""serve() eager against torch eager on models full of small ops (issue 63), side by side in
one run, bf16, random weights at real dimensions (nothing downloaded):

  pythia-1.4b decode   GPT-NeoX 1.4B (partial rotary), one decode step at batch 16 on 1024 cached tokens
  qwen2-1.5b decode    Qwen2-1.5B (grouped-query, SDPA), one decode step at batch 1 on 1024 cached tokens
  gemma2-2b decode     Gemma-2-2B with eager attention (soft-capped logits and scores), batch 1, 1024 cached
  gemma2-2b prefill    the same model, a prefill of 512 tokens

Per row: torch and serve() eager (wall ms per call, the host's launch path included) and in
CUDA graphs, torch's time over serve()'s (>= 1: serve() is as fast), serve()'s logits against
torch's, and what serve() ran in one call: launches on certified configs, on defaults, on
torch, of those the calls its eager rule handed to torch (kernels/runtime/eager_rule.py),
and the fusions. The goal line says whether every eager ratio is >= 1.0.

    python3 bench/eager_models.py                      # H100/H200: all rows, about 5 min
    python3 bench/eager_models.py --rows gemma2-2b     # rows whose name has this text
    python3 bench/eager_models.py --layers 8           # fewer layers a model (faster, same per-layer ops)
    python3 bench/eager_models.py --census-budget-s 400 --baseline   # certify and baseline the traced
                                                       # seats first (NBX_TUNE_DB), then time
    python3 bench/eager_models.py --census-budget-s 500 --baseline --census-only   # only that: time in
                                                       # a second call on the same database
    python3 bench/eager_models.py --smoke              # CPU interpreter, tiny models, fp32, eager only

serve() serves what NBX_TUNE_DB and the shipped table hold; its eager rule acts at seats with a
torch baseline for this GPU and torch minor (`nbx-tune census --baseline`, `nbx-tune baseline`).
Writes eager_models.json under $OUT (else bench_out/).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench's model runner

import torch  # noqa: E402

from nbx_tune.testing.bench import environment, out_dir, per_call_ms, save, table  # noqa: E402
from serve_models import Runner, _nothing, graphed, rel_err, run_census, totals  # noqa: E402

# name -> (family, config keywords at real size, phase, batch, tokens: cached for a decode, the prompt for a prefill)
ROWS = {
    "pythia-1.4b decode": ("gpt_neox", dict(hidden_size=2048, num_hidden_layers=24, num_attention_heads=16,
                                            intermediate_size=8192, vocab_size=50304, max_position_embeddings=2048,
                                            rope_parameters={"rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                                                             "rope_type": "default"}),
                           "decode", 16, 1024),
    "qwen2-1.5b decode": ("qwen2", dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
                                        num_key_value_heads=2, intermediate_size=8960, vocab_size=151936,
                                        max_position_embeddings=4096, tie_word_embeddings=True),
                          "decode", 1, 1024),
    "gemma2-2b decode": ("gemma2", dict(hidden_size=2304, num_hidden_layers=26, num_attention_heads=8,
                                        num_key_value_heads=4, head_dim=256, intermediate_size=9216,
                                        vocab_size=256000, max_position_embeddings=8192, sliding_window=4096,
                                        query_pre_attn_scalar=256, attn_logit_softcapping=50.0,
                                        final_logit_softcapping=30.0, attn_implementation="eager"),
                         "decode", 1, 1024),
    "gemma2-2b prefill": ("gemma2", None, "prefill", 1, 512),  # the model of the row before
}
SMOKE_SIZES = dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=96,
                   vocab_size=128, max_position_embeddings=256)
CLASSES = {"gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
           "gemma2": ("Gemma2Config", "Gemma2ForCausalLM")}


def config_of(name: str, args):
    import transformers

    family, kw, _, _, _ = ROWS[name]
    if kw is None:  # a row on the model of the row before
        kw = next(ROWS[n][1] for n in ROWS if ROWS[n][0] == family and ROWS[n][1] is not None)
    kw = dict(kw)
    if args.smoke:
        keep = {k: kw[k] for k in ("rope_parameters", "attn_logit_softcapping", "final_logit_softcapping",
                                   "attn_implementation") if k in kw}
        kw = {**SMOKE_SIZES, **keep, **({"num_key_value_heads": 2} if family != "gpt_neox" else {}),
              **({"head_dim": 16, "sliding_window": 64} if family == "gemma2" else {})}
    elif args.layers:
        kw["num_hidden_layers"] = min(args.layers, kw["num_hidden_layers"])
    return getattr(transformers, CLASSES[family][0])(**kw)


def build(name: str, args, dtype, device):
    import transformers

    cfg = config_of(name, args)
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # as from_pretrained(dtype=...): rotary buffers stay fp32
    try:
        with torch.device(device):
            model = getattr(transformers, CLASSES[ROWS[name][0]][1])(cfg).eval()
    finally:
        torch.set_default_dtype(default)
    return cfg, model


class StepRunner(Runner):
    """serve_models' runner, whose decode step puts back every attribute of each cache layer
    (a sliding-window layer counts the tokens it has seen, besides its keys and values)."""

    def decode(self):
        layers = self.cache.layers
        kept = [dict(vars(layer)) for layer in layers]
        logits = self.model(input_ids=self.next_id, use_cache=True, **{self.kw: self.cache}).logits
        for layer, state in zip(layers, kept):
            vars(layer).update(state)
        return logits


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="", help="comma-separated texts: the rows whose name has one")
    p.add_argument("--layers", type=int, default=0, help="at most this many layers a model (0: all)")
    p.add_argument("--reps", type=int, default=10, help="calls per timing round (4 turned rounds)")
    p.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny models, fp32, eager only")
    p.add_argument("--census-budget-s", type=float, default=0,
                   help="trace the timed calls and certify their seats first, for at most this long (0: no census)")
    p.add_argument("--baseline", action="store_true", help="the census also records torch baselines")
    p.add_argument("--census-only", action="store_true", help="stop after the census (time in another call)")
    args = p.parse_args(argv)
    if args.smoke and not os.environ.get("NBX_TUNE_DB"):  # keep the user's database clean
        os.environ["NBX_TUNE_DB"] = f"sqlite:///{os.path.join(tempfile.mkdtemp(prefix='nbx-eager-'), 'smoke.db')}"

    import nbx_tune
    from nbx_tune.kernels.runtime import certified, eager_rule
    from nbx_tune.kernels.serving import serve as serving
    from nbx_tune.kernels.serving.fusions import engine as fusions

    device = "cpu" if args.smoke else "cuda"
    dtype = torch.float32 if args.smoke else torch.bfloat16
    reps = 1 if args.smoke else args.reps
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    wanted = [n for n in ROWS if not args.rows or any(t.strip() in n for t in args.rows.split(","))]
    t_start = time.time()
    result = {"env": environment(), "dtype": str(dtype).removeprefix("torch."), "rows": {}}

    models, runners = {}, {}
    with torch.inference_mode():
        for name in wanted:  # every model at once: one trace, one census
            family, _, phase, batch, tokens = ROWS[name]
            if family not in models:
                models[family] = build(name, args, dtype, device)
            cfg, model = models[family]
            torch.manual_seed(1)
            tokens = min(tokens, 24) if args.smoke else tokens
            ids = torch.randint(0, cfg.vocab_size, (batch, tokens), device=device)
            runners[name] = run = StepRunner(cfg, model, ids, tokens)
            if phase == "decode":
                run.fill()
        if args.census_budget_s > 0:
            from nbx_tune.kernels.trace import write_trace
            from nbx_tune.tuner.trace.recorder import Recorder

            rows = []
            for name, run in runners.items():
                with Recorder() as rec:
                    getattr(run, ROWS[name][2])()
                rows += rec.rows
            trace = out_dir() / "eager_models_trace.tsv"
            write_trace(trace, rows, [f"bench/eager_models.py: {', '.join(runners)}"])
            result["census"] = run_census(trace, args.census_budget_s, ["--baseline"] if args.baseline else [])
            certified.reload()
            if args.census_only:
                print(f"wrote {save('eager_models_census.json', result)}")
                return 0

        for name, run in runners.items():
            phase = ROWS[name][2]
            fn = getattr(run, phase)
            want = fn()
            with nbx_tune.serve():
                for _ in range(2 if args.smoke else 2 + 2 * eager_rule.SAMPLES):  # compile, record, time the host
                    fn()                                                            # for the eager rule
                serving.reset_stats()
                got = fn()
                stats, fused = serving.stats(), fusions.stats()
            fns = {"torch eager": (fn, _nothing), "serve eager": (fn, nbx_tune.serve)}
            res = result["rows"][name] = {"err_vs_torch": rel_err(got, want), "totals": totals(stats),
                                          "eager_rule_torch": sum(s["reasons"].get(eager_rule.REASON, 0)
                                                                  for s in stats.values()),
                                          "fused": fused, "stats": stats}
            if device == "cuda":
                for side, ctx in (("torch graph", _nothing), ("serve graph", nbx_tune.serve)):
                    try:
                        fns[side] = (graphed(fn, ctx), ctx)
                    except Exception as e:  # a capture that fails is a result, not a crash
                        res[f"{side} error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
                        torch.cuda.synchronize()
            times = {n: [] for n in fns}
            names = list(times)
            for rnd in range(2 if args.smoke else 4):  # turned rounds: drift reaches every variant alike
                k = rnd % len(names)
                for n in names[k:] + names[:k]:
                    f, ctx = fns[n]
                    with ctx():
                        times[n].append(per_call_ms(f, reps, sync))
            res["ms"] = {n: sorted(v)[len(v) // 2] for n, v in times.items()}
            print(f"{name}: {', '.join(f'{n} {ms:.3f} ms' for n, ms in res['ms'].items())}", flush=True)
            del fns
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()

    out, ok = [], True
    for name, res in result["rows"].items():
        ms, tot = res["ms"], res["totals"]

        def ratio(a, b):
            return f"{ms[a] / ms[b]:.2f}" if a in ms and b in ms else res.get(f"{b} error", "-")[:30]
        ok = ok and ms["torch eager"] >= ms["serve eager"]
        out.append([name, f"{ms['torch eager']:.3f}", f"{ms['serve eager']:.3f}", ratio("torch eager", "serve eager"),
                    f"{ms['torch graph']:.3f}" if "torch graph" in ms else "-",
                    f"{ms['serve graph']:.3f}" if "serve graph" in ms else "-", ratio("torch graph", "serve graph"),
                    f"{tot['certified']}/{tot['default']}/{tot['torch'] + tot['torch_by_design']}",
                    res["eager_rule_torch"], f"{res['err_vs_torch']:.1e}"])
    env = result["env"]
    print(f"\n{env['date']} {env['gpu']} driver {env['driver']} Triton {env['triton']} torch {env['torch']}, "
          f"{result['dtype']}, ms per call")
    print(table(out, ["row", "torch eager", "serve eager", "torch/serve", "torch graph", "serve graph",
                      "torch/serve", "served cert/default/torch", "eager rule->torch", "err vs torch"]))
    for name, res in result["rows"].items():
        print(f"{name}: fused {', '.join(f'{k} {v}' for k, v in res['fused'].items()) or 'nothing'}")
    print(f"goal (serve eager >= torch eager on every row): {'met' if ok else 'NOT met'}")
    result["goal_met"], result["seconds"] = ok, time.time() - t_start
    print(f"wrote {save('eager_models.json', result)} in {result['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
