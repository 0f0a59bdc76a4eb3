#!/usr/bin/env bash
# Call 3 of 2026-12-05g: stage cost again (votes) with each pick's configs and what the
# census timed of autotune's pick at that seat (call 2 lost 7.8 % and 9.9 % at two seats);
# then stage recert (the shipped table made stale, a seeded 48 of its seats re-certified
# against a fresh census), both with the bytecode warmed for both sides.
set -u
bash bench/gpu_session.sh pycache cost
RECERT_S=430 bash bench/gpu_session.sh pycache recert
