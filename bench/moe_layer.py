"""A mixture-of-experts layer on the grouped expert GEMM (`nbx_tune.moe_experts`) against
torch, side by side in one run, bf16: transformers' own MoE blocks with random weights
(nothing downloaded) at three layers' sizes:

    mixtral    Mixtral-8x7B: 8 experts, top-2, hidden 4096, intermediate 14336
    qwen2_moe  Qwen1.5/Qwen2-MoE-A2.7B: 60 experts, top-4, hidden 2048, intermediate 1408,
               a shared expert of 5632 with its sigmoid gate
    deepseek   DeepSeek-V2-Lite-style fine-grained experts: 64 experts, top-6, hidden 2048,
               intermediate 1408, a shared expert of 2816 (Qwen2-MoE's block at those sizes:
               softmax top-k routing, as DeepSeek-V2-Lite routes)

at decode (1-64 tokens) and prefill (512-4096 tokens). Per case, ms per call:
  block torch gmm   the block as transformers runs it by default (experts through
                    torch._grouped_mm), replayed from a CUDA graph;
  block serve       the block under nbx_tune.serve() (the experts fused into one op, the router
                    and the shared expert on served kernels), from a CUDA graph;
  experts gmm / op  the routed experts alone: transformers' grouped_mm forward against
                    nbx_tune.moe_experts on the same routing, from CUDA graphs;
  block loop        transformers' expert loop ("eager": a host sync a layer, so no graph),
                    eager, beside serve() eager;
and the ratios (torch / nbx: >= 1 is nbx as fast), and the op's and torch's bf16 error
against the fp32 experts on the same weights.

    python bench/moe_layer.py --census-only    # record the layers' expert seats, census them into
                                               # NBX_TUNE_DB (else bench_out/moe_layer.db)
    python bench/moe_layer.py --no-census      # time on what that database holds
    python bench/moe_layer.py                  # both in one run
    python bench/moe_layer.py --smoke          # CPU interpreter, tiny layers, fp32, eager

--layers and --tokens pick cases (comma lists). Writes moe_layer.json under $OUT (else
bench_out/), and the census's database there too when it made one.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

LAYERS = {  # name: (experts, top-k, hidden, intermediate, shared expert's intermediate or 0)
    "mixtral": (8, 2, 4096, 14336, 0),
    "qwen2_moe": (60, 4, 2048, 1408, 5632),
    "deepseek": (64, 6, 2048, 1408, 2816),
}
SMOKE_LAYERS = {"mixtral": (4, 2, 32, 24, 0), "qwen2_moe": (6, 3, 40, 16, 24)}
TOKENS = (1, 16, 64, 512, 4096)
SMOKE_TOKENS = (1, 19)
EAGER_CALLS = 8  # eager calls a timing round (the loop's prefill takes tens of ms a call)


def block(transformers, torch, name, dims, impl, dtype, device):
    """transformers' MoE block of a layer's sizes, its experts' weights drawn like a trained
    layer's scale (std 1/sqrt(fan-in)), the router's small (near-uniform routing)."""
    E, K, H, I, shared = dims
    torch.manual_seed(0)
    if shared:
        from transformers.models.qwen2_moe import modeling_qwen2_moe as m

        cfg = transformers.Qwen2MoeConfig(hidden_size=H, moe_intermediate_size=I, num_experts=E, num_experts_per_tok=K,
                                          shared_expert_intermediate_size=shared, norm_topk_prob=name == "deepseek")
        cls = m.Qwen2MoeSparseMoeBlock
    else:
        from transformers.models.mixtral import modeling_mixtral as m

        cfg = transformers.MixtralConfig(hidden_size=H, intermediate_size=I, num_local_experts=E,
                                         num_experts_per_tok=K)
        cls = m.MixtralSparseMoeBlock
    cfg._experts_implementation = impl
    with torch.device(device):
        b = cls(cfg).to(dtype).eval()
    with torch.no_grad():
        for pname, p in b.named_parameters():
            fan_in = p.shape[-1]
            p.normal_(0.0, 0.02 if pname.endswith("gate.weight") else fan_in ** -0.5)
    return b


def seat_rows(layers, tokens, dtype):
    """The experts' trace rows the blocks make: a row per (layer, tokens)."""
    from nbx_tune.kernels.moe import moe_row

    rows = []
    for name, (E, K, H, I, shared) in layers.items():
        routing = "float32" if not shared else dtype  # Mixtral's router keeps fp32 weights, Qwen2-MoE's casts
        rows += [moe_row(E, K, H, I, T, dtype, routing) for T in tokens]
    return rows


