"""Why the re-certification and the fresh census rank the LM head's two best configs opposite
(calls 36, 38, 39: the re-certification's own timings put 128 x 128 TMA, nw 4, 5 stages ahead
of 128 x 256 TMA, nw 8, 3 stages; every fresh census put them the other way, 2.4-4.1 % apart,
and the bench's 300 ms replays 4.9-7.0 %). The same six configs at 1024 x 4096 -> 128256 bf16,
timed by the census's own runner (tuner/executor.CandidateRunner) in four ways, each with
fresh rigs (graphs captured anew), alternating, REPEATS times:
  recert:    four turned rounds, no quick estimates first, in the re-certification's order
             (the shipped pair first, then the explored configs);
  warm:      the same after one "warm" timing of the first, thrown away (since call 43, as
             the re-certification now does);
  census:    a quick estimate of each, then the same four rounds;
  sustained: the bench's measure, A against B, 300 ms a repeat, three repeats.
Each pass notes the SM clock, power and temperature (nvidia-smi) before and after.
Usage: python3 order_probe.py [REPEATS] (on a GPU; 2 by default); the table goes to stdout."""

import statistics
import subprocess
import sys
import time

import torch

from nbx_tune.kernels.matmul import SPEC
from nbx_tune.kernels.spec import Config
from nbx_tune.profiles import get_profile
from nbx_tune.tuner.timing import benchmarkers as timing
from nbx_tune.tuner.execution.executor import CandidateRunner
from nbx_tune.kernels.trace import make_row
from nbx_tune.tuner.certify.tune import seat_job

A = "BLOCK_M=128,BLOCK_N=128,BLOCK_K=64,GROUP_M=8,TMA=1,SCHEDULE=1,FLATTEN=1,num_warps=4,num_stages=5"
B = "BLOCK_M=128,BLOCK_N=256,BLOCK_K=64,GROUP_M=8,TMA=1,SCHEDULE=1,FLATTEN=1,num_warps=8,num_stages=3"
# The re-certification's order in call 39: the shipped winner and runner-up, then what it explored.
ORDER = ["BLOCK_M=128,BLOCK_N=256,BLOCK_K=64,GROUP_M=8,num_warps=8,num_stages=3",
         "BLOCK_M=128,BLOCK_N=128,BLOCK_K=64,GROUP_M=8,TMA=1,SCHEDULE=1,num_warps=8,num_stages=4",
         A, "BLOCK_M=128,BLOCK_N=256,BLOCK_K=64,GROUP_M=8,TMA=1,num_warps=8,num_stages=3", B,
         "BLOCK_M=64,BLOCK_N=256,BLOCK_K=64,GROUP_M=8,TMA=1,SCHEDULE=1,FLATTEN=1,num_warps=4,num_stages=4"]
ROUNDS = 4


def gpu_state() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                               "--format=csv,noheader"], capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError:
        return "?"


def stream_timer(fns: list, rep: float) -> float:
    return timing.stream_time(fns, 2, rep, (0.5,))[0]


def rounds(runner, configs) -> dict:
    got = {c: [] for c in configs}
    for r in range(ROUNDS):
        k = r % len(configs)
        for c in configs[k:] + configs[:k]:
            got[c].append(runner.time(c, f"round:{ROUNDS}").timing.median_ms)
    return {c: statistics.median(v) for c, v in got.items()}


def main() -> None:
    prof = get_profile("hopper")
    p = SPEC.problem_from_row(make_row("aten.mm", ["bfloat16", "bfloat16"], [(1024, 4096), (4096, 128256)]))
    job, _ = seat_job(SPEC, prof, "probe", [p], "cuda")
    runner = CandidateRunner(SPEC, job, timing.for_profile(prof))
    configs = [Config.parse(c) for c in ORDER]
    a, b = Config.parse(A), Config.parse(B)
    for c in configs:  # compiled and screened, as both sides do before timing
        out = runner.screen(c)
        print(f"screen {'ok' if out.ok else out.reason}: {c.key()}", flush=True)
    torch.cuda.synchronize()
    rows = []
    for rep in range(int(sys.argv[1]) if len(sys.argv) > 1 else 2):
        for how in ("recert", "warm", "census", "sustained"):
            runner._rigs.clear()  # fresh graphs and estimates, as a new seat has
            time.sleep(1.0)  # the GPU idle a moment, as after a seat's screen
            before = gpu_state()
            t0 = time.perf_counter()
            if how == "census":
                for c in configs:
                    runner.time(c, "quick")
            if how == "warm":
                runner.time(configs[0], "warm")
            if how == "sustained":
                ins, outs = runner._operands(runner.time_case)  # as bench/recertify_cost.pick_losses times them
                fns = {"A": [lambda: SPEC.launch(a, p, ins, outs)], "B": [lambda: SPEC.launch(b, p, ins, outs)]}
                ratios = [(lambda t: t["A"] / t["B"])(timing.side_by_side(fns, rep_ms=300, timer=stream_timer))
                          for _ in range(3)]
                ms = {a: None, b: None}
                ratio = statistics.median(ratios)
            else:
                ms = rounds(runner, configs)
                ratio = ms[a] / ms[b]
            rows.append((rep, how, ratio, ms, before, gpu_state(), time.perf_counter() - t0))
            print(f"{rep} {how:9s} A/B {ratio:.4f}  {time.perf_counter() - t0:5.1f} s  before {before}  "
                  f"after {rows[-1][5]}", flush=True)
    print("\nper config (ms), the passes in order but the sustained ones:")
    for c in configs:
        print(f"{c.key()[:86]:86s} " + " ".join(f"{r[3][c]:.4f}" for r in rows if r[3].get(c) is not None))
    for how in ("recert", "warm", "census", "sustained"):
        rs = [r[2] for r in rows if r[1] == how]
        print(f"{how:9s} A/B (128x128 over 128x256): " + ", ".join(f"{x:.4f}" for x in rs))


if __name__ == "__main__":
    main()
