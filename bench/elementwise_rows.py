"""The element-wise and copy rows that lose to torch on the H200, at their trace shapes:
every config of the kernel's space (the stream levers included) against torch's op under
CUDA graphs, both sides timed in alternating rounds.

    python bench/elementwise_rows.py [--budget-s 150] [--rows pow,neg] [--rotate-mb 96] [--smoke]
        --smoke   tiny shapes, 3 configs a row, on the CPU interpreter (TRITON_INTERPRET=1):
                  the script's own check, its numbers mean nothing

Per row: torch's op, each config of the space (`staged`/`two copies`: the path before the
strided unary input and the one-launch cat of halves, for neg and cat), timed under graph
replay (bench/torch_compare.py's capture and rounds). Inputs rotate through up to 4 sets
(about 96 MB, `--rotate-mb`; 0 keeps one set, warm in the L2) on every side. Outputs: every side allocates its output per call (the caching
allocator then hands back the same block, as in a model), so both sides write alike;
`rot-out` also times the best config writing into one output per input set, as
bench/torch_compare.py's spec path once did (torch's side allocates per call:
its output stays in the L2 across calls, the rotating ones do not). Each config's result is checked once
against an fp64 reference (torch in float64; exact rows: bit for bit against torch).
Prints a table per row (ms, GB/s = bytes read and written / time, torch/config) and a
summary (torch/best, best config, torch/certified); JSON in $OUT/elementwise_rows.json.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path


ROTATE_BYTES = 96 << 20
MAX_SETS = 4


def row_specs(smoke: bool) -> list[dict]:
    """The rows: name, kind, dtype(s), shape(s) (trace shapes; tiny under --smoke)."""
    bf16 = "float16" if smoke else "bfloat16"  # the interpreter computes garbage in bf16
    s = (lambda *d: tuple(max(1, x // 64) if i == len(d) - 1 else min(x, 3) for i, x in enumerate(d))) \
        if smoke else (lambda *d: d)
    return [
        {"name": "pow2 f32 llama2-512", "kind": "pow", "dt": "float32", "shape": s(1, 512, 4096)},
        {"name": "to_copy f32->bf16 llama2-512", "kind": "cast", "dt": "float32", "to": bf16,
         "shape": s(1, 512, 4096)},
        {"name": "add bf16 llama2-512 hidden", "kind": "add", "dt": bf16, "shape": s(1, 512, 4096)},
        {"name": "add bf16 llama2-512 rotary", "kind": "add", "dt": bf16, "shape": s(1, 32, 512, 128)},
        {"name": "pow2 f32 llama3-1000", "kind": "pow", "dt": "float32", "shape": s(1, 1000, 4096)},
        {"name": "to_copy f32->bf16 llama3-1000", "kind": "cast", "dt": "float32", "to": bf16,
         "shape": s(1, 1000, 4096)},
        {"name": "mul bf16 by 0-d f64 gpt2", "kind": "mul_scalar", "dt": bf16, "shape": s(1, 1024, 3072)},
        {"name": "add bf16 gpt2", "kind": "add", "dt": bf16, "shape": s(1, 1024, 3072)},
        {"name": "neg bf16 half decode-b64", "kind": "neg_half", "dt": bf16, "shape": s(64, 32, 1, 128)},
        {"name": "neg bf16 half llama2-512", "kind": "neg_half", "dt": bf16, "shape": s(1, 32, 512, 128)},
        {"name": "cat(-x2, x1) bf16 llama2-512", "kind": "cat", "dt": bf16, "half": True, "dim": -1,
         "shapes": [s(1, 32, 512, 64)] * 2},
        {"name": "cat halves bf16 llama3-1000", "kind": "cat", "dt": bf16, "dim": -1, "shapes": [s(1, 32, 1000, 64)] * 2},
        {"name": "cat kv-grow bf16 b1-4096", "kind": "cat", "dt": bf16, "dim": -2,
         "shapes": [s(1, 32, 4096, 128), s(1, 32, 1, 128)]},
    ]


def _rand(shape, dt, device):
    import torch

    return torch.empty(shape, dtype=getattr(torch, dt), device=device).uniform_(-2, 2)


def build(spec_row: dict, device: str):
    """(spec, problem, make_set(), torch_fn(set) -> out, nbx(config, set) -> out, extra
    candidates {name: fn(set) -> out}, reference(set) -> fp64 out or None, exact, bytes)."""
    import torch

    from nbx_tune.kernels import copy as cp
    from nbx_tune.kernels import elementwise as ew
    from nbx_tune.kernels.rows import make_row

    kind, dt = spec_row["kind"], spec_row["dt"]
    shape = tuple(spec_row.get("shape", ()))
    n = math.prod(shape)
    size = getattr(torch, dt).itemsize
    extra = {}
    if kind in ("pow", "add", "mul_scalar", "cast"):
        if kind == "pow":
            row = make_row("aten.pow.Tensor_Scalar", [dt], [shape], {"exponent": "2"})
        elif kind == "add":
            row = make_row("aten.add.Tensor", [dt, dt], [shape, shape])
        elif kind == "mul_scalar":
            row = make_row("aten.mul.Tensor", [dt, "float64"], [shape, ()])
        else:
            row = make_row("aten._to_copy", [dt], [shape], {"dtype": spec_row["to"]})
        spec = ew.UNARY_SPEC if kind == "pow" else ew.BINARY_SPEC if kind in ("add", "mul_scalar") else cp.COPY_SPEC
        problem = spec.problem_from_row(row)
        shapes = spec.input_shapes(problem)
        outs = spec.output_specs(problem)

        def make_set():
            ins = {k: _rand(s, d, device) for k, (s, d) in shapes.items()}
            if kind == "mul_scalar":
                ins["b"] = torch.tensor(0.5, dtype=torch.float64, device=device)
            return ins

        def nbx(config, ins):
            o = {k: torch.empty(s, dtype=getattr(torch, d), device=device) for k, (s, d) in outs.items()}
            spec.launch(config, problem, ins, o)
            return next(iter(o.values()))

        if kind == "pow":
            def torch_fn(ins):
                return torch.pow(ins["x"], 2)

            def ref(ins):
                return ins["x"].double() ** 2
        elif kind == "add":
            def torch_fn(ins):
                return torch.add(ins["a"], ins["b"])

            def ref(ins):
                return ins["a"].double() + ins["b"].double()
        elif kind == "mul_scalar":
            def torch_fn(ins):
                return torch.mul(ins["a"], 0.5)  # a wrapped Python number, as the model's

            def ref(ins):
                return ins["a"].double() * 0.5
        else:
            to = getattr(torch, spec_row["to"])

            def torch_fn(ins):
                return ins["x"].to(to)

            ref = None  # exact: bit for bit against torch
        nbytes = sum(math.prod(s) * getattr(torch, d).itemsize for s, d in (*shapes.values(), *outs.values())
                     if s != ())
        return spec, problem, make_set, torch_fn, nbx, extra, ref, kind == "cast", nbytes

    half = shape[-1] // 2 if shape else 0
    if kind == "neg_half":
        spec = ew.UNARY_SPEC
        problem = spec.problem_from_row(make_row("aten.neg", [dt], [shape[:-1] + (half,)]))

        def make_set():
            return {"x": _rand(shape, dt, device)[..., half:]}  # rotate_half's x2

        def nbx(config, ins):
            x = ins["x"]
            y = torch.empty(x.shape, dtype=x.dtype, device=device)
            ew.launch_unary(x, y, "neg", (0.0, 0.0, 0.0), config)
            return y

        def staged(ins):  # before: a contiguous copy by the copy kernel, then neg
            x = cp.dense(ins["x"])
            y = torch.empty(x.shape, dtype=x.dtype, device=device)
            ew.launch_unary(x, y, "neg", (0.0, 0.0, 0.0), ew.DEFAULTS[0])
            return y

        extra["staged (copy + neg)"] = staged
        # reads one half, writes it: n elements moved
        return spec, problem, make_set, (lambda ins: torch.neg(ins["x"])), nbx, extra, None, True, n * size

    # cat: the inputs' shapes and dim; `half`: the second input is the first half of a
    # tensor twice as wide on the last dim (rotate_half's cat((-x2, x1), -1))
    spec = cp.CAT_SPEC
    shapes, dim = [tuple(x) for x in spec_row["shapes"]], spec_row["dim"]
    problem = spec.problem_from_row(make_row("aten.cat", [dt, dt], shapes, {"dim": str(dim)}))
    out_shape = tuple(problem.get("out_shape"))

    def make_set():
        b = shapes[1]
        if spec_row.get("half"):
            x1 = _rand(b[:-1] + (2 * b[-1],), dt, device)[..., :b[-1]]
        else:
            x1 = _rand(b, dt, device)
        return {"a": _rand(shapes[0], dt, device), "x1": x1}

    def nbx(config, ins):
        out = torch.empty(out_shape, dtype=ins["a"].dtype, device=device)
        cp.launch_cat([ins["a"], ins["x1"]], out, dim, config)
        return out

    def two_copies(ins):  # each input copied into its slice (a strided input's path before)
        out = torch.empty(out_shape, dtype=ins["a"].dtype, device=device)
        lo = 0
        for x in (ins["a"], ins["x1"]):
            y = out.narrow(dim, lo, x.shape[dim])
            cp.launch_copy_plan(x, y, cp.copy_plan(tuple(x.shape), x.stride(), y.stride()), cp.DEFAULTS[0])
            lo += x.shape[dim]
        return out

    extra["two copies"] = two_copies
    return (spec, problem, make_set, (lambda ins: torch.cat([ins["a"], ins["x1"]], dim)), nbx, extra, None, True,
            2 * math.prod(out_shape) * size)


def shipped_config(spec, problem) -> str | None:
    """The config the shipped hopper table holds for the row's seat, stale or not: what
    bench/torch_compare.py ran before this change (a stale seat is served the default)."""
    import json

    from nbx_tune.kernels.spec import Config

    table = json.loads((Path(__file__).resolve().parent.parent / "kernels/tables/hopper.json").read_text())
    flags = ",".join(f"{k}={v}" for k, v in problem.flags) or "-"
    for e in table["entries"]:
        if e["kernel"] != spec.name or e["dtypes"] != ",".join(problem.dtypes) or e["flags"] != flags:
            continue
        lo, _, hi = e["bucket"].split("=", 1)[1].partition("..")
        if int(lo) <= problem.dims[0] <= int(hi or lo):
            return str(Config.parse(e["config"]))
    return None


def check(out, want, ref_fn, ins, exact: bool) -> str:
    """'ok' or what is wrong: exact rows bit for bit against torch, others within the
    dtype's tolerance of the fp64 reference (relative to its largest magnitude)."""
    import torch

    if out.shape != want.shape or out.dtype != want.dtype:
        return f"shape/dtype {tuple(out.shape)} {out.dtype}"
    if exact:
        return "ok" if torch.equal(out, want) else "differs from torch"
    ref = ref_fn(ins)
    err = ((out.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-300)).item()
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}[out.dtype]
    return "ok" if err <= tol else f"error {err:.2e} > {tol:.0e}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget-s", type=float, default=150.0, help="no new row starts after this")
    ap.add_argument("--rows", default="", help="only rows whose name contains one of these (comma-separated)")
    ap.add_argument("--rep-ms", type=float, default=0.0, help="time per side per measure (default 16, smoke 1)")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--rotate-mb", type=float, default=ROTATE_BYTES / 2**20,
                    help="operand sets rotate through about this much (0: one set, read from the L2 call after "
                         "call, as in a model whose ops read what the op before wrote)")
    args = ap.parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    import logging

    logging.getLogger("nbx_tune").setLevel(logging.ERROR)  # uncertified seats: no line each
    return run(args)


