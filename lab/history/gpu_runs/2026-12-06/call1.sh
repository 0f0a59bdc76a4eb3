#!/usr/bin/env bash
# Call 1 of 2026-12-06: stage cost on the working tree (each quick estimate taken as its
# config is screened; no process waited for at the census's end), then on the session's
# starting code (basecopy/, an untracked copy of 169e43d with .whl linked in), side by side
# on one machine.
set -u
bash bench/gpu_session.sh pycache cost
(cd basecopy && OUT=$OUT/base bash bench/gpu_session.sh pycache cost)
