"""A real model on the certified kernels: transformers' Llama with Llama-2-7B's dimensions
(a few layers, random weights, nothing downloaded), prefill and one decode step with a
static KV cache, under torch and under `nbx_tune.serve()`, eager and in CUDA graphs.

    python3 bench/serve_models.py                 # H200: 2 layers, prefill of 512, bf16
    python3 bench/serve_models.py --smoke         # CPU interpreter, a tiny Llama, fp32, eager only

Prints one row per variant: wall time per call (ms, the host's launch path included, which
is what eager serving costs), torch's time over it (>= 1: serve is as fast), and each
variant's logits against an fp32 torch run of the same weights (max|out - ref| / max|ref|),
beside torch's own bf16 error, so serve's error reads against what bf16 costs anyway. Then
what serve ran: per op, launches on certified configs, on defaults, and on torch, with why.
Writes serve_models.json under $OUT (else bench_out/).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import environment, save, table  # noqa: E402


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


def graphed(fn, serve_on: bool):
    """fn captured in a CUDA graph (warmed up first on a side stream, as torch advises):
    a callable replaying it and returning its output tensor."""
    import nbx_tune

    ctx = nbx_tune.serve if serve_on else _nothing
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


def wall_ms(fn, reps: int, sync) -> float:
    sync()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - t) / reps * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--reps", type=int, default=20, help="calls per timing round (4 turned rounds)")
    p.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny model, eager only")
    args = p.parse_args()

    import nbx_tune
    from nbx_tune.kernels import serve as serving

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
        from nbx_tune.tuner.recorder import Recorder

        for phase in ("prefill", "decode"):
            with Recorder() as rec:
                getattr(run, phase)()
            launches = {}
            for row in rec.rows:
                launches[row.op] = launches.get(row.op, 0) + row.count
            result.setdefault("launches", {})[phase] = launches
        fns = {}
        fns["torch eager"] = {"prefill": run.prefill, "decode": run.decode}
        # serve eager: the first calls compile the kernels; the stats are one call of each.
        with nbx_tune.serve():
            run.prefill()
            run.decode()
            serving.reset_stats()
            run.prefill()
            result["stats"]["prefill"] = serving.stats()
            serving.reset_stats()
            run.decode()
            result["stats"]["decode"] = serving.stats()

        fns["serve eager"] = {"prefill": run.prefill, "decode": run.decode}
        # serve() is entered around a whole timing loop, never around one call: entering
        # installs its overrides (about 1 ms), a cost of a program's start, not of a launch.
        ctxs = {name: nbx_tune.serve if name == "serve eager" else _nothing for name in
                ("torch eager", "serve eager", "torch graph", "serve graph")}
        if device == "cuda":
            for name, on in (("torch graph", False), ("serve graph", True)):
                fns[name] = {}
                for phase in ("prefill", "decode"):
                    try:
                        fns[name][phase] = graphed(getattr(run, phase), on)
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
                        times[n].append(wall_ms(fns[n][phase], reps, sync))
            for n, v in times.items():
                result["variants"][n][f"{phase}_ms"] = sorted(v)[len(v) // 2]

    v = result["variants"]
    rows = []
    for name, d in v.items():
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
        tot = {k: sum(s[k] for s in st.values()) for k in ("certified", "default", "torch")}
        launches = result["launches"][phase]
        uncovered = {op: n for op, n in launches.items() if op not in serving.routes()}
        print(f"\nserve, one {phase} ({sum(launches.values())} launches): {tot['certified']} certified, "
              f"{tot['default']} default, {tot['torch']} fell through to torch, "
              f"{sum(uncovered.values())} of ops no kernel covers: "
              + (", ".join(f"{op} {n}" for op, n in sorted(uncovered.items(), key=lambda kv: -kv[1]))
                 or "none"))
        print(serving.format_stats(st))
    result["seconds"] = time.time() - t_start
    print(f"\nwrote {save('serve_models.json', result)} in {result['seconds']:.0f} s")


if __name__ == "__main__":
    main()