def run(args) -> int:
    import torch

    from nbx_tune.testing.bench import environment, save, table
    from nbx_tune.kernels.runtime import certified
    from nbx_tune.kernels import copy as cp
    from nbx_tune.profiles import current_profile
    from nbx_tune.bench.torch_compare import graph_times

    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    rep_ms = args.rep_ms or (1.0 if device == "cpu" else 16.0)
    profile = current_profile()
    rows = row_specs(args.smoke)
    if args.rows:
        keys = [k.strip() for k in args.rows.split(",") if k.strip()]
        rows = [r for r in rows if any(k in r["name"] for k in keys)]
    t0 = time.perf_counter()
    report = {"env": environment(), "device": device, "rows": []}
    summary = []
    torch.manual_seed(0)
    for sr in rows:
        if time.perf_counter() - t0 > args.budget_s:
            report["rows"].append({"row": sr["name"], "error": "not timed (budget)"})
            summary.append([sr["name"], "-", "-", "-", "-", "-", "-", "-", "not timed (budget)"])
            continue
        spec, problem, make_set, torch_fn, nbx, extra, ref, exact, nbytes = build(sr, device)
        configs = [c for c in spec.configs() if not spec.static_refusal(profile, c, problem)]
        if args.smoke:
            configs = configs[:1] + configs[-2:]  # a plain config and two stream levers
        cert = certified.config_for(spec, problem.dtypes, problem.flags, problem.dims)
        shipped = shipped_config(spec, problem)
        k = 1 if device == "cpu" else max(1, min(MAX_SETS, -(-int(args.rotate_mb * 2**20) // max(nbytes, 1))))
        sets = [make_set() for _ in range(k)]
        want = torch_fn(sets[0])
        sides = {"torch": lambda i: torch_fn(sets[i % k])}
        checks = {}
        for c in configs:
            name = str(c)
            try:
                checks[name] = check(nbx(c, sets[0]), want, ref, sets[0], exact)
            except Exception as e:  # a config that fails is reported, the row goes on
                checks[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}"
                continue
            sides[name] = (lambda i, c=c: nbx(c, sets[i % k]))
        for name, fn in extra.items():
            checks[name] = check(fn(sets[0]), want, ref, sets[0], exact)
            sides[name] = (lambda i, fn=fn: fn(sets[i % k]))
        times = graph_times(sides, rep_ms, device=device)
        ok = {s: t for s, t in times.items() if s != "torch" and s not in extra and checks.get(s) == "ok"}
        best = min(ok, key=ok.get) if ok else None
        rot = None
        if best is not None:  # the best config writing one output per input set (torch_compare's old nbx side)
            bc = next(c for c in configs if str(c) == best)
            outs = [torch.empty_like(want) for _ in range(k)]
            out_name = next(iter(spec.output_specs(problem)))

            def rot_fn(i, bc=bc):
                ins, out = sets[i % k], outs[i % k]
                if spec.name == "cat":
                    cp.launch_cat([ins["a"], ins["x1"]], out, problem.get("dim"), bc)
                else:
                    spec.launch(bc, problem, ins, {out_name: out})
            rot = graph_times({"rot": rot_fn, "torch": sides["torch"], best: sides[best]}, rep_ms, device=device)
        tt = times["torch"]
        lines = []
        for s, t in sorted(times.items(), key=lambda kv: kv[1]):
            lines.append({"side": s, "ms": t, "gbps": nbytes / t / 1e6 if t else None,
                          "torch_over": tt / t if t else None, "check": checks.get(s, "ok"),
                          "certified": s == str(cert), "shipped": s == shipped})
        res = {"row": sr["name"], "spec": spec.name, "shape": sr.get("shape") or sr["shapes"], "dtypes": problem.dtypes,
               "bytes": nbytes, "sets": k, "certified_config": str(cert), "best": best,
               "torch_over_best": tt / times[best] if best else None,
               "torch_over_certified": tt / times[str(cert)] if str(cert) in times else None,
               "shipped_config": shipped, "torch_over_shipped": tt / times[shipped] if shipped in times else None,
               "rot_out": rot, "sides": lines,
               "bad_configs": {s: v for s, v in checks.items() if v != "ok"}}
        report["rows"].append(res)
        print(f"\n== {sr['name']}: {spec.name} {','.join(problem.dtypes)} {sr.get('shape') or sr['shapes']}, "
              f"{nbytes / 1e6:.1f} MB moved, {k} input sets, served {cert}, shipped {shipped}")
        print(table([[ln["side"][:52], f"{ln['ms'] * 1e3:.2f}", f"{ln['gbps']:.0f}" if ln["gbps"] else "-",
                      f"{ln['torch_over']:.3f}" if ln["torch_over"] else "-",
                      ("served " if ln["certified"] else "") + ("shipped " if ln["shipped"] else "") + ln["check"]]
                     for ln in lines],
                    ["side", "us", "GB/s", "torch/side", "check"]))
        rot_txt = "-"
        if rot:
            rot_txt = f"{rot['torch'] / rot['rot']:.3f}"
            print(f"   best {best} writing one output per set (torch_compare's old nbx side): torch/it "
                  f"{rot_txt} (vs {rot['torch'] / rot[best]:.3f} allocating per call)")
        summary.append([sr["name"], f"{nbytes / 1e6:.1f}", f"{tt * 1e3:.2f}",
                        f"{times[best] * 1e3:.2f}" if best else "-",
                        f"{res['torch_over_best']:.3f}" if best else "-",
                        f"{res['torch_over_certified']:.3f}" if res["torch_over_certified"] else "-",
                        f"{res['torch_over_shipped']:.3f}" if res["torch_over_shipped"] else "-",
                        rot_txt, (best or "no config ok")[:44] + (f" ({len(res['bad_configs'])} bad)"
                                                                     if res["bad_configs"] else "")])
        del sets, sides, want
        if device == "cuda":
            torch.cuda.empty_cache()
        save("elementwise_rows.json", report)
    env = report["env"]
    print(f"\n{env['date']} {env['gpu']} driver {env['driver']} Triton {env['triton']} torch {env['torch']}")
    print(table(summary, ["row", "MB", "torch us", "best us", "torch/best", "torch/served", "torch/shipped",
                          "torch/best rot-out",
                          "best config"]))
    print(f"total {time.perf_counter() - t0:.0f} s; JSON {save('elementwise_rows.json', report)}")
    bad = [r["row"] for r in report["rows"] if r.get("bad_configs")]
    if bad:
        print(f"CONFIGS WRONG on: {', '.join(bad)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
