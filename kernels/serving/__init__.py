"""The serving layer: `serve()` (aten ops onto the kernels at the dispatcher), the fusions
that swap a model's known patterns for one op, the hand-off of a layer's last add to the
next layer's norm, and the library's own torch ops."""
