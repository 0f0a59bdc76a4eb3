"""The 1x1 convolutions of ResNet-50 (batch 8, examples/traces/resnet50_b8_bf16.tsv) against
torch (cuDNN), in one run, before and after the pointwise kernel:

- torch: F.conv2d on NCHW inputs;
- gemm: the implicit GEMM kernel (`_conv_gemm_kernel`) under the config the shipped hopper
  table certified for the row's old `kind=gemm` seat (its declared default where none:
  marked `*`), which is what these rows ran before they had a seat of their own;
- pw: the pointwise kernel (`_conv_pointwise_kernel`) under its declared default, and under
  the best of every PW config the profile admits at the row (a coarse sweep of all, then the
  best timed again beside the others): what a census would choose from.

Every launch is checked first against torch in fp32 (2e-2 of max|ref| in bf16/fp16: a sanity
check; proofs/gpu_check.py --kernels conv is the fp64 proof). Times are the census's (each
launch after an L2 flush, tuner/timing.gpu_time), the sides in alternating rounds. Ratios are
torch / ours (below 1: slower than torch); the total weights each row by its launches in the
trace.

    python bench/conv_pointwise.py [--dtype bfloat16] [--budget-s 240]
    TRITON_INTERPRET=1 python bench/conv_pointwise.py --smoke     (tiny shapes on the CPU)

Prints a table; JSON in $OUT/conv_pointwise.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from nbx_tune.testing.bench import environment, save, side_by_side, table, wall_ms  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "examples" / "traces" / "resnet50_b8_bf16.tsv"
SMOKE_ROWS = (((2, 24, 7, 7), (40, 24, 1, 1), 1), ((2, 16, 9, 9), (24, 16, 1, 1), 2))


def pointwise_rows(smoke: bool, dtype: str):
    """(row, launches in the trace) for every 1x1 unpadded convolution, in the trace's order."""
    from nbx_tune.kernels.rows import make_row
    from nbx_tune.kernels.trace import read_trace

    if smoke:
        return [(make_row("aten.convolution", [dtype] * 2, [x, w],
                          {"bias": "None", "stride": f"{s}x{s}", "padding": "0x0", "dilation": "1x1",
                           "transposed": "False", "output_padding": "0x0", "groups": "1"}), 1)
                for x, w, s in SMOKE_ROWS]
    out = []
    for r in read_trace(TRACE).rows:
        if r.op != "aten.convolution":
            continue
        out.append((make_row(r.op, [dtype] * len(r.shapes), r.shapes, dict(r.params.items()), r.count), r.count))
    return out


def old_config(spec, profile, problem):
    """(config, certified?) of the row's old kind=gemm seat in the shipped hopper table."""
    from nbx_tune.kernels.runtime import table_format
    from nbx_tune.kernels.spec import Config, bucket_of, encode_bucket, encode_flags

    flags = tuple(sorted((k, v) for k, v in {**dict(problem.flags), "kind": "gemm"}.items() if k != "aligned"))
    old = dataclasses.replace(problem, flags=flags)
    bucket = encode_bucket(spec.key, bucket_of(profile, spec.key, problem.dims))
    try:
        entries = table_format.read(ROOT / "kernels" / "tables" / "hopper.json")["entries"]
    except Exception:  # noqa: BLE001 - no table: the default
        entries = []
    for e in entries:
        if (e["kernel"], e["dtypes"], e["flags"], e["bucket"]) == ("conv", problem.dtypes[0], encode_flags(flags), bucket):
            return Config.parse(e["config"]), True
    return spec.default_config(profile, old), False


def _setup(row, device, dtype, seed):
    """(x, w, stride, fp32 reference, output) of one row, seeded."""
    import torch
    import torch.nn.functional as F

    from nbx_tune.kernels import conv as cv

    p = cv.SPEC.problem_from_row(row)
    g = torch.Generator(device="cpu").manual_seed(seed)
    xs, ws = row.shapes[0], row.shapes[1]
    x = torch.randn(*xs, generator=g).to(device=device, dtype=dtype)
    w = (torch.randn(*ws, generator=g) / ws[1] ** 0.5).to(device=device, dtype=dtype)
    stride = cv._parse_pair(dict(p.flags)["stride"])
    ref = F.conv2d(x.float(), w.float(), None, stride)
    return p, x, w, stride, ref, torch.empty_like(ref, dtype=dtype)


def _warm(job) -> None:
    """One config launched once at every row (a pool process): its compiles land in
    Triton's disk cache, which the timing process then reads."""
    kind, key, dname, smoke = job
    from nbx_tune.kernels import conv as cv
    from nbx_tune.kernels.spec import Config

    c = Config.parse(key)
    for i, (row, _) in enumerate(pointwise_rows(smoke, dname)):
        p, x, w, stride, _, y = _setup(row, "cpu" if smoke else "cuda", cv.TORCH_DTYPES[dname], i)
        if dict(p.flags)["kind"] != "pointwise":
            continue
        try:
            if kind == "pw":
                cv.launch_conv_pointwise(x, w, None, y, stride, c)
            else:
                cv.launch_conv_gemm(x, w, None, y, stride, (0, 0), (1, 1), 1, c)
        except Exception:  # noqa: BLE001 - the timing process reports it
            pass


