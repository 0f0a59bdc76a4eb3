"""Certified max-autotune choices: Inductor's GEMM template configs screened and timed (choices.py)."""