def census(layers, tokens, dtype, smoke: bool, budget_s: float) -> dict:
    from nbx_tune.bench.serve_models import run_census
    from nbx_tune.kernels.runtime import certified
    from nbx_tune.kernels.trace import write_trace
    from nbx_tune.testing.bench import out_dir

    trace = out_dir() / "moe_layer_trace.tsv"
    write_trace(trace, seat_rows(layers, tokens, dtype), ["bench/moe_layer.py: the routed experts' seats"])
    result = run_census(trace, budget_s)
    certified.reload()
    return result


def rel_err(out, ref) -> float:
    out, ref = out.double(), ref.double()
    return ((out - ref).abs().max() / ref.abs().max()).item()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny layers, fp32, eager only")
    p.add_argument("--census-only", action="store_true", help="record and census the seats, time nothing")
    p.add_argument("--no-census", action="store_true", help="time on what the database holds")
    p.add_argument("--census-budget-s", type=float, default=420)
    p.add_argument("--layers", default=None, help="comma list of " + ", ".join(LAYERS))
    p.add_argument("--tokens", default=None, help="comma list of token counts")
    p.add_argument("--rep-ms", type=float, default=150)
    args = p.parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    from nbx_tune.testing.bench import environment, out_dir, save, table

    table_of = SMOKE_LAYERS if args.smoke else LAYERS
    names = args.layers.split(",") if args.layers else list(table_of)
    bad = [n for n in names if n not in table_of]
    if bad:
        print(f"moe_layer: unknown layer {', '.join(bad)} (one of {', '.join(table_of)})", file=sys.stderr)
        return 2
    layers = {n: table_of[n] for n in names}
    tokens = tuple(int(t) for t in args.tokens.split(",")) if args.tokens else (SMOKE_TOKENS if args.smoke else TOKENS)
    if not os.environ.get("NBX_TUNE_DB"):
        where = Path(tempfile.mkdtemp(prefix="nbx-moe-smoke-")) if args.smoke else out_dir()
        os.environ["NBX_TUNE_DB"] = f"sqlite:///{where / 'moe_layer.db'}"

    import torch

    dtype = torch.float32 if args.smoke else torch.bfloat16
    dt_name = str(dtype).removeprefix("torch.")
    result = {"env": environment(), "dtype": dt_name, "db": os.environ["NBX_TUNE_DB"], "cases": {}}
    if not args.no_census:
        result["census"] = census(layers, tokens, dt_name, args.smoke, args.census_budget_s)
        if args.census_only:
            save("moe_layer.json", result)
            return 0
    result["cases"], rows = time_cases(torch, layers, tokens, dtype, args)
    env = result["env"]
    from nbx_tune.kernels.runtime import certified

    result["misses"] = certified.launch_stats()["misses"]
    save("moe_layer.json", result)
    print(f"{env['date']} {env['gpu']} driver {env['driver']} Triton {env['triton']} torch {env['torch']}")
    print(table(rows, [f"layer ({dt_name})", "tokens", "block gmm ms", "block serve ms", "x", "experts gmm ms",
                       "op ms", "x", "block loop eager ms", "serve eager ms", "x", "op err", "torch err"]))
    misses = {k: v for k, v in result["misses"].items() if k.startswith("moe_experts")}
    if misses and not args.smoke:
        print(f"expert seats served uncertified: {misses}")
    return 0