def warm(profile, dname: str, workers: int, smoke: bool) -> None:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from nbx_tune.kernels import conv as cv

    keys = {("pw", c.key()) for c in cv.POINTWISE_CONFIGS}
    for row, _ in pointwise_rows(smoke, dname):
        p = cv.SPEC.problem_from_row(row)
        if dict(p.flags)["kind"] == "pointwise":
            keys.add(("gemm", old_config(cv.SPEC, profile, p)[0].key()))
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as ex:
        list(ex.map(_warm, [(k, c, dname, smoke) for k, c in sorted(keys)]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument("--budget-s", type=float, default=240.0, help="stop starting new rows after this")
    ap.add_argument("--workers", type=int, help="processes compiling every config first (default 12, smoke 0)")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)

    import torch
    import torch.nn.functional as F

    from nbx_tune.kernels import conv as cv
    from nbx_tune.profiles import current_profile
    from nbx_tune.tuner.certify.tune import static_prune

    t_start = time.monotonic()
    device = "cpu" if args.smoke else "cuda"
    dtype = cv.TORCH_DTYPES["float32" if args.smoke and args.dtype == "bfloat16" else args.dtype]
    dname = {v: k for k, v in cv.TORCH_DTYPES.items()}[dtype]
    profile = current_profile()
    timer = wall_ms if args.smoke else None  # the interpreter: one wall-clock call, the numbers mean nothing
    rep = 1.0 if args.smoke else 24.0
    workers = args.workers if args.workers is not None else (0 if args.smoke else 12)
    if workers > 0:
        warm(profile, dname, workers, args.smoke)
        print(f"compiled in {time.monotonic() - t_start:.0f} s", flush=True)

    rows, results, bad = [], [], []
    seen = set()
    for row, count in pointwise_rows(args.smoke, dname):
        p = cv.SPEC.problem_from_row(row)
        if getattr(p, "flags", None) is None or dict(p.flags)["kind"] != "pointwise":
            continue
        key = (tuple(map(tuple, row.shapes)), dict(p.flags)["stride"])
        if key in seen:
            continue
        seen.add(key)
        if time.monotonic() - t_start > args.budget_s:
            results.append({"shapes": key[0], "stride": key[1], "not_timed": "budget"})
            continue
        xs, ws = row.shapes[0], row.shapes[1]
        p, x, w, stride, ref, y = _setup(row, device, dtype, len(seen))
        scale = float(ref.abs().max())

        def ok(fn, name):
            y.fill_(float("nan"))
            fn()
            err = float((y.float() - ref).abs().max()) / scale
            if not err <= 2e-2:  # NaN fails too
                bad.append(f"{name} at {xs} s{stride}: error {err:.3g}")
                return False
            return True

        gemm_cfg, certified = old_config(cv.SPEC, profile, p)
        fns = {"torch": lambda: F.conv2d(x, w, None, stride),
               "gemm": lambda c=gemm_cfg: cv.launch_conv_gemm(x, w, None, y, stride, (0, 0), (1, 1), 1, c)}
        pw_default = cv.SPEC.default_config(profile, p)
        pw = lambda c: (lambda: cv.launch_conv_pointwise(x, w, None, y, stride, c))  # noqa: E731
        keep, _ = static_prune(cv.SPEC, profile, p)
        ok(fns["gemm"], f"gemm {gemm_cfg}")
        sweep = {}
        for c in keep:
            if ok(pw(c), f"pw {c}"):
                sweep[c] = side_by_side({"c": pw(c)}, rep / 4, rounds=1, timer=timer)["c"]
        if not sweep:
            continue
        best = min(sweep, key=sweep.get)
        fns["pw_default"] = pw(pw_default)
        fns["pw_best"] = pw(best)
        t = side_by_side(fns, rep, timer=timer)
        results.append({"shapes": key[0], "stride": key[1], "count": count, "ms": t,
                        "gemm_config": str(gemm_cfg), "gemm_certified": certified,
                        "pw_default": str(pw_default), "pw_best": str(best), "pw_sweep": len(sweep)})
        rows.append([f"{'x'.join(map(str, xs))} -> {ws[0]}", key[1], count,
                     f"{t['torch'] * 1e3:.1f}", f"{t['gemm'] * 1e3:.1f}{'' if certified else '*'}",
                     f"{t['pw_default'] * 1e3:.1f}", f"{t['pw_best'] * 1e3:.1f}",
                     f"{t['torch'] / t['gemm']:.2f}", f"{t['torch'] / t['pw_default']:.2f}",
                     f"{t['torch'] / t['pw_best']:.2f}",
                     f"{best['BLOCK_M']}x{best['BLOCK_N']}x{best['BLOCK_K']} w{best.num_warps} s{best.num_stages}"
                     + (f" split {best.kwargs['SPLIT_K']}" if "SPLIT_K" in best.kwargs else "")])

    timed = [r for r in results if "ms" in r]
    tot = {s: sum(r["count"] * r["ms"][s] for r in timed) for s in ("torch", "gemm", "pw_default", "pw_best")}
    print(f"1x1 convolutions of ResNet-50 b8, {dname}, {profile.name} (us per call; torch/ours: below 1 is slower)")
    print(table(rows, ["input -> C_out", "stride", "n", "torch", "gemm", "pw dflt", "pw best",
                       "t/gemm", "t/pw dflt", "t/pw best", "best PW tile"]))
    if timed and tot["gemm"] > 0:
        print(f"launch-weighted total over {len(timed)} shapes: torch/gemm {tot['torch'] / tot['gemm']:.2f}, "
              f"torch/pw default {tot['torch'] / tot['pw_default']:.2f}, torch/pw best {tot['torch'] / tot['pw_best']:.2f}")
    for b in bad:
        print("WRONG:", b)
    print("* the old seat had no certificate: the implicit GEMM's default")
    save("conv_pointwise.json", {"env": environment(), "dtype": dname, "profile": profile.name, "rows": results,
                                 "totals_ms": tot, "wrong": bad})
    return 1 if bad or not timed else 0


if __name__ == "__main__":
    sys.exit(main())
