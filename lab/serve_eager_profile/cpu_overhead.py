"""Study: serve()'s host time per aten op, on the CPU, with every launch mocked.

Under TRITON_INTERPRET=1 a kernel runs in Python for milliseconds, so the final launch is
replaced by a no-op: `launch.through_triton` hands out a fake compiled kernel whose launcher
does nothing, and every seat reads as certified (the replays count no miss, as on the
H200 after a census). What is left is the host path alone. Per op (a Llama decode step's
patterns at small widths), median microseconds per call of

    torch     torch's own op, no serve() (a real CPU kernel on a few hundred elements: a reference)
    serve     the same torch call under nbx_tune.serve() (dispatcher -> override -> replay)
    direct    the front function called directly (nbx_tune.kernels.mul(...)), the replay
    floor     a torch.library override of the op that returns a ready tensor: the
              dispatcher's Python-kernel boundary with nothing behind it
    launch    the replay's mocked launch alone (the no-op launcher with the replay's arguments)

serve - direct is what the serve route adds over the front function; serve - floor is
what our Python costs behind the boundary (the route and the replay).

    python3 lab/serve_eager_profile/cpu_overhead.py [--calls 100] [--rounds 41] [--json out.json]

It needs no GPU (run on the GPU machine, it measures that host's CPU); the JSON goes to
$OUT (or bench_out/) unless --json names a file.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch  # noqa: E402


class _Compiled:
    """A compiled kernel whose launcher does nothing. A replay reaches it as on the GPU
    (kernels/runtime/launch.py's lean path: Triton's launch-hook check, then `run(grid, stream,
    function, metadata, ..., *arguments)`); only the C launch itself is missing."""

    function, packed_metadata = "function", "metadata"

    def __init__(self, sink):
        self.sink = sink

    def run(self, g0, g1, g2, stream, function, metadata, launch_metadata, enter, exit_, *args):
        if self.sink is not None:
            self.sink.append(args)

    def __getitem__(self, grid):
        return lambda *args: self.run(*grid, None, None, None, None, None, None, *args)


class MockTriton:
    """launch.through_triton: no kernel runs; the replay's launcher is a no-op."""

    def __init__(self):
        self.record: list | None = None

    def __call__(self, kernel, grid, args, kwargs):
        return _Compiled(self)

    def append(self, args):  # a replay's launch, while recording its arguments
        if self.record is not None:
            self.record.append(args)


def lean_launcher(compiled):
    """launch._lean_launcher for the mock: Triton's own launch hooks, a stream getter and
    the current device, as the GPU's replay reads them."""
    from triton import knobs

    return (compiled.run, compiled.function, compiled.packed_metadata, knobs.runtime,
            lambda device: 0, lambda: 0)