def time_cases(torch, layers, tokens, dtype, args):
    import transformers
    from transformers.integrations import moe as tmoe

    import nbx_tune
    from nbx_tune.kernels import moe_experts
    from nbx_tune.tuner.timing.torch_baselines import graph_times
    from nbx_tune.testing.bench import per_call_ms, side_by_side, wall_ms

    device = "cpu" if args.smoke else "cuda"
    rep = 1 if args.smoke else args.rep_ms
    if args.smoke:
        eager_timer = wall_ms
    else:  # calls back to back, synchronized at the ends: the host's launch path included
        def eager_timer(fn, rep_ms):
            fn()
            return per_call_ms(fn, EAGER_CALLS, torch.cuda.synchronize)
    cases, rows = {}, []
    for name, dims in layers.items():
        gmm = block(transformers, torch, name, dims, "grouped_mm", dtype, device)
        loop = block(transformers, torch, name, dims, "eager", dtype, device)
        experts = gmm.experts
        ref32 = block(transformers, torch, name, dims, "grouped_mm", torch.float32, device).experts
        ref32.load_state_dict({k: v.float() for k, v in experts.state_dict().items()})
        for T in tokens:
            x = torch.randn(1, T, dims[2], device=device, dtype=dtype)
            with torch.inference_mode():
                h = x.view(T, -1)
                _, weights, ids = gmm.gate(h)
                op = lambda: moe_experts(h, experts.gate_up_proj, experts.down_proj, ids, weights)  # noqa: E731
                torch_experts = lambda: tmoe.grouped_mm_experts_forward(experts, h, ids, weights)  # noqa: E731
                want = tmoe.grouped_mm_experts_forward(ref32, h.float(), ids, weights.float())
                err = {"op": rel_err(op(), want), "torch": rel_err(torch_experts(), want)}
                t = graphed_times(nbx_tune, graph_times, gmm, x, torch_experts, op, rep, device)
                # serve() entered once around its calls (entering it installs the overrides): the
                # two sides in their own rounds, not alternated
                eager = side_by_side({"loop": lambda: loop(x)}, rep, timer=eager_timer)
                with nbx_tune.serve():
                    eager.update(side_by_side({"serve": lambda: loop(x)}, rep, timer=eager_timer))
            cases[f"{name} T={T}"] = {"ms": t, "eager_ms": eager, "err": err, "dims": dims}
            rows.append([name, T, f"{t['gmm']:.3f}", f"{t['serve']:.3f}", f"{t['gmm'] / t['serve']:.2f}",
                         f"{t['experts_gmm']:.3f}", f"{t['op']:.3f}", f"{t['experts_gmm'] / t['op']:.2f}",
                         f"{eager['loop']:.3f}", f"{eager['serve']:.3f}", f"{eager['loop'] / eager['serve']:.2f}",
                         f"{err['op']:.1e}", f"{err['torch']:.1e}"])
        del gmm, loop, experts, ref32
    return cases, rows


def graphed_times(nbx_tune, graph_times, gmm, x, torch_experts, op, rep, device):
    """ms per call from CUDA-graph replay, in alternating rounds: the block as torch runs it
    and under serve() (captured inside the context), the experts alone both ways. On the
    CPU (--smoke) one call of each, wall clock."""
    kw = {"calls": 1, "device": "cpu"} if device == "cpu" else {}
    with nbx_tune.serve():
        graph = graph_times({"serve": lambda i: gmm(x)}, rep, **kw)  # captured and replayed under serve()
    other = graph_times({"gmm": lambda i: gmm(x), "experts_gmm": lambda i: torch_experts(), "op": lambda i: op()},
                        rep, **kw)
    return {**graph, **other}


if __name__ == "__main__":
    sys.exit(main())
