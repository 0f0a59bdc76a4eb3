"""Helpers shared by the tests, bench/ and lab/: planted kernels, a fake of compiled kernels,
the bench scripts' measurement and report helpers. Not imported by the product."""
