"""The baseline: triton.autotune over the matmul kernel's config space, tuning each
matmul shape of a trace as a user of @triton.autotune would (key M, N, K), over every config
of the space but the split-K ones (two kernels and a workspace) and the persistent ones
(another kernel, launched one program per SM): no single autotuned launch runs them; the
census times them too, so its side has the larger space. Run in its own
process with a fresh Triton cache by bench/tuning_cost.py, which times it.

    python bench/autotune_baseline.py TRACE RESULT.json
"""

import json
import sys
import time

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from nbx_tune.kernels.matmul import CONFIGS, SPEC, _matmul_kernel, schedule, split_k
from nbx_tune.kernels.spec import NotServable
from nbx_tune.tuner.certify.screen import TORCH_DTYPES
from nbx_tune.kernels.trace import read_trace



def _boxes(c):
    """A TMA config's pre-hook: its boxes on the descriptors of the call (Triton's own
    tutorials do the same); the descriptors are ignored by the other configs."""
    bm, bn, bk, extra = c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"], c.kwargs.get("EXTRA_N", 0)

    def hook(nargs):
        nargs["a_desc"].block_shape = [bm, bk]
        nargs["b_desc"].block_shape = [bk, bn]
        nargs["b2_desc"].block_shape = [bk, extra or bn]
    return hook if c.kwargs.get("TMA") else None


TUNED = triton.autotune(
    configs=[triton.Config(dict(c.meta), num_warps=c.num_warps, num_stages=c.num_stages, pre_hook=_boxes(c))
             for c in CONFIGS if split_k(c) == 1 and not schedule(c)],  # one launch of _matmul_kernel each
    key=["M", "N", "K"],
)(_matmul_kernel)


def run(problem):
    B, M, N, K = problem.dims
    dt = TORCH_DTYPES[problem.dtypes[0]]
    a = torch.randn(B, M, K, device="cuda", dtype=dt)
    b = torch.randn(B, K, N, device="cuda", dtype=dt)
    c = torch.empty(B, M, N, device="cuda", dtype=dt)
    has_bias = dict(problem.flags)["bias"] == "1"
    x = torch.randn(N, device="cuda", dtype=dt).expand(B, M, N) if has_bias else c
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"] + meta.get("EXTRA_N", 0)),  # noqa: E731
                         B)
    if B != 1:  # a config's TMA=1 reads through 2-D descriptors: one product at a time
        raise SystemExit(f"autotune_baseline serves B=1 rows only, got B={B}")
    descs = [TensorDescriptor.from_tensor(t[0], [16, 16]) for t in (a, b, b)]  # boxes set by _boxes
    TUNED[grid](a, b, c, x, *descs, M, N, K, N, *a.stride(), *b.stride(), *c.stride(), *x.stride(),
                problem.get("alpha", 1.0), problem.get("beta", 1.0), HAS_BIAS=has_bias,
                INPUT_PRECISION="ieee" if dt == torch.float32 else "tf32", ALIGN_AB=1, ALIGN_C=1)
    torch.cuda.synchronize()
    best = TUNED.best_config
    return ",".join(f"{k}={v}" for k, v in best.kwargs.items()) + f",num_warps={best.num_warps},num_stages={best.num_stages}"


def main(trace_path, out_path):
    t0 = time.perf_counter()
    picks = []
    for row in read_trace(trace_path).rows:
        p = SPEC.problem_from_row(row)
        if isinstance(p, NotServable):
            continue
        t = time.perf_counter()
        picks.append({"problem": p.to_json(), "config": run(p), "seconds": time.perf_counter() - t})
    json.dump({"picks": picks, "seconds": time.perf_counter() - t0}, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
