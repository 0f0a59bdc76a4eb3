"""Element-wise ops: unary (relu, gelu, silu, sigmoid, tanh, exp, log, neg, rsqrt, sqrt, sin,
cos, pow by a scalar) and binary with broadcasting (add, sub, rsub, mul, div, maximum,
minimum) in fp16, bf16 and fp32.

Two specs, one per kernel: `elementwise_unary` (one stream in, contiguous or strided, one
contiguous out) and `elementwise_binary` (two operands, each contiguous, a scalar, or
strided/broadcast). They
are separate kernels because their launchers, inputs and code paths differ; inside each,
the function is a constexpr (`fn=gelu_tanh`), so it is a seat flag. Every op computes in
fp32 (load, `.to(tl.float32)`, compute, cast on store), which is what torch's CUDA kernels
do for fp16/bf16 ("opmath") and keeps bf16 correct.

Launch key: the element count on the `elements` ladder (DESIGN: "elementwise: the element
count"); the binary kernel's layout (`same`: both operands contiguous and of the output's
shape; `scalar`: one is a single value; `bcast`: any other, indexed through broadcast
strides) is a flag, because it changes the code.

The binary dtype signature is (output, a, b): the output leads, so the screen's tolerance
(`dtypes[0]`) is the output's. Output dtypes follow torch's promotion: two dimensioned
operands promote (fp16 + bf16 -> fp32, anything + fp32 -> fp32); a 0-d operand (a wrapped
Python number is recorded as a 0-d float64 / int64 tensor) takes the other's dtype.

The family is three modules: `kernel.py` (the Triton kernels and their launchers), `spec.py`
(the two `KernelSpec`s) and `ops.py` (the public ops and their serve() routes). The names
other modules use are re-exported here.
"""

from nbx_tune.kernels.elementwise.kernel import (FLAT, INDEX_LIMIT, SCALAR, STRIDED, VALUE, _contiguous_strides,
                                                 _stream_load, _stream_store, _tanh_f32, _unary_math, binary_plan,
                                                 launch_binary, launch_unary, pow_params, small_int_pow, unary_plan)
from nbx_tune.kernels.elementwise.spec import (BINARY_FNS, BINARY_SPEC, CONFIGS, DEFAULTS, ElementwiseBinarySpec,
                                               ElementwiseUnarySpec, SPECS, TORCH_DTYPES, UNARY_FNS, UNARY_SPEC,
                                               layout_of, result_dtype)
from nbx_tune.kernels.elementwise.ops import (add, cos, div, exp, gelu, log, maximum, minimum, mul, neg, pow, relu,
                                              rsqrt, rsub, sigmoid, silu, sin, sqrt, sub, tanh)
