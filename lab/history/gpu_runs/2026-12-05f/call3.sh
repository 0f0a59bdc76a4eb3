#!/usr/bin/env bash
# Call 3 of 2026-12-05f: conv timed as a stream (kernels/conv.py) stales the 23 conv seats:
# the shipped table imported, ResNet-50's census certifies them again, the export; then
# ResNet-50's rows against torch on the new picks (session DB first, then shipped table).
set -u
CENSUS_TRACES=examples/traces/resnet50_b8_bf16.tsv CENSUS_TOTAL_S=240 bash bench/gpu_session.sh pycache refresh
COMPARE_TRACES=examples/traces/resnet50_b8_bf16.tsv COMPARE_BUDGET_S=170 COMPARE_S=220 bash bench/gpu_session.sh pycache compare
