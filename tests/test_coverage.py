"""The census accounts for every row of a real trace: on the Llama-, GPT-2- and conv-net
traces every compute op of the kernel library is served; what is left is data movement
(and the two conv-net ops no kernel serves yet), each reported with its launch count."""

from pathlib import Path

import pytest

from nbx_tune.profiles import get_profile
from nbx_tune.tuner.census import load_plan

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "traces"
DATA_MOVEMENT = {"aten.embedding", "aten.cat", "aten._to_copy", "aten.arange"}
NOT_YET = {"aten.batch_norm", "aten.max_pool2d_with_indices"}


@pytest.mark.parametrize("name", ["llama_small", "gpt2_small", "convnet_small", "llama2_7b_seq512_bf16",
                                  "gpt2_seq1024_bf16", "resnet50_b8_bf16"])
def test_every_row_is_served_or_reported(name):
    plan = load_plan(EXAMPLES / f"{name}.tsv", get_profile("hopper"))
    served = sum(sp.launches for sp in plan.seats.values())
    uncovered = sum(plan.uncovered.values())
    unservable = sum(n for *_, n in plan.not_servable)
    assert served + uncovered + unservable == plan.trace.launches  # every launch accounted for
    assert set(plan.uncovered) <= DATA_MOVEMENT | NOT_YET
    # The one row no kernel serves is integer position arithmetic (int64 + int64).
    for _, op, why, _ in plan.not_servable:
        assert op == "aten.add.Tensor" and "int64" in why
    kernels = {sp.kernel for sp in plan.seats.values()}
    if name.startswith(("llama", "gpt2")):
        assert {"matmul", "attention", "elementwise_binary", "elementwise_unary"} <= kernels
    if name.startswith("gpt2"):
        assert "layer_norm" in kernels
    if name.startswith("llama"):
        assert "reduce" in kernels  # the RMS norm's mean
    if name.startswith(("convnet", "resnet")):
        assert "conv" in kernels and "aten.add_.Tensor" not in plan.uncovered
