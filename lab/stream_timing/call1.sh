#!/bin/bash
# Ran on 2026-12-05 (gpu_runs/2026-12-05c) with the four specs declared streams in the tree;
# they are not now: call3.sh declares them in the device's copy itself.
# The stream timing on the GPU: a smoke check of tuner/timing.stream_time, a census of the
# 85 seats timed as a stream (stream_rows.tsv: stale since the timing change) into the
# session database, its export, then bench/elementwise_rows.py against those picks.
FINAL_OUT=$OUT
export OUT=/tmp/o; mkdir -p $OUT
bash release/gpu_session.sh pycache >/dev/null
export PYTHONPATH=/tmp/pkgroot:/tmp/site PYTHONPYCACHEPREFIX=/tmp/pycache NBX_TUNE_DB=sqlite:////tmp/nbx-session.db PYTHONUNBUFFERED=1
python3 - <<'PY' 2>&1 | tee $OUT/smoke.log
import torch
from nbx_tune.tuner.timing.benchmarkers import DoBench
b = DoBench(25, 100)
for n in (65536, 4 << 20):
    xs = [torch.randn(n, device="cuda") for _ in range(4)]
    ys = [torch.empty_like(x) for x in xs]
    fns = [lambda x=x, y=y: torch.neg(x, out=y) for x, y in zip(xs, ys)]
    print(n, "launch", b(fns[0]), "\n", n, "stream", b.stream(fns), "\n", n, "round", b.stream(fns, "round:4"))
PY
CENSUS_TRACES=lab/stream_timing/stream_rows.tsv CENSUS_TOTAL_S=${CENSUS_TOTAL_S:-380} \
  bash release/gpu_session.sh census_all
EW_S=${EW_S:-120} EW_BUDGET_S=${EW_BUDGET_S:-80} bash release/gpu_session.sh ew
cp $OUT/session.log $OUT/hopper.json $OUT/smoke.log $OUT/elementwise_rows.json $FINAL_OUT/ 2>/dev/null
tar czf $FINAL_OUT/rest.tgz -C $OUT . 2>/dev/null
ls -la $FINAL_OUT
