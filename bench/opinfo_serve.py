"""serve() against torch on PyTorch's OpInfo samples, on a GPU at fp16 and bf16 (the CPU
interpreter's CI test, tests/test_serve_opinfo.py, covers fp32, integers and bool).

    python bench/opinfo_serve.py                 # cuda, float16 and bfloat16, every sample
    python bench/opinfo_serve.py --smoke         # CPU interpreter, float32, 1 sample per op

Prints `dtype  ops  samples  served  to-torch  mismatches` per dtype and every mismatch;
writes opinfo_serve.json under $OUT when set. Exit 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


# An out-of-range embedding index under serve() on a GPU: the device-side assert must end
# the child (as torch's own kernel does) with no value printed; run apart, since a failed
# assert ends the CUDA context of the process it fires in.
_ASSERT_CHILD = """
import torch, torch.nn.functional as F
from nbx_tune.kernels.serving.serve import serve
table = torch.randn(5, 4, device="cuda", dtype=torch.float16)
with serve(fuse=False):
    y = F.embedding(torch.tensor([0, 5], device="cuda"), table)
    torch.cuda.synchronize()
print("VALUE", y.tolist())
"""


def device_assert_check() -> dict:
    import subprocess

    p = subprocess.run([sys.executable, "-c", _ASSERT_CHILD], capture_output=True, text=True, timeout=120)
    text = p.stdout + p.stderr
    ok = p.returncode != 0 and "VALUE" not in p.stdout and ("device-side assert" in text or "index out of range" in text)
    return {"ok": ok, "returncode": p.returncode, "tail": text[-400:]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="CPU interpreter, float32, 1 sample per OpInfo")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--max-samples", type=int, default=None, help="samples per OpInfo and dtype")
    args = ap.parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    from nbx_tune.testing import opinfo

    device = "cpu" if args.smoke else "cuda"
    dtypes = ["float32"] if args.smoke else args.dtypes.split(",")
    max_samples = 1 if args.smoke else args.max_samples
    rows, total = [], opinfo.Report()
    for name in dtypes:
        dt = getattr(torch, name)
        rep = opinfo.run_opinfo(device, [dt], max_samples=max_samples)
        opinfo.run_extra(device, [dt], report=rep)
        rows.append((name, rep))
        total.merge(rep)
    print(f"{'dtype':<9} {'ops':>4} {'samples':>8} {'served':>7} {'to-torch':>8} {'nearer-fp64':>11} {'mismatches':>10}")
    for name, rep in rows:
        print(f"{name:<9} {len(rep.ops):>4} {rep.samples:>8} {rep.served:>7} {rep.fell_through:>8} "
              f"{rep.nearer_exact:>11} {len(rep.mismatches):>10}")
    print("total:", total.line())
    assert_check = None if args.smoke else device_assert_check()
    if assert_check is not None:
        print("embedding index out of range under serve():",
              "device-side assert, no value" if assert_check["ok"] else f"NOT REFUSED: {assert_check['tail']}")
    for m in total.mismatches:
        known = " (known)" if m.op in opinfo.known_for(device) else ""
        print(f"MISMATCH{known} {m.op} {m.dtype}: {m.why} | {m.sample}")
    if os.environ.get("OUT"):
        from nbx_tune.testing.bench import environment, out_dir

        doc = {"environment": environment(), "device": device,
               "per_dtype": {n: {"ops": len(r.ops), "samples": r.samples, "served": r.served,
                                 "to_torch": r.fell_through, "nearer_exact": r.nearer_exact,
                                 "mismatches": len(r.mismatches)}
                             for n, r in rows},
               "mismatches": [vars(m) for m in total.mismatches], "device_assert": assert_check}
        (out_dir() / "opinfo_serve.json").write_text(json.dumps(doc, indent=1, default=str))
    failed = any(m.op not in opinfo.known_for(device) for m in total.mismatches)
    return 1 if failed or (assert_check is not None and not assert_check["ok"]) else 0


if __name__ == "__main__":
    sys.exit(main())
