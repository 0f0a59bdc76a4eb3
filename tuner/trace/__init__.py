"""Traces: PyTorch programs recorded as trace v1 files (`recorder`, run in a child by
`recorder_main`), and `nbx-tune run` (`serve_main`: a program under serve())."""
