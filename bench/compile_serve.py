"""nbx-tune inside torch.compile: compiled models with and without the certified kernels as
graph nodes (kernels/serving/compiled_ops.py), side by side, eager and in CUDA graphs.

    python3 bench/compile_serve.py                               # GPU, bf16, every model, prefill 512
    python3 bench/compile_serve.py --models llama,qwen2 --budget-s 520
    python3 bench/compile_serve.py --smoke                       # CPU interpreter, tiny models, fp32

Models: transformers' decoders at real dimensions with 2 layers, random weights, nothing
downloaded: Llama (Llama-2-7B's dims), GPT-2 (gpt2-medium's), Qwen2 (7B's: 28 heads, 4 key/value,
a 152k vocabulary), Mistral (7B's: GQA 32/8) and Phi-3 (mini's: fused qkv and gate/up). Each
model's prefill is traced and certified first (`nbx-tune census` in a child process, under
--census-budget-s; --no-census serves what the database and the shipped table hold).

Variants, each a prefill of one sequence:
- torch eager;
- compile default (torch.compile, Inductor's default mode);
- compile max-autotune (Inductor's "max-autotune-no-cudagraphs": its GEMM templates timed at
  compile time; --no-max-autotune leaves it out, it costs minutes per model);
- compile + nbx-tune (`nbx_tune.compiled(model)`: default mode, GEMM and attention nodes on
  the certified kernels where a seat is certified and torch is not faster);
- compile + nbx table (max-autotune with Inductor's certified template choices, read from the
  database (NBX_TUNE_DB) and NBX_TUNE_INDUCTOR_TABLE's tables, kernels/serving/inductor_table.py;
  only where some choice holds here);
- serve(compile) (torch.compile(model) first called inside `nbx_tune.serve()`, timed inside it).
Each is timed as eager calls (wall time per call, the host's launch path included) and, on a
GPU, replayed from a CUDA graph captured around one call. Printed per model: compile seconds
(the first call, Inductor's caches off), eager and graph ms, compile default's time over each
(>= 1: as fast as compile default or faster), the logits' error against an fp32 torch run of
the same weights beside torch bf16's own, and how many compiled nodes ran certified kernels.
Writes compile_serve_<models>.json under $OUT (else bench_out/).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch  # noqa: E402

from nbx_tune.testing.bench import environment, out_dir, per_call_ms, save, table  # noqa: E402

def _decoder(cfg: str, model: str, real: tuple, tiny: tuple, **extra) -> tuple:
    """A Llama-style decoder's entry: (hidden, heads, key/value heads, intermediate, vocab) at
    its real dims and tiny ones for --smoke."""
    names = ("hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size")
    return cfg, model, dict(zip(names, real)), {**dict(zip(names, tiny)), **extra}


# name -> (transformers config class, model class, real dims, tiny dims for --smoke)
MODELS = {
    "llama": _decoder("LlamaConfig", "LlamaForCausalLM", (4096, 32, 32, 11008, 32000), (64, 4, 2, 172, 320)),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_embd=1024, n_head=16, vocab_size=50257, n_positions=1024),
             dict(n_embd=64, n_head=4, vocab_size=320, n_positions=128)),
    "qwen2": _decoder("Qwen2Config", "Qwen2ForCausalLM", (3584, 28, 4, 18944, 152064), (64, 4, 2, 176, 320)),
    "mistral": _decoder("MistralConfig", "MistralForCausalLM", (4096, 32, 8, 14336, 32000), (64, 4, 2, 160, 320)),
    "phi3": _decoder("Phi3Config", "Phi3ForCausalLM", (3072, 32, 32, 8192, 32064), (64, 4, 4, 128, 320),
                     pad_token_id=0, bos_token_id=1, eos_token_id=2),  # its defaults lie past a tiny vocabulary
}


def build(name: str, smoke: bool, layers: int, dtype, device):
    import transformers

    cfg_cls, model_cls, real, tiny = MODELS[name]
    dims = dict(tiny if smoke else real)
    dims["n_layer" if name == "gpt2" else "num_hidden_layers"] = layers
    if name != "gpt2":
        dims["max_position_embeddings"] = 128 if smoke else 4096
    cfg = getattr(transformers, cfg_cls)(**dims, attn_implementation="sdpa")
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # as from_pretrained(dtype=...): rotary buffers stay fp32
    try:
        with torch.device(device):
            model = getattr(transformers, model_cls)(cfg).eval()
    finally:
        torch.set_default_dtype(default)
    return cfg, model


def variants(model, args, table_on: bool) -> dict:
    """name -> (the callable model, the context it runs in)."""
    import nbx_tune
    from nbx_tune.bench.serve_models import _nothing
    from nbx_tune.kernels.serving import inductor_table

    v = {"torch eager": (model, _nothing),
         "compile default": (torch.compile(model, dynamic=False), _nothing)}
    if args.max_autotune:
        v["compile max-autotune"] = (torch.compile(model, mode="max-autotune-no-cudagraphs", dynamic=False), _nothing)
    v["compile + nbx-tune"] = (nbx_tune.compiled(model, dynamic=False), _nothing)
    if table_on:
        v["compile + nbx table"] = (nbx_tune.compiled(model, mode="max-autotune-no-cudagraphs", dynamic=False),
                                    inductor_table.choices)
    v["serve(compile)"] = (torch.compile(model, dynamic=False), nbx_tune.serve)
    return v


def run_model(name: str, args, device, dtype, sync) -> dict:
    import nbx_tune
    from nbx_tune.bench.serve_models import graphed, rel_err, run_census
    from nbx_tune.kernels.runtime import certified
    from nbx_tune.kernels.serving import compiled_ops, inductor_table
    from nbx_tune.tuner.trace.recorder import record

    seq = 24 if args.smoke else args.seq
    reps = 2 if args.smoke else args.reps
    cfg, model = build(name, args.smoke, args.layers, dtype, device)
    torch.manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (1, seq), device=device)
    res = {"seq": seq, "layers": args.layers, "variants": {}}
    with torch.inference_mode():
        ref_model = build(name, args.smoke, args.layers, torch.float32, device)[1]
        ref_model.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
        ref = ref_model(input_ids=ids, use_cache=False).logits.float()
        del ref_model
        if not args.no_census:
            trace = out_dir() / f"compile_serve_{name}.tsv"
            with record(trace):
                model(input_ids=ids, use_cache=False)
            res["census"] = run_census(trace, args.census_budget_s)
            certified.reload()
        table_on = bool(inductor_table.current_table()[0])  # choices that hold here: the database's or a table's
        fns = {}
        for vname, (fn, ctx) in variants(model, args, table_on).items():
            call = lambda fn=fn: fn(input_ids=ids, use_cache=False).logits  # noqa: E731
            compiled_ops.reset_stats()
            t0 = time.perf_counter()
            try:
                with ctx():
                    out = call()
                    sync()
            except Exception as e:  # a variant that fails is a result, not a crash
                res["variants"][vname] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
                continue
            d = res["variants"][vname] = {"compile_s": time.perf_counter() - t0, "err": rel_err(out, ref)}
            st = compiled_ops.stats()
            d["certified_nodes"] = sum(1 for s in st.values() if s["certified"])
            d["torch_nodes"] = sum(1 for s in st.values() if s["torch"])
            fns[(vname, "eager")] = (call, ctx)
            if device == "cuda":
                try:
                    fns[(vname, "graph")] = (graphed(call, ctx), ctx)
                except Exception as e:
                    d["graph_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                    torch.cuda.synchronize()
        times = {k: [] for k in fns}
        keys = list(times)
        for rnd in range(1 if args.smoke else 4):  # turned rounds: clock drift reaches every variant alike
            k = rnd % len(keys)
            for key in keys[k:] + keys[:k]:
                fn, ctx = fns[key]
                with ctx():
                    times[key].append(per_call_ms(fn, reps, sync))
        for (vname, how), v in times.items():
            res["variants"][vname][f"{how}_ms"] = sorted(v)[len(v) // 2]
    res["stats"] = nbx_tune.compiled_stats()
    return res


def ratio(base, x) -> str:
    return f"{base / x:.2f}" if base and x else "-"


def report(results: dict) -> None:
    header = ["model", "variant", "compile s", "eager ms", "default/eager", "graph ms", "default/graph",
              "err", "certified nodes"]
    rows = []
    for model, res in results.items():
        base = res["variants"].get("compile default", {})
        for vname, d in res["variants"].items():
            if "error" in d:
                rows.append([model, vname, "failed: " + d["error"][:60], "", "", "", "", "", ""])
                continue
            rows.append([model, vname, f"{d['compile_s']:.1f}", f"{d.get('eager_ms', 0):.3f}",
                         ratio(base.get("eager_ms"), d.get("eager_ms")),
                         f"{d['graph_ms']:.3f}" if "graph_ms" in d else "-",
                         ratio(base.get("graph_ms"), d.get("graph_ms")), f"{d['err']:.2e}",
                         d["certified_nodes"]])
    print(table(rows, header))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--reps", type=int, default=20, help="calls per timing round (4 turned rounds)")
    p.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny models, fp32, no graphs")
    p.add_argument("--no-census", action="store_true", help="serve what the database and shipped table hold")
    p.add_argument("--census-budget-s", type=float, default=90, help="stop each model's census after this long")
    p.add_argument("--no-max-autotune", dest="max_autotune", action="store_false",
                   help="leave out Inductor's max-autotune (minutes of compile per model)")
    p.add_argument("--budget-s", type=float, default=1e9, help="start no model after this many seconds")
    args = p.parse_args(argv)
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        p.error(f"unknown model {unknown[0]}: one of {', '.join(MODELS)}")
    if args.smoke:
        args.max_autotune = False  # Inductor's GEMM templates are GPU-only
        if not os.environ.get("NBX_TUNE_DB"):  # keep the user's database clean
            os.environ["NBX_TUNE_DB"] = "sqlite:///" + os.path.join(tempfile.mkdtemp(prefix="nbx-cs-"), "s.db")
    import torch._inductor.config as ic

    ic.fx_graph_cache = False  # compile times are compiles, not cache reads
    device = "cpu" if args.smoke else "cuda"
    dtype = torch.float32 if args.smoke else torch.bfloat16
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    t0 = time.time()
    results = {}
    for name in names:
        if time.time() - t0 > args.budget_s:
            print(f"{name}: not started, past --budget-s {args.budget_s:.0f}")
            continue
        torch._dynamo.reset()
        results[name] = run_model(name, args, device, dtype, sync)
        report({name: results[name]})  # now, in case a time limit stops the run before the end
        save(f"compile_serve_{'_'.join(names)}.json", {"env": environment(), "models": results})
    env = environment()
    print(f"{env['date']} {env['gpu']} driver {env['driver']} Triton {env['triton']} torch {env['torch']}")
    report(results)
    return results


if __name__ == "__main__":
    main()
