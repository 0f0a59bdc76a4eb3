#!/usr/bin/env bash
# One device call (about 560 s on an H100): the shipped hopper table imported, every seat a
# kernel edit left stale re-certified from its history (every example trace, fused ones too),
# torch baselines measured again for all seats, the export, then serve() against torch on
# OpInfo at fp16/bf16 in what time is left. Run from the repository root on the GPU machine
# with the wheels in .whl (carry .whl). Then, here:
#   python3 release/merge_table.py $FILES/hopper_b.json --kernels elementwise_unary,silu_mul
set -u
export OUT=${OUT:-bench_out}
CENSUS_TRACES='examples/traces/*_bf16.tsv examples/traces/*_fused.tsv' CENSUS_TOTAL_S=${CENSUS_TOTAL_S:-300} \
  IMPORT_S=60 bash release/gpu_session.sh pycache refresh > "$OUT/refresh.txt" 2>&1
grep "=== done" "$OUT/refresh.txt"
export PYTHONPATH=/tmp/pkgroot:/tmp/site NBX_TUNE_DB=sqlite:////tmp/nbx-session.db \
  PYTHONPYCACHEPREFIX=/tmp/pycache PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
T=$(for t in examples/traces/*.tsv; do printf -- '--model %s ' "$t"; done)
timeout 140 python3 -m nbx_tune.cli.app baseline --budget-s 110 $T --json > "$OUT/baseline.json" 2> "$OUT/baseline.err"
echo "baseline rc $? at ${SECONDS}s"
python3 -m nbx_tune.cli.app export --profile hopper -o "$OUT/hopper_b.json" 2>&1 | tail -1
left=$((580 - SECONDS))
if [ "$left" -gt 30 ]; then
  timeout "$left" python3 bench/opinfo_serve.py --max-samples 4 --dtypes bfloat16,float16 > "$OUT/opinfo.txt" 2> "$OUT/opinfo.err"
  echo "opinfo rc $?"; tail -12 "$OUT/opinfo.txt"
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
