"""Split-K summed by the last split (SUM_LAST) against split-K with its reduce launch, the
other schedules of matmul's space and torch, at the decode and mid-size GEMM shapes of the
example traces, timed side by side under CUDA graphs. Usage (GPU):
python3 lab/gemm_sum_last/study.py; writes $OUT/gemm_sum_last.json."""

from __future__ import annotations

import sys


# (M, N, K): decode rows of Llama-2-7B at batch 1 and 64, then the mid-size prefill rows
# that stayed below torch (Llama-3-8B, Qwen2-1.5B, GPT-2).
SHAPES = [(1, 11008, 4096), (64, 4096, 4096), (1, 4096, 4096), (64, 11008, 4096), (1000, 1024, 4096),
          (800, 1536, 1536), (800, 1536, 8960), (800, 8960, 1536), (1024, 768, 3072), (1024, 2304, 768)]


def family(c) -> str:
    kw = c.kwargs
    if kw.get("SCHEDULE"):
        return "persistent" if kw["SCHEDULE"] == 1 else "stream-k"
    if kw.get("SPLIT_K", 1) > 1:
        return "split-last" if kw.get("SUM_LAST") else "split-k"
    return "tile"


def main() -> int:
    from nbx_tune.lab.gemm_persistent.space import run

    return run(SHAPES, family, "gemm_sum_last.json", twice=True)


if __name__ == "__main__":
    sys.exit(main())