def cases():
    """(name, torch call, direct call): the patterns of a Llama decode step, at hidden 256,
    4 heads of 64 (the launch is mocked: widths change nothing but torch's own column). The
    front functions are bound here: `nbx_tune.kernels.mul` resolves lazily on each lookup."""
    from nbx_tune.kernels import copy, elementwise as K, matmul, reduce

    r = torch.randn
    h, hd = 256, 64
    x, y, w = r(1, 1, h), r(1, 1, h), r(h)
    var = r(1, 1, 1).abs()
    q = r(1, 4, 1, hd)
    x1, x2 = q[..., : hd // 2], q[..., hd // 2:]  # rotate_half's strided halves
    nx2 = -x2
    wl = r(h, h)
    x2d = x.view(1, h)
    return [
        ("mul x*y", lambda: torch.mul(x, y), lambda: K.mul(x, y)),
        ("mul w*x (broadcast)", lambda: torch.mul(w, x), lambda: K.mul(w, x)),
        ("mul x*0.5 (scalar)", lambda: torch.mul(x, 0.5), lambda: K.mul(x, 0.5)),
        ("add x+y", lambda: torch.add(x, y), lambda: K.add(x, y)),
        ("add var+1e-6 (scalar)", lambda: torch.add(var, 1e-6), lambda: K.add(var, 1e-6)),
        ("_to_copy .to(fp16)", lambda: x.to(torch.float16), lambda: copy._to_copy(x, dtype=torch.float16)),
        ("neg (strided half)", lambda: torch.neg(x2), lambda: K.neg(x2)),
        ("cat rotate_half", lambda: torch.cat((nx2, x1), dim=-1), lambda: copy.cat((nx2, x1), -1)),
        ("pow x^2", lambda: torch.pow(x, 2), lambda: K.pow(x, 2)),
        ("mean(-1, keepdim)", lambda: torch.mean(x, -1, keepdim=True), lambda: reduce.mean(x, [-1], True)),
        ("rsqrt", lambda: torch.rsqrt(var), lambda: K.rsqrt(var)),
        ("mm", lambda: torch.mm(x2d, wl), lambda: matmul.mm(x2d, wl)),
        ("linear (t + mm)", lambda: torch.nn.functional.linear(x, wl), lambda: matmul.mm(x2d, wl.t())),
    ]


def _floor_op(name: str):
    """The aten overload a case's serve call reaches first (for the `floor` override)."""
    return {"mul": "mul.Tensor", "add": "add.Tensor", "_to_copy": "_to_copy", "neg": "neg",
            "cat": "cat", "pow": "pow.Tensor_Scalar", "mean": "mean.dim", "rsqrt": "rsqrt",
            "mm": "mm", "linear": "mm"}[name.split()[0].split("(")[0]]


def timed(fn, calls: int) -> float:
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t) / calls * 1e6


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--rounds", type=int, default=41)
    p.add_argument("--json")
    p.add_argument("--only", help="cases whose name contains this")
    args = p.parse_args()
    logging.getLogger("nbx_tune").setLevel(logging.ERROR)
    torch.set_num_threads(1)  # torch's column: no intra-op threads spinning on a shared host

    import nbx_tune
    from nbx_tune.kernels.runtime import certified, launch
    from nbx_tune.kernels.serving import serve as serving

    mock = MockTriton()
    launch.through_triton, launch._lean_launcher = mock, lean_launcher
    resolve = certified._resolve
    # Every seat certified: a replay counts no miss, as after the census on the GPU.
    certified._resolve = lambda *a: (lambda hit: (hit[0], None, hit[2]))(resolve(*a))  # (config, miss, check)
    certified.reload()

    rows, raw = [], {}
    with torch.inference_mode():
        for name, via_torch, direct in cases():
            if args.only and args.only not in name:
                continue
            launch.forget()
            direct()  # recorded
            mock.record = []
            direct()  # replayed: its launches' arguments
            launches, mock.record = mock.record, None
            if not launch.REMEMBERED or not launches:
                print(f"{name}: not replayed: {dict(launch.REFUSED)}")
                continue
            run = _Compiled(None).run
            head = (1, 1, 1, 0, "function", "metadata", None, None, None)
            bare = (lambda: run(*head, *launches[0])) if len(launches) == 1 else \
                (lambda: [run(*head, *a) for a in launches])
            ready = via_torch()

            def floor():  # the boundary alone: an override of the op that returns `ready`
                lib = torch.library.Library("aten", "IMPL")
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    lib.impl(_floor_op(name), lambda keyset, *a, **k: ready, serving.dispatch_key(),
                             with_keyset=True)
                try:
                    return timed(via_torch, args.calls)
                finally:
                    lib._destroy()

            samples = {k: [] for k in ("torch", "serve", "direct", "floor", "launch")}
            for _ in range(args.rounds):  # interleaved: the variants share the host's drift
                samples["torch"].append(timed(via_torch, args.calls))
                with nbx_tune.serve():
                    serving.reset_stats()
                    via_torch()
                    samples["serve"].append(timed(via_torch, args.calls))
                    st = serving.stats()
                samples["direct"].append(timed(direct, args.calls))
                samples["floor"].append(floor())
                samples["launch"].append(timed(bare, args.calls))
            served = sum(s["certified"] for s in st.values())
            fell = {op: s["reasons"] for op, s in st.items() if s["torch"]}
            med = {k: statistics.median(v) for k, v in samples.items()}
            raw[name] = {**med, "served_ops": sorted(st), "fell_through": fell}
            rows.append((name, med, served, fell))

    head = f"{'op':<24}{'torch':>7}{'serve':>7}{'direct':>7}{'floor':>7}{'launch':>7}{'s-d':>6}{'s-f':>6}"
    print(f"host us per call (median of {args.rounds} rounds of {args.calls}); torch {torch.__version__}")
    print(head)
    for name, m, served, fell in rows:
        print(f"{name:<24}{m['torch']:>7.2f}{m['serve']:>7.2f}{m['direct']:>7.2f}{m['floor']:>7.2f}"
              f"{m['launch']:>7.2f}{m['serve'] - m['direct']:>6.2f}{m['serve'] - m['floor']:>6.2f}"
              + (f"  FELL THROUGH: {fell}" if fell else ""))
    from nbx_tune.testing.bench import environment, out_dir

    path = Path(args.json) if args.json else out_dir() / "serve_cpu_overhead.json"
    path.write_text(json.dumps({"env": environment(), "calls": args.calls, "rounds": args.rounds,
                                "us_per_call": raw}, indent=1, default=str))
    print("wrote", path)


if __name__ == "__main__":
    sys.exit(main())
