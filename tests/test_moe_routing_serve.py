"""A tiny Mixtral and a tiny Qwen2-MoE (random weights, hidden 32, fp32, the CPU
interpreter) under serve(): the logits within 1e-4 of torch's, and the routing ops
(topk, sort, floor_divide, index, histc, cumsum, index_put_) launched on kernels."""

import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

import nbx_tune  # noqa: E402
from nbx_tune.kernels.serving import serve as serving  # noqa: E402

ROUTING = ("aten.topk", "aten.floor_divide", "aten.index.Tensor", "aten.histc",
           "aten.cumsum", "aten.index_put_")


def _models():
    """transformers' MoE models, imported with the repository's root off sys.path: its
    kernel hub looks for a top-level `kernels` package, and the root's folder is not it."""
    root = Path(__file__).resolve().parents[1]
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != root]
    try:
        from transformers import MixtralForCausalLM, Qwen2MoeForCausalLM
    finally:
        sys.path[:] = saved
    return MixtralForCausalLM, Qwen2MoeForCausalLM


def _tiny(name):
    mixtral, qwen2_moe = _models()
    common = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    if name == "mixtral":
        cfg = transformers.MixtralConfig(num_local_experts=4, num_experts_per_tok=2, **common)
        return mixtral(cfg).eval()
    cfg = transformers.Qwen2MoeConfig(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=24,
                                      shared_expert_intermediate_size=40, **common)
    return qwen2_moe(cfg).eval()


@pytest.mark.slow
@pytest.mark.parametrize("name", ("mixtral", "qwen2_moe"))
def test_a_tiny_moe_under_serve_gives_torchs_logits_with_its_routing_on_kernels(name):
    torch.manual_seed(0)
    model = _tiny(name)
    ids = torch.randint(0, 97, (2, 7))
    with torch.inference_mode():
        want = model(ids).logits
        serving.reset_stats()
        # fusions off: fused, the experts' loop (and the routing ops inside it) is one
        # moe_experts launch (tests/test_kernel_moe.py); here the loop runs as the model wrote it
        with nbx_tune.serve(fuse=False):
            got = model(ids).logits
    stats = nbx_tune.serve_stats()
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()
    for op in ROUTING:
        s = stats.get(op)
        assert s and s["certified"] + s["default"] > 0 and s["torch"] == 0, (op, s)
    # the expert ids' sort: ties everywhere (tokens of one expert), whose order torch's
    # CPU sort does not define: handed to torch there, and only for that reason
    reasons = stats["aten.sort"]["reasons"]
    assert set(reasons) <= {"sort: equal values where torch's order of ties is its own"}, reasons
