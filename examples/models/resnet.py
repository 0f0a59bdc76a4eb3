"""Record one inference forward of a ResNet image classifier, random weights.

    python examples/models/resnet.py --scale small -o examples/traces/convnet_small.tsv
    python examples/models/resnet.py --scale 50 -o examples/traces/resnet50_b8_bf16.tsv
"""

import torch
from transformers import ResNetConfig, ResNetForImageClassification

from _record import Scale, main


def _scale(describe, config, batch, size, device, dtype):
    return Scale(
        describe=f"{describe}: ResNetForImageClassification, {config.layer_type} blocks, depths "
                 f"{list(config.depths)}, widths {list(config.hidden_sizes)}, stem {config.embedding_size}, "
                 f"{config.num_labels} classes; batch {batch}, {config.num_channels}x{size}x{size}",
        build=lambda: ResNetForImageClassification(config),
        inputs=lambda: {"pixel_values": torch.randn(batch, config.num_channels, size, size)},
        device=device, dtype=dtype)


SCALES = {
    "small": _scale("small ResNet", ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 1], layer_type="basic",
        num_labels=10), batch=1, size=32, device="cpu", dtype=torch.float32),
    # ResNetConfig's defaults are ResNet-50: bottleneck blocks, depths 3-4-6-3.
    "50": _scale("ResNet-50", ResNetConfig(num_labels=1000),
                 batch=8, size=224, device="meta", dtype=torch.bfloat16),
}

if __name__ == "__main__":
    main(SCALES)
