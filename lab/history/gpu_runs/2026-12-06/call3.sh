#!/usr/bin/env bash
# Call 3 of 2026-12-06: stage profile on 8f8365d (the census of the Llama-2-7B matmul rows
# on a timeline: call 2's censuses spent 6 s outside their seats on this H200).
set -u
bash bench/gpu_session.sh pycache profile
