#!/bin/bash
# Call 2 of 2026-12-05: transformers' Llama at Llama-2-7B's dims (2 layers): torch against
# serve() with every fusion, eager and in CUDA graphs (bench/serve_models.py, its own census
# first); the new fused families against fp64 in every dtype (bench/gpu_check.py); decode
# steps on a growing cache (lab/serve_eager_profile/growing_cache.py).
FINAL_OUT=$OUT
export OUT=/tmp/o; mkdir -p $OUT
SERVE_S=${SERVE_S:-380} SERVE_ARGS="--census-budget-s ${CENSUS_BUDGET_S:-150}" bash bench/gpu_session.sh pycache serve
export PYTHONPATH=/tmp/pkgroot:/tmp/site PYTHONPYCACHEPREFIX=/tmp/pycache NBX_TUNE_DB=sqlite:////tmp/nbx-session.db
timeout ${CHECK_S:-100} python3 bench/gpu_check.py --skip-fault --seconds 60 --configs-per-row 2 --jobs 12 \
  --kernels add_rms_norm,add_layer_norm,rope_cos_sin,cat_kv,rotary,rotary_qk,silu_mul 2>&1 | tail -25
timeout ${GROW_S:-70} python3 lab/serve_eager_profile/growing_cache.py --gpu --steps 12 2>&1 | tee $OUT/growing_cache.txt | tail -6
cp $OUT/session.log $OUT/serve_models.json $OUT/growing_cache.txt $OUT/gpu_check.json $FINAL_OUT/ 2>/dev/null
tar czf $FINAL_OUT/rest.tgz -C $OUT . 2>/dev/null
ls -la $FINAL_OUT
