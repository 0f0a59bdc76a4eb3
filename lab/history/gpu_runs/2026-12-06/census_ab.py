"""Census-only A/B: the Llama-2-7B seq512 matmul rows (as bench/tuning_cost.py builds them)
censused by two package trees in turn (A, B, A, B, ...), each with a fresh database and an
empty Triton cache, bytecode warmed first for both. Prints each run's wall time and where
its seats' seconds went. Usage: python3 census_ab.py ROOT_A ROOT_B [PAIRS]
(ROOT_*: a directory holding the package as nbx_tune/); more trees: AB_ROOTS="ROOT_C ..." are
censused after A and B in each round."""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

roots = sys.argv[1:3] + os.environ.get("AB_ROOTS", "").split()
pairs = int(sys.argv[3]) if len(sys.argv) > 3 else 2
work = Path(tempfile.mkdtemp(prefix="nbx-ab-"))
out_dir = Path(os.environ.get("OUT", "."))
site = "/tmp/site"


def env_for(root, **kw):
    env = {**os.environ, "PYTHONPATH": f"{root}:{site}", **kw}
    env.pop("TRITON_INTERPRET", None)
    return env


make = """
import sys
from nbx_tune.tuner.trace import read_trace, write_trace, make_row
rows = [r for r in read_trace(sys.argv[1]).rows if r.base_op in ("aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm")]
rows += [make_row("aten.mm", [dt, dt], [(4096, 4096), (4096, 4096)]) for dt in ("float16", "bfloat16")]
write_trace(sys.argv[2], rows, comments=["matmul rows"])
"""
trace = work / "mm.tsv"
subprocess.run([sys.executable, "-c", make, "examples/traces/llama2_7b_seq512_bf16.tsv", str(trace)],
               env=env_for(roots[0]), check=True)
warm = "import torch, triton, numpy, sqlalchemy; import nbx_tune.kernels.registry as r; r.all_specs(); import nbx_tune.cli.app"
for root in roots:
    subprocess.run([sys.executable, "-c", warm], env=env_for(root), check=True)

q = """
import sys, json
from sqlalchemy import create_engine, text
e = create_engine(sys.argv[1])
with e.connect() as c:
    print(json.dumps([list(r) for r in c.execute(text("SELECT search, count(*), sum(total_s), sum(screen_s), sum(bench_s) FROM tunings WHERE kind = 'tune' GROUP BY search ORDER BY search"))]))
"""
results = {r: [] for r in roots}
for i in range(pairs):
    for side, root in zip("ABCDEF", roots):
        tag = f"{side}{i}"
        db = f"sqlite:///{work / (tag + '.db')}"
        env = env_for(root, NBX_TUNE_DB=db, NBX_TUNE_SEARCH="ranked", TRITON_CACHE_DIR=str(work / f"cache_{tag}"))
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "nbx_tune.cli.app", "census", "--model", str(trace), "--json"],
                           env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if r.returncode:
            print(tag, "failed", r.stderr[-2000:])
            continue
        br = json.loads(subprocess.run([sys.executable, "-c", q, db], env=env, capture_output=True, text=True,
                                       check=True).stdout)
        results[root].append(wall)
        print(f"{tag} {root}: census {wall:.1f} s; " + "; ".join(
            f"{s} x{n}: {t:.1f} s in seats (screen {sc:.1f}, timing {b:.1f}, rest {t - sc - b:.1f})"
            for s, n, t, sc, b in br), flush=True)
for side, root in zip("ABCDEF", roots):
    xs = results[root]
    if xs:
        print(f"{side} {root}: median {statistics.median(xs):.1f} s over {len(xs)}: {', '.join(f'{x:.1f}' for x in xs)}")
