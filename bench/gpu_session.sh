#!/usr/bin/env bash
# One device session, in priority order, each stage under its own time limit so that a
# slow stage costs only itself. Usage (on the GPU machine, from the repo root):
#   bash bench/gpu_session.sh        (outputs and logs under $OUT)
set -u
OUT=${OUT:-bench_out}; mkdir -p "$OUT"
LOG="$OUT/session.log"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
# The repository root is the package nbx_tune: put a link to it on the path.
mkdir -p /tmp/pkgroot && ln -sfn "$PWD" /tmp/pkgroot/nbx_tune
export PYTHONPATH=/tmp/pkgroot:/tmp/site:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1 NBX_TUNE_DB=sqlite:////tmp/nbx-session.db
unset TRITON_INTERPRET
stage() { local secs=$1; shift; echo "=== $* (limit ${secs}s)" | tee -a "$LOG"
  local t0=$(date +%s); timeout "$secs" "$@" 2>&1 | tee -a "$LOG" | grep -v '^  \|^$' | tail -n 60
  echo "=== done in $(( $(date +%s) - t0 ))s: $*" | tee -a "$LOG"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$LOG"
stage ${FAULT_S:-30} python3 bench/gpu_check.py --skip-correctness
stage ${CHECK_S:-80} python3 bench/gpu_check.py --skip-fault --seconds ${CHECK_RUN_S:-55} --configs-per-row 1
stage ${COST_S:-110} python3 bench/tuning_cost.py examples/traces/llama2_7b_seq512_bf16.tsv
stage ${CENSUS_S:-65} sh -c "python3 -m nbx_tune.cli.app census --model examples/traces/llama2_7b_seq512_bf16.tsv --json > $OUT/census_llama.json; python3 bench/screen_share.py"
stage 12 python3 -m nbx_tune.cli.app export --profile hopper -o "$OUT/hopper.json"
stage ${LAUNCH_S:-30} python3 bench/launch_overhead.py
