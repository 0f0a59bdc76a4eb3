"""Where a census seat's inputs and oracles go (call 12's timeline: 0.5-1.3 s a seat, 5.4 s of
a 15.5 s census): the screen and confirm cases of the Llama-2-7B example's six matmul
seats, made as the worker makes them (screen.make_case, with its phases), then the
Freivalds check's host side at each case's operands on one thread (as `products._expected`
made it until 2026-12-06) and with its row blocks on threads (`products._expected` since:
slower where numpy's OpenBLAS threads spin, calls 14, 18 and 21; 2.3x faster where they do
not, call 21). Usage: python3 case_probe.py (on a GPU)."""

import time

import numpy as np
import torch

from nbx_tune.kernels.matmul import SPEC
from nbx_tune.kernels.rows import make_row
from nbx_tune.oracles import products
from nbx_tune.profiles import get_profile
from nbx_tune.tuner.certify import screen
from nbx_tune.tuner.certify.tune import seat_job

ROWS = [("bfloat16", (512, 4096), (4096, 4096)), ("bfloat16", (512, 4096), (4096, 11008)),
        ("bfloat16", (512, 11008), (11008, 4096)), ("bfloat16", (512, 4096), (4096, 32000)),
        ("float16", (4096, 4096), (4096, 4096)), ("bfloat16", (4096, 4096), (4096, 4096))]


def one_thread(a, b):
    """products._expected before its row blocks went to threads."""
    x = products._check_vectors(b.shape[-1])
    bx, abs_bx = np.empty(b.shape[:-1] + (2,)), np.empty(b.shape[:-1] + (2,))
    buf = np.empty(b[..., :products.CHUNK_ROWS, :].shape)
    for k in range(0, b.shape[-2], products.CHUNK_ROWS):
        block = b[..., k:k + products.CHUNK_ROWS, :]
        bx[..., k:k + products.CHUNK_ROWS, :] = np.matmul(block, x)
        abs_block = np.abs(block, out=buf[..., :block.shape[-2], :])
        abs_bx[..., k:k + products.CHUNK_ROWS, :] = np.matmul(abs_block, np.abs(x))
    return np.matmul(a, bx), np.matmul(np.abs(a), abs_bx)


on_threads = products._expected


def main() -> None:
    prof = get_profile("hopper")
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    total = {}
    print(f"{'case':34s} {'s':>6s}  phases (s)", flush=True)
    for dt, sa, sb in ROWS:
        p = SPEC.problem_from_row(make_row("aten.mm", [dt, dt], [sa, sb]))
        job, _ = seat_job(SPEC, prof, "probe", [p], "cuda")
        for q in (*job.screen_problems, *job.confirm_problems):
            phases = {}
            t0 = time.perf_counter()
            case = screen.make_case(SPEC, q, "cuda", screen.seed_for(job.label, q), True, phases)
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
            for k, v in phases.items():
                total[k] = total.get(k, 0.0) + v
            total["wall"] = total.get("wall", 0.0) + wall
            a = np.ascontiguousarray(np.random.default_rng(1).uniform(-1, 1, (q.dims[1], q.dims[3])))
            b = np.ascontiguousarray(np.random.default_rng(2).uniform(-1, 1, (q.dims[3], q.dims[2])))
            checks = []
            for fn in (one_thread, on_threads, one_thread, on_threads):
                t = time.perf_counter()
                fn(a, b)
                checks.append(time.perf_counter() - t)
            total["check, one thread"] = total.get("check, one thread", 0.0) + min(checks[0::2])
            total["check, blocks on threads"] = total.get("check, blocks on threads", 0.0) + min(checks[1::2])
            print(f"{str(q.dims):34s} {wall:6.3f}  " + ", ".join(f"{k} {v:.3f}" for k, v in phases.items())
                  + f"; check one thread {min(checks[0::2]):.3f}, on threads {min(checks[1::2]):.3f}", flush=True)
            del case
    print("totals: " + ", ".join(f"{k} {v:.2f} s" for k, v in total.items()), flush=True)


if __name__ == "__main__":
    main()
