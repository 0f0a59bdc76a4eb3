"""The launch-time runtime: the certified read (`certified`, `certified_view`), the direct
launch's record and replay (`launch`), the registry of kernels, the validity and torch
rules, and the exported table's format."""
