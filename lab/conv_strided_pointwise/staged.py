"""Study: ResNet-50's stride-2 1x1 convolutions with the input's pixels staged first.

The pointwise kernel reads a stride-2 input through its strides, one element at a time
(no two pixels a tile loads are adjacent), and runs at 0.31-0.38 of torch there
(docs/benchmarks.md). Staged: the copy kernel gathers x[:, :, ::2, ::2] into a dense NCHW
tensor (a quarter of the input), then the flat stride-1 path (vector loads) does the GEMM.
Side by side per row: torch (cuDNN), the shipped certificate on the strided path, and the
staged pair under the best PW config of a sweep (copy included in its time).

    python lab/conv_strided_pointwise/staged.py              (the H200)
    TRITON_INTERPRET=1 python lab/conv_strided_pointwise/staged.py --smoke
"""

from __future__ import annotations

import argparse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
from nbx_tune.testing.bench import report, side_by_side, wall_ms  # noqa: E402
from nbx_tune.bench.conv_pointwise import _setup, pointwise_rows  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)

    import torch
    import torch.nn.functional as F

    from nbx_tune.kernels import conv as cv
    from nbx_tune.kernels.runtime.certified import config_for
    from nbx_tune.kernels.copy import dense

    device = "cpu" if args.smoke else "cuda"
    dtype = torch.float32 if args.smoke else torch.bfloat16
    dname = "float32" if args.smoke else "bfloat16"
    timer = wall_ms if args.smoke else None
    rep = 1.0 if args.smoke else 24.0
    out, rows = [], []
    for i, (row, count) in enumerate(pointwise_rows(args.smoke, dname)):
        p = cv.SPEC.problem_from_row(row)
        if getattr(p, "flags", None) is None or dict(p.flags).get("kind") != "pointwise":
            continue
        if dict(p.flags)["stride"] == "1x1":
            continue
        p, x, w, stride, ref, y = _setup(row, device, dtype, i)
        cert = config_for(cv.SPEC, p.dtypes, p.flags, p.dims)
        ys = torch.empty_like(y)

        def staged(c):
            xd = dense(x[:, :, ::stride[0], ::stride[1]])
            cv.launch_conv_pointwise(xd, w, None, ys, (1, 1), c)

        best, best_ms = None, float("inf")
        for c in cv.POINTWISE_CONFIGS:
            try:
                staged(c)
            except Exception:  # noqa: BLE001 - a config this device cannot run
                continue
            err = float((ys.float() - ref).abs().max()) / float(ref.abs().max())
            if err > (1e-4 if dtype == torch.float32 else 2e-2):
                print(f"WRONG: {c.key()} staged at {tuple(x.shape)}: {err:.2e}")
                continue
            ms = side_by_side({"s": lambda c=c: staged(c)}, rep_ms=rep / 4, rounds=1, timer=timer)["s"]
            if ms < best_ms:
                best, best_ms = c, ms
        t = side_by_side({"torch": lambda: F.conv2d(x, w, None, stride),
                          "strided": lambda: cv.launch_conv_pointwise(x, w, None, y, stride, cert),
                          "staged": lambda: staged(best)}, rep_ms=rep, timer=timer)
        rows.append([f"{tuple(x.shape)} -> {w.shape[0]} s{stride[0]}", count,
                     f"{t['torch'] / t['strided']:.2f}", f"{t['torch'] / t['staged']:.2f}", best.key()])
        out.append({"x": tuple(x.shape), "co": w.shape[0], "stride": stride, "count": count, "ms": t,
                    "staged_config": best.key(), "certified": cert.key()})
    report("conv_strided_pointwise.json",
           ["row", "launches", "torch/strided (certified)", "torch/staged (best)", "staged config"], rows, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
