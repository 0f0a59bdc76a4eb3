#!/usr/bin/env bash
# Call 2 of 2026-12-05h: stage cost on the working tree (audits and full tunings run every
# round again), then on the code before this session (basecopy/, an untracked copy of
# 9f9aaf5 with .whl linked in: call 1's base run found no wheels), side by side on one
# machine.
set -u
bash bench/gpu_session.sh pycache cost
(cd basecopy && OUT=$OUT/base bash bench/gpu_session.sh pycache cost)
