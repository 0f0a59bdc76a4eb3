#!/usr/bin/env bash
# One device session, in stages, each under its own time limit so that a slow stage costs
# only itself. Usage (on the GPU machine, from the repo root; outputs and logs under $OUT):
#   bash release/gpu_session.sh                 every stage, in this order
#   bash release/gpu_session.sh fault check     only those (one device call each fits 600 s:
#                                             "fault check", "census launch", "cost quality")
# trust (planted subtle faults refused; no correct config of any kernel refused as imprecise or
# nondeterministic), oracle (the fp64 oracle's cost at the largest example shapes), census8b (a
# Llama-3-8B prefill with its 128k-vocabulary LM head, then the screen's share and `unscreened`).
# census_all: one census of every bf16 example trace's rows (CENSUS_TRACES), then the export.
# baseline: the shipped hopper table imported, then `nbx-tune baseline` over every example trace (each
# certified seat against torch's op on this GPU, recorded: serve() runs torch where it is faster;
# BASELINE_TRACES, BASELINE_BUDGET_S), then the export that carries the baselines. baseline_import:
# only the import (the shipped table, its baselines with it) into the session database.
# refresh: the shipped hopper table imported (each entry screened here), then census_all: only
# the seats a code change left stale or new are tuned, from their history; then the export.
# masked, routing, eager, opinfo, zoo (issues 63 and 66: bench/masked_attention.py, the routing and mask
# families' GPU proof then bench/moe_routing.py, bench/eager_models.py, bench/opinfo_serve.py, bench/model_zoo_coverage.py;
# *_ARGS pass arguments, *_S limits). Other stages: coverage (the data-movement, batch norm and pooling families and the integer
# element-wise path against fp64, every dtype), served (what the launch read serves: shipped table,
# another target, a sibling device), direct (the direct launch's GPU proof, every family), tma (every TMA config at odd shapes), profile (a census under cProfile),
# pointwise (ResNet-50's 1x1 convolutions: torch, the implicit GEMM's old certified config, the
# pointwise kernel's default and best PW config), fleet (one GPU's worker against two on the same queue, cold caches; needs 2 GPUs),
# compare (every served row of the example traces against torch: bench/torch_compare.py), agree (each
# kernel's configs timed as the census times them, as a stream and under graph replay: which timing
# picks replay's best, bench/timing_agreement.py), ew (the
# element-wise/copy rows that lose to torch: every config of their spaces vs torch, bench/elementwise_rows.py), speed (new GEMM
# and attention candidates against fp64, then every config of the space timed against torch, certified and the HBM floor),
# attn (every prefill attention config, the Hopper levers included, checked and timed against torch's SDPA at the
# Llama-3-8B, Llama-2-7B and GPT-2 prefill shapes: bench/attention_prefill.py),
# recert (the shipped hopper table made stale by a source change, then a seeded sample of 48 of its
# seats, every kernel in it, re-certified against a fresh census of them, cold caches, about 5 min;
# RECERT_ARGS="--seats all --parallel" for all 148 on a two-GPU host, the sides side by side;
# RECERT_ARGS=--control adds a second fresh census timed against the first, the loss measure's floor, about 100 s),
# fused (the rotary, rotary_qk, rope_cos_sin, silu_mul, add_rms_norm, add_layer_norm and cat_kv families against fp64 in every dtype, then bench/fused_ops.py: each
# against the torch pattern it replaces at Llama-7B's shapes, device and eager time), serve (transformers' Llama at 7B's dims, 2 layers: the timed prefill and decode traced, their
# census into the session database (SERVE_ARGS="--census-budget-s N", default 180; --no-census
# skips it), then torch against serve(), eager and CUDA graphs; needs transformers' wheels in .whl), pycache (later stages keep Python's bytecode under /tmp/pycache, as an installed package
# has it: the device image ships torch without .pyc files, so every process compiles
# torch's sources as it imports them). Studies (lab/<study>/) are run directly, not from here.
# compile (bench/compile_serve.py: torch.compile default / max-autotune / with nbx-tune / serve() around it, eager and
# in CUDA graphs, with compile times; COMPILE_ARGS, default two models), inductor (Inductor's GEMM template choices
# certified for the Llama-7B trace, then compile_serve with that table: the "compile + nbx table" row).
# moe_check (the grouped expert GEMM against fp64, every dtype), moe (the census of bench/moe_layer.py's
# expert seats: Mixtral-8x7B, Qwen2-MoE-A2.7B, a DeepSeek-style layer at 1-4096 tokens, then the export to
# $OUT/moe_hopper.json), moe_time (those layers under serve() against torch's grouped_mm and expert loop,
# CUDA graphs: bench/moe_layer.py; MOE_ARGS e.g. --layers mixtral --tokens 1,4096).
# Limits are env overrides: TRUST_S ORACLE_S CENSUS8B_S FAULT_S CHECK_S CHECK_RUN_S CENSUS_S LAUNCH_S COST_S QUALITY_S
# AGREE_S BASELINE_S COVERAGE_S SERVED_S DIRECT_S POINTWISE_S TMA_S PROFILE_S FLEET_S RECERT_S COMPARE_S SPEED_S ATTN_S SERVE_S EW_S
# (COMPARE_BUDGET_S, SPEED_BUDGET_S, ATTN_BUDGET_S, EW_BUDGET_S: when compare, speed, attn, ew stop starting new work);
# CENSUS_TRACES: the trace files of the census stage, CENSUS_TOTAL_S its whole budget; COMPARE_TRACES: the compare stage's (default all); QUALITY_ARGS: e.g. --buckets-only;
# RECERT_ARGS: e.g. --seats all, --seats 30 --seed 1; AGREE_ARGS: e.g. --kernels matmul --rows 12; EW_ARGS: e.g. --rotate-mb 0 (inputs warm in the L2).
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
  local t0=$(date +%s); timeout "$secs" "$@" 2>&1 | tee -a "$LOG" | grep -v '^  \|^$' | tail -n 80
  echo "=== done in $(( $(date +%s) - t0 ))s: $*" | tee -a "$LOG"; }
