#!/usr/bin/env bash
# Call 4 of 2026-12-05g: the correctness stages docs/benchmarks.md lists as not run over the
# kernels changed since: check (every kernel's example rows against fp64, every dtype, two
# configs a row) and direct (the direct launch's GPU proof, every family).
set -u
CHECK_S=250 CHECK_RUN_S=215 bash bench/gpu_session.sh pycache check
DIRECT_S=270 bash bench/gpu_session.sh pycache direct
