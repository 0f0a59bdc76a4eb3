"""Helpers shared by the tests, bench/ and lab/: planted kernels, a fake of compiled kernels,
the bench scripts' measurement and report helpers, and the serve() differential harness
against PyTorch's OpInfo database (opinfo.py). Not imported by the product."""
