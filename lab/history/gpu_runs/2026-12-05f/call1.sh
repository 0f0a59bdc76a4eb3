#!/usr/bin/env bash
# Call 1 of 2026-12-05f: issue 27's census cost against triton.autotune, with the shipped
# table's votes (default) and without (BENCH_SEARCH=cold); then the num_ctas=2 sweep.
set -u
O=${OUT:-bench_out}
OUT=$O/default COST_S=250 bash bench/gpu_session.sh pycache cost
OUT=$O/cold BENCH_SEARCH=cold COST_S=250 bash bench/gpu_session.sh pycache cost
export PYTHONPATH=/tmp/pkgroot:/tmp/site PYTHONPYCACHEPREFIX=/tmp/pycache
OUT=$O timeout 150 python3 lab/gemm_clusters/sweep.py 2>&1 | tee $O/clusters.log | tail -n 40