census() {  # census of one trace into the session database, its report kept
  stage "$1" sh -c "python3 -m nbx_tune.cli.app census --model $2 --json > $OUT/census_$(basename $2 .tsv).json"
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$LOG"
STAGES=${*:-fault check census launch cost quality}
for s in $STAGES; do case $s in
  fault) stage ${FAULT_S:-60} python3 proofs/gpu_check.py --skip-correctness ;;
  check) stage ${CHECK_S:-360} python3 proofs/gpu_check.py --skip-fault --seconds ${CHECK_RUN_S:-300} \
           --configs-per-row 2 --jobs 12 ;;
  coverage) stage ${COVERAGE_S:-240} python3 proofs/gpu_check.py --skip-fault --seconds 200 --configs-per-row 3 \
              --jobs 12 --kernels copy,cat,embedding,fill,batch_norm,max_pool2d,elementwise_binary ;;
  import) for t in bench_out/*.json; do  # tables of an earlier call (carry bench_out), so a census resumes
            [ -f "$t" ] && stage 30 python3 -m nbx_tune.cli.app import "$t"; done ;;
  census) c0=$(date +%s)  # CENSUS_TOTAL_S: no trace starts after it, none runs past it
          for t in ${CENSUS_TRACES:-examples/traces/llama2_7b_seq512_bf16.tsv examples/traces/gpt2_seq1024_bf16.tsv \
                                   examples/traces/resnet50_b8_bf16.tsv}; do
            left=$(( ${CENSUS_TOTAL_S:-100000} - ($(date +%s) - c0) )); lim=${CENSUS_S:-150}
            [ "$left" -lt "$lim" ] && lim=$left
            if [ "$lim" -gt 5 ]; then census $lim $t; else echo "=== skipped (census budget spent): $t" | tee -a "$LOG"; fi
          done
          stage 30 python3 bench/screen_share.py
          stage 30 python3 -m nbx_tune.cli.app export --profile hopper -o "$OUT/hopper.json" ;;
  census_all) python3 testing/bench.py /tmp/all_traces.tsv ${CENSUS_TRACES:-examples/traces/*_bf16.tsv}
              census ${CENSUS_TOTAL_S:-540} /tmp/all_traces.tsv
              stage 30 python3 -m nbx_tune.cli.app export --profile hopper -o "$OUT/hopper.json" ;;
  refresh) stage ${IMPORT_S:-240} python3 -m nbx_tune.cli.app import kernels/tables/hopper.json
           python3 testing/bench.py /tmp/all_traces.tsv ${CENSUS_TRACES:-examples/traces/*_bf16.tsv}
           census ${CENSUS_TOTAL_S:-300} /tmp/all_traces.tsv
           stage 30 python3 -m nbx_tune.cli.app export --profile hopper -o "$OUT/hopper.json" ;;
  baseline_import) stage ${IMPORT_S:-240} python3 -m nbx_tune.cli.app import kernels/tables/hopper.json ;;
  baseline) stage ${IMPORT_S:-240} python3 -m nbx_tune.cli.app import kernels/tables/hopper.json
            stage ${BASELINE_S:-330} sh -c "python3 -m nbx_tune.cli.app baseline --budget-s ${BASELINE_BUDGET_S:-270} \
              $(for t in ${BASELINE_TRACES:-examples/traces/*.tsv}; do printf -- '--model %s ' "$t"; done) --json > $OUT/baseline.json"
            stage 30 python3 -m nbx_tune.cli.app export --profile hopper -o "$OUT/hopper.json" ;;
  pointwise) stage ${POINTWISE_S:-300} python3 bench/conv_pointwise.py --budget-s 240 ;;
  trust) stage ${TRUST_S:-240} python3 proofs/gpu_check.py --skip-fault --planted --seconds 170 \
           --configs-per-row 3 --jobs 12 ;;
  oracle) stage ${ORACLE_S:-240} python3 bench/oracle_cost.py ${ORACLE_ARGS:---budget-s 200} ;;
  census8b) census ${CENSUS8B_S:-500} examples/traces/llama3_8b_seq1024_bf16.tsv
            stage 30 python3 bench/screen_share.py
            stage 30 sh -c "python3 -m nbx_tune.cli.app unscreened --json > $OUT/unscreened.json; cat $OUT/unscreened.json | head -c 2000" ;;
  launch) stage ${LAUNCH_S:-150} python3 bench/launch_overhead.py ${LAUNCH_ARGS:-} ;;
  fused) stage ${FUSED_S:-240} python3 proofs/gpu_check.py --skip-fault --seconds 100 --configs-per-row 3 \
           --jobs 12 --kernels rotary,rotary_qk,silu_mul,add_rms_norm,add_layer_norm,rope_cos_sin,cat_kv
         stage ${FUSED_S:-240} python3 bench/fused_ops.py ;;
  moe_check) stage ${MOE_CHECK_S:-300} python3 proofs/gpu_check.py --skip-fault --seconds 240 --configs-per-row 3 \
           --kernels moe_experts ;;
  moe) stage ${MOE_S:-560} python3 bench/moe_layer.py --census-only --census-budget-s ${MOE_CENSUS_S:-480}
       python3 -m nbx_tune.cli.app export --profile hopper -o "$OUT/moe_hopper.json" ;;
  moe_time) stage ${MOE_TIME_S:-560} python3 bench/moe_layer.py --no-census ${MOE_ARGS:-} ;;
  served) stage ${SERVED_S:-60} python3 bench/served_tables.py ;;
  masked) stage ${MASKED_S:-560} python3 bench/masked_attention.py ${MASKED_ARGS:---only mistral --shapes prefill} ;;
  routing) stage ${ROUTING_CHECK_S:-240} python3 proofs/gpu_check.py --skip-fault --seconds 200 --configs-per-row 3 \
             --kernels row_sort,index_rows,index_nd,index_put_rows,gather,all_any,cumsum,histc,floor_divide,stack,compare,where,copy,fill
           stage ${ROUTING_S:-300} python3 bench/moe_routing.py ;;
  eager) stage ${EAGER_S:-560} python3 bench/eager_models.py ${EAGER_ARGS:-} ;;
  opinfo) stage ${OPINFO_S:-300} python3 bench/opinfo_serve.py ${OPINFO_ARGS:---max-samples 8} ;;
  zoo) stage ${ZOO_S:-560} python3 bench/model_zoo_coverage.py --census --dtype bfloat16 ${ZOO_ARGS:-} ;;
  direct) stage ${DIRECT_S:-300} python3 proofs/direct_launch_check.py ;;
  fleet) stage ${FLEET_S:-500} python3 bench/fleet_scaling.py --gpus 0 0,1 ${FLEET_ARGS:-} ;;
  tma) stage ${TMA_S:-200} python3 proofs/tma_check.py ;;
  profile) stage ${PROFILE_S:-150} python3 bench/tuning_cost.py examples/traces/llama2_7b_seq512_bf16.tsv \
             --profile "$OUT/profile" ;;
  speed) stage ${SPEED_S:-330} python3 bench/speed_candidates.py --budget-s ${SPEED_BUDGET_S:-270} ;;
  attn) stage ${ATTN_S:-240} python3 bench/attention_prefill.py --budget-s ${ATTN_BUDGET_S:-180} ;;
  compare) stage ${COMPARE_S:-330} python3 bench/torch_compare.py --budget-s ${COMPARE_BUDGET_S:-270} ${COMPARE_TRACES:-} ;;
  agree) stage ${AGREE_S:-330} python3 bench/timing_agreement.py --budget-s ${AGREE_BUDGET_S:-270} \
         ${AGREE_ARGS:---kernels conv,attention,elementwise_binary,elementwise_unary --rows 5} ;;  # census timing vs graph replay
  ew) stage ${EW_S:-240} python3 bench/elementwise_rows.py --budget-s ${EW_BUDGET_S:-150} ${EW_ARGS:-} ;;  # losing element-wise rows: every config vs torch
  pycache) export PYTHONPYCACHEPREFIX=/tmp/pycache; unset PYTHONDONTWRITEBYTECODE
           echo "=== bytecode cached under $PYTHONPYCACHEPREFIX from here on" | tee -a "$LOG" ;;
  cost) stage ${COST_S:-280} python3 bench/tuning_cost.py examples/traces/llama2_7b_seq512_bf16.tsv ;;
  recert) stage ${RECERT_S:-420} python3 bench/recertify_cost.py ${RECERT_ARGS:-} ;;  # shipped hopper seats: re-certified vs fresh
  replay) stage 60 python3 bench/ranking_replay.py ;;  # rankers replayed on the session database's full tunings
  quality) stage ${QUALITY_S:-280} python3 bench/kernel_quality.py ${QUALITY_ARGS:-} ;;
  serve) stage ${SERVE_S:-420} python3 bench/serve_models.py ${SERVE_ARGS:-} ;;
  compile) stage ${COMPILE_S:-560} python3 bench/compile_serve.py ${COMPILE_ARGS:---models llama,qwen2 --budget-s 240} ;;
  inductor) stage ${INDUCTOR_S:-560} sh -c "python3 bench/inductor_choices.py --trace examples/traces/llama2_7b_seq512_bf16.tsv \
              -o $OUT/inductor_choices.json --budget-s 300 && python3 -m nbx_tune.cli.app inductor list --json \
              > $OUT/inductor_list.json && NBX_TUNE_INDUCTOR_TABLE=$OUT/inductor_choices.json \
              python3 bench/compile_serve.py --models llama --no-census" ;;
  *) echo "unknown stage $s" | tee -a "$LOG" ;;
esac; done
