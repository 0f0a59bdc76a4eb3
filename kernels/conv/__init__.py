"""Convolutions: aten.convolution (not transposed), 1-D and 2-D, in fp16, bf16 and fp32.

Three kernels; the seat's `kind` flag (`seat_kind`) picks one:

- `_conv_gemm_kernel`, an implicit GEMM for every convolution whose groups see more than
  one input channel each (groups=1 and grouped), pointwise ones aside: M = N*H_out*W_out output pixels,
  N = C_out / groups, K = (C_in / groups)*KH*KW. The input patches are gathered on the
  fly (no im2col buffer): one loop runs over (filter tap, block of BLOCK_K input
  channels), so a tap's row offsets and padding masks are computed once per tile and the
  loop stays a single pipelined loop however small C_in is. A second grid axis runs over
  the groups. The kernel is stride-generic; configs with NHWC=1 copy the input
  channels-last (and the weight channels-innermost) first, which vectorizes the gathers.
- `_conv_pointwise_kernel` (kind=pointwise), for 1x1 filters with no padding and one group
  (any stride): per batch entry a plain GEMM Y[n] (C_out x OH*OW) = W (C_out x C_in) @
  X[n] (C_in x OH*OW), X[n] read through the input's own strides (NCHW, channels-last,
  views; the stride scales them), a grid axis over the batch, no pixel split into n/oh/ow
  where the pixel grid is one strided axis, so unit strides vectorize. Most of a ResNet's
  convolutions. Configs with SPLIT_K split C_in over programs (few tiles, long K: 7x7
  maps), fp32 partials summed in split order by `_pointwise_reduce_kernel` (reproducible).
- `_conv_depthwise_kernel`, a direct kernel for depthwise convolutions (one input channel
  per group: groups == C_in, C_out = groups * multiplier; also a C_in=1 convolution): a
  tile of output pixels x channels accumulates KH*KW scaled input windows, no reduction
  over channels and no tensor cores. It ignores BLOCK_K, GROUP_M and NHWC, so at a
  depthwise seat configs that differ only there are refused as `equivalent` (the same code).

The implicit GEMM and depthwise kernels take tiles of BLOCK_M output pixels x BLOCK_N
output channels (with NHWC); the pointwise kernel's configs (PW=1) take BLOCK_M output
channels x BLOCK_N pixels. Each seat launches only its kernel's configs: the others are
refused as `not_applicable`.

A 1-D convolution (input N, C, W) is a 2-D one with H = KH = 1, launched on 4-D views.

fp32 multiplies in IEEE fp32, not TF32. torch leaves `torch.backends.cudnn.allow_tf32`
True, so torch's own fp32 GPU convolutions round inputs to TF32 (10-bit mantissa, errors
near 1e-3 relative); the screen's fp32 tolerance is 1e-4 of max|ref| against an fp64
oracle, which TF32 fails at real reduction lengths, so IEEE is the only certifiable choice.

Launch key: dims (R, W, CI, CO, G) with R = N*H_out (output rows across the batch, the
`default` ladder), W = W_out (the `W` ladder: a 1-D convolution is one row per batch
entry, and its width is the sequence length), CI and CO the channel counts and G the
groups (`default`). The GEMM's M = R*W, N = CO/G and K = CI/G * taps all follow from them.
Flags: `kind` (gemm | depthwise | pointwise: which kernel), `filter` (KHxKW) and `stride` (SHxSW), which
are constexprs of the kernels (the tap loop and the input addressing are compiled for
them, and they set the gather's memory pattern and arithmetic intensity), and `bias`;
pointwise seats also `aligned` (`pointwise_align`: the vector width their pixel rows allow).
Padding and dilation are runtime values (masks and offsets): any config serves any of
them correctly, so they stay out of the seat (but for whether a 1x1 is padded: its kind). Every load and store is masked, so one
config is correct for every shape of a seat. Pointwise seats are screened at tile edges
too (`resized`); the other kinds at the shapes seen.

The family is three modules: `kernel.py` (the Triton kernels and their launchers), `spec.py`
(the `KernelSpec`) and `ops.py` (the public ops and their serve() route). The names other
modules use are re-exported here.
"""

from nbx_tune.kernels.conv.kernel import (_conv_depthwise_kernel, _conv_gemm_kernel, launch_conv_depthwise,
                                          launch_conv_gemm, launch_conv_pointwise, pixels_flat)
from nbx_tune.kernels.conv.spec import (ConvSpec, GEMM_CONFIGS, POINTWISE_CONFIGS, SPEC, TORCH_DTYPES,
                                        _is_pointwise_config, _parse_pair)
from nbx_tune.kernels.conv.ops import _span, conv1d, conv2d
