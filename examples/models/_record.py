"""Shared driver of the example recorders: build a model at a scale, record one forward.

Each example script declares its scales and calls `main(SCALES)`. Weights are random (the
model's own init under a fixed seed); nothing is downloaded. Small scales run on the CPU in
float32; real scales are built on the meta device, so a 7B model is traced without
allocating it.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass
from typing import Callable

import torch
import transformers

from nbx_tune.tuner.trace.recorder import record


@dataclass(frozen=True)
class Scale:
    describe: str                       # written into the trace's comments
    build: Callable[[], torch.nn.Module]
    inputs: Callable[[], dict]          # keyword arguments of the forward call
    device: str
    dtype: torch.dtype


def prefill(describe: str, model: Callable, config, seq: int, device: str, dtype: torch.dtype) -> Scale:
    """A causal LM's scale: `model(config)` run on one prefill of `seq` random token ids."""
    return Scale(
        describe=f"{describe}; batch 1, sequence {seq}; sdpa attention, KV cache on (prefill)",
        build=lambda: model(config),
        inputs=lambda: {"input_ids": torch.randint(0, config.vocab_size, (1, seq))},
        device=device, dtype=dtype)


def _build(scale: Scale, device: str) -> tuple[torch.nn.Module, dict]:
    """The model and its inputs on the scale's device, floats in its dtype.

    Built under the dtype as the default, as transformers' `from_pretrained(dtype=...)` does,
    so buffers a model computes in float32 on purpose (rotary frequencies) stay float32.
    """
    default = torch.get_default_dtype()
    torch.set_default_dtype(scale.dtype)
    try:
        with torch.device(device):
            return scale.build().eval(), scale.inputs()
    finally:
        torch.set_default_dtype(default)


def main(scales: dict[str, Scale], argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=sys.modules["__main__"].__doc__)
    parser.add_argument("--scale", choices=sorted(scales), required=True)
    parser.add_argument("-o", "--output", required=True, help="trace file to write")
    parser.add_argument("--device", help="run there instead of the scale's own device "
                        "(cpu for small scales, meta for real ones), e.g. cuda")
    args = parser.parse_args(argv)
    scale = scales[args.scale]
    device = args.device or scale.device

    torch.manual_seed(0)
    model, inputs = _build(scale, device)
    comments = [
        f"command: {shlex.join(['python', *sys.argv])}",
        f"model: {scale.describe}",
        f"recorded with torch {torch.__version__}, transformers {transformers.__version__}, "
        f"device {device}, {str(scale.dtype).removeprefix('torch.')}, "
        "torch.inference_mode(), one forward",
    ]
    with torch.inference_mode(), record(args.output, comments) as rec:
        model(**inputs)
    print(f"{args.output}: {len(rec.rows)} rows, {rec.launches} launches")
