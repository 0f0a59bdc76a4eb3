#!/usr/bin/env bash
# Call 1 of 2026-12-05h: stage cost on the code before this session (basecopy/, an
# untracked copy of 9f9aaf5) and on the working tree (rounds that stop once two agree, the
# worker's warm-up, the Freivalds check beside the GPU product), side by side on one
# machine; then stage profile (the census's timeline and the worker's cProfile).
set -u
(cd basecopy && OUT=$OUT/base bash bench/gpu_session.sh pycache cost)
bash bench/gpu_session.sh pycache cost profile
