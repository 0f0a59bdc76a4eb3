"""Study: serve() eager on decode steps whose KV cache grows, as generation runs them.

bench/serve_models.py times one decode step again and again on the same cache (its tensors
put back after each step), so every call replays. In generation the cache grows by a token
a step: the KV-cache cats and attention see a new length every step, so their direct-launch
key (kernels/runtime/launch.py) is new: the ordinary path, and a record (replay source generated
and compiled, several times an ordinary call's cost) whose replay serves only the other
layers' calls of that step, then never again. This counts, per step, the records made and
refused and the launches on the ordinary path, and times the steps against torch
(launches mocked on the CPU, as in cpu_overhead.py; real kernels with --gpu):

    python3 lab/serve_eager_profile/growing_cache.py            # the CPU, a small Llama, mocked launches
    python3 lab/serve_eager_profile/growing_cache.py --gpu      # the H200: Llama-2-7B's dims, 2 layers
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections import Counter
from pathlib import Path

GPU = "--gpu" in sys.argv
if not GPU:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

HERE = Path(__file__).resolve().parent


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--gpu", action="store_true")
    for name, default in (("steps", 24), ("seq", 16), ("layers", 2)):  # decode steps, prompt, layers
        p.add_argument(f"--{name}", type=int, default=default)
    args = p.parse_args()
    logging.getLogger("nbx_tune").setLevel(logging.ERROR)
    import nbx_tune
    from nbx_tune.kernels.runtime import certified, launch
    from nbx_tune.bench.serve_models import build

    if not GPU:
        from cpu_overhead import MockTriton, lean_launcher

        torch.set_num_threads(1)
        launch.through_triton, launch._lean_launcher = MockTriton(), lean_launcher
        resolve = certified._resolve
        certified._resolve = lambda *a: (resolve(*a)[0], None)
        certified.reload()
    device, dtype = ("cuda", torch.bfloat16) if GPU else ("cpu", torch.float32)
    args.smoke = not GPU
    cfg, model = build(args, dtype, device)
    import inspect

    from transformers import DynamicCache

    kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    sync = torch.cuda.synchronize if GPU else (lambda: None)
    ids = torch.randint(0, cfg.vocab_size, (1, args.seq), device=device)
    tok = ids[:, -1:].clone()

    through, full = launch.through_triton, Counter()

    def counted(kernel, grid, a, kw_):  # a launch on the ordinary path (not a replay)
        full[getattr(kernel, "fn", kernel).__name__] += 1
        return through(kernel, grid, a, kw_)

    launch.through_triton = counted

    def run(grow: bool) -> list[tuple[float, int, int]]:
        cache = DynamicCache(config=cfg)
        model(input_ids=ids, use_cache=True, **{kw: cache})
        kept = [(layer.keys, layer.values) for layer in cache.layers]
        out = []
        for _ in range(args.steps):
            before, refused = len(launch.REMEMBERED), sum(launch.REFUSED.values())
            sync()
            t = time.perf_counter()
            model(input_ids=tok, use_cache=True, **{kw: cache})
            sync()
            ms = (time.perf_counter() - t) * 1e3
            if not grow:  # the bench's step: the cache put back
                for layer, (k, v) in zip(cache.layers, kept):
                    layer.keys, layer.values = k, v
            out.append((ms, len(launch.REMEMBERED) - before, sum(launch.REFUSED.values()) - refused))
        return out

    with torch.inference_mode():
        for grow in (False, True):
            launch.forget()
            full.clear()
            with nbx_tune.serve():
                steps = run(grow)
            torch_steps = run(grow)  # torch alone (no serve): no records
            late = steps[len(steps) // 2:]
            ms = sorted(s[0] for s in late)[len(late) // 2]
            tms = sorted(s[0] for s in torch_steps[len(late):])[len(late) // 2]
            recs = sum(s[1] for s in late) / len(late)
            refs = sum(s[2] for s in late) / len(late)
            print(f"{'growing cache' if grow else 'fixed cache (the bench)':<24} serve {ms:7.2f} ms/step, "
                  f"torch {tms:7.2f} ms/step; per step: {recs:.1f} new replays, {refs:.1f} records refused; "
                  f"replays held {len(launch.REMEMBERED)}")
            print(f"  ordinary-path launches per step: "
                  f"{ {k: round(v / args.steps, 1) for k, v in sorted(full.items())} }")


if __name__ == "__main__":
    main()
