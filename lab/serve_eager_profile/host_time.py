"""Study: where serve()'s eager host time goes on a decode step and a prefill.

serve() eager ran a Llama-2-7B-shaped decode step at 0.50 of torch (4.2 ms against 2.1,
docs/benchmarks.md): about 21 us more per launch, where bench/launch_overhead.py puts a
certified call 0-9 us over Triton's compiled-kernel floor. This finds the rest: it counts
the launches that left the replay (Triton's full path) per kernel, the records refused
and why, and profiles the steps with cProfile (our modules and the top of the rest).

    python3 lab/serve_eager_profile/host_time.py            # the H200, 2 layers, bf16
    TRITON_INTERPRET=1 python3 lab/serve_eager_profile/host_time.py --smoke
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
from collections import Counter
from pathlib import Path

if "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
from nbx_tune.testing.bench import environment, out_dir  # noqa: E402
from nbx_tune.bench.serve_models import Runner, build  # noqa: E402


class OpTimes:
    """Host microseconds spent in each aten op a step calls (a TorchDispatchMode: the time from
    the mode to the op's return, served or not; the mode's own cost is on both sides alike)."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        totals, counts = Counter(), Counter()

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                t = time.perf_counter()
                out = func(*args, **(kwargs or {}))
                totals[str(func)] += time.perf_counter() - t
                counts[str(func)] += 1
                return out

        self.mode, self.totals, self.counts = Mode(), totals, counts


def op_table(torch_ops: OpTimes, serve_ops: OpTimes, steps: int) -> str:
    rows = []
    for op in sorted(set(torch_ops.counts) | set(serve_ops.counts),
                     key=lambda o: -serve_ops.totals.get(o, 0)):
        n = serve_ops.counts.get(op, 0) or torch_ops.counts.get(op, 0)
        tu = torch_ops.totals.get(op, 0) / max(torch_ops.counts.get(op, 0), 1) * 1e6
        su = serve_ops.totals.get(op, 0) / max(serve_ops.counts.get(op, 0), 1) * 1e6
        rows.append(f"{op:<44} {n / steps:>6.1f} {tu:>9.1f} {su:>9.1f} {(su - tu) * n / steps:>10.1f}")
    tt = sum(torch_ops.totals.values()) / steps * 1e3
    st = sum(serve_ops.totals.values()) / steps * 1e3
    return (f"{'aten op':<44} {'/step':>6} {'torch us':>9} {'serve us':>9} {'extra us/step':>10}\n"
            + "\n".join(rows) + f"\nin ops: torch {tt:.3f} ms/step, serve {st:.3f} ms/step\n")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    import nbx_tune
    from nbx_tune.kernels.runtime import launch

    device = "cpu" if args.smoke else "cuda"
    dtype = torch.float32 if args.smoke else torch.bfloat16
    seq = 8 if args.smoke else args.seq
    cfg, model = build(args, dtype, device)
    ids = torch.randint(0, cfg.vocab_size, (1, seq), device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    r = Runner(cfg, model, ids, seq)
    full_path = Counter()
    through = launch.through_triton

    def counted(kernel, grid, a, kw):
        full_path[getattr(kernel, "fn", kernel).__name__] += 1
        return through(kernel, grid, a, kw)

    out = io.StringIO()
    with torch.inference_mode():
        r.fill()
        for phase, fn in (("decode", r.decode), ("prefill", r.prefill)):
            for _ in range(3):
                fn()
            sync()
            t = time.perf_counter()
            for _ in range(args.steps):
                fn()
            sync()
            torch_ms = (time.perf_counter() - t) / args.steps * 1e3
            with nbx_tune.serve():
                for _ in range(3):
                    fn()
                sync()
                launch.through_triton = counted
                full_path.clear()
                launch.REFUSED.clear()
                t = time.perf_counter()
                for _ in range(args.steps):
                    fn()
                sync()
                serve_ms = (time.perf_counter() - t) / args.steps * 1e3
                launch.through_triton = through
                pr = cProfile.Profile()
                pr.enable()
                for _ in range(args.steps):
                    fn()
                sync()
                pr.disable()
                st = nbx_tune.serve_stats() if hasattr(nbx_tune, "serve_stats") else {}
                serve_ops = OpTimes()
                with serve_ops.mode:
                    for _ in range(args.steps):
                        fn()
                sync()
            torch_ops = OpTimes()
            with torch_ops.mode:
                for _ in range(args.steps):
                    fn()
            sync()
            launches = sum(s["certified"] + s["default"] for s in st.values()) if st else 0
            head = (f"== {phase}: torch {torch_ms:.3f} ms, serve {serve_ms:.3f} ms "
                    f"(torch/serve {torch_ms / serve_ms:.2f})\n"
                    f"full-path launches per step: {dict((k, v / args.steps) for k, v in full_path.items())}\n"
                    f"records refused: {dict(launch.REFUSED)}\n")
            ops = op_table(torch_ops, serve_ops, args.steps)
            print(head + ops)
            out.write(head + ops)
            for key in ("tottime", "cumulative"):
                s = io.StringIO()
                pstats.Stats(pr, stream=s).sort_stats(key).print_stats(45)
                out.write(s.getvalue())
            s = io.StringIO()
            pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats("nbx_tune|main/kernels", 40)
            out.write(s.getvalue())
            print(s.getvalue()[-6000:])
    path = out_dir() / "serve_eager_profile.txt"
    path.write_text(str(environment()) + "\n" + out.getvalue())
    print("wrote", path)


if __name__ == "__main__":
    main()
