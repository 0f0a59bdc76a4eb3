#!/usr/bin/env bash
# One device call of the thirty-third session: on an H200, issue 27's census goal three
# times (stage cost); on any other GPU, where the cases go (case_phases.py), then stage cost
# once. Outputs under $OUT, renamed per run (only a few files come back).
set -u
bash bench/gpu_session.sh pycache >/dev/null 2>&1
export PYTHONPATH=/tmp/pkgroot:/tmp/site PYTHONPYCACHEPREFIX=/tmp/pycache
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)
echo "gpu: $gpu; cores $(nproc); $(date -u +%FT%TZ)"
cost() {  # $1: the run's tag
  COST_S=${COST_S:-230} bash bench/gpu_session.sh pycache cost | tail -16
  mv "$OUT/tuning_cost.json" "$OUT/$1-tuning_cost.json" 2>/dev/null
  mv "$OUT/session.log" "$OUT/$1-session.log" 2>/dev/null
}
case "$gpu" in
  *H200*) for r in ${H200_RUNS:-a b c}; do cost "48$r"; done ;;
  *) python3 lab/certify_cost/case_phases.py > "$OUT/48-case_phases.log" 2>&1
     tail -40 "$OUT/48-case_phases.log"
     cost 48a ;;
esac
