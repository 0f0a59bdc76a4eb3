"""The grouped expert GEMM family (kernels/moe/, `nbx_tune.moe_experts`) on the interpreter:
the kernels against the fp64 oracle at odd shapes and routings (empty experts, one token,
uneven loads, a load that is no multiple of the row block, transformers' sentinel id),
its seat and screen, the torch op against transformers' own loop, and serve() running a tiny
Mixtral and Qwen2-MoE with their experts fused, never a variant."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import nbx_tune
from nbx_tune.errors import KernelError
from nbx_tune.kernels.moe import SPEC, moe_experts, moe_row, skewed_routing
from nbx_tune.kernels.moe.kernel import launch_moe, max_blocks
from nbx_tune.kernels.moe.spec import CONFIGS, _c
from nbx_tune.kernels.serving import custom_ops
from nbx_tune.kernels.serving.fusions import engine as fusions
from nbx_tune.kernels.serving.fusions import moe as moe_fusions
from nbx_tune.kernels.spec import NotServable, bucket_of
from nbx_tune.oracles import moe as oracle
from nbx_tune.profiles import get_profile
from nbx_tune.tuner.certify import screen as screening
from nbx_tune.tuner.certify.screen_shapes import edge_problems
from nbx_tune.tuner.certify.selfcheck import check_kernel

PROFILE = get_profile("interpreter")


def layer(T, E, K, H, I, seed=0, dtype=torch.float32, ids=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(dtype)
    w13 = (torch.randn(E, 2 * I, H, generator=g) / H ** 0.5).to(dtype)
    w2 = (torch.randn(E, H, I, generator=g) / I ** 0.5).to(dtype)
    if ids is None:
        ids, _ = skewed_routing(np.random.default_rng(seed), T, E, K)
        ids = torch.from_numpy(ids)
    weights = torch.rand(ids.shape, generator=g) + 0.1
    return x, w13, w2, ids, weights / weights.sum(1, keepdim=True)


def reference(x, w13, w2, ids, weights) -> np.ndarray:
    return oracle.moe_experts(*(t.double().numpy() for t in (x, w13, w2)), ids.numpy(), weights.double().numpy())


def rel_err(got: torch.Tensor, want: np.ndarray) -> float:
    return float(np.abs(got.double().numpy() - want).max() / np.abs(want).max())


# ----------------------------------------------------------------------------- the kernels

ROUTINGS = {
    "skewed": None,  # most experts empty at small T, a few loaded
    "one_expert": lambda T, E, K: torch.arange(K).repeat(T, 1),  # every pair on experts 0..K-1
    "last_expert_only": lambda T, E, K: (E - 1 - torch.arange(K)).repeat(T, 1),
}


@pytest.mark.parametrize("T,E,K,H,I", [(1, 8, 2, 40, 24), (7, 5, 2, 37, 19), (45, 6, 3, 33, 17), (33, 4, 1, 20, 70)])
@pytest.mark.parametrize("routing", sorted(ROUTINGS))
def test_the_layer_matches_the_oracle_at_odd_shapes_and_routings(T, E, K, H, I, routing):
    make = ROUTINGS[routing]
    x, w13, w2, ids, w = layer(T, E, K, H, I, ids=None if make is None else make(T, E, K))
    got = moe_experts(x, w13, w2, ids, w)
    assert got.shape == (T, H) and got.dtype == torch.float32
    assert rel_err(got, reference(x, w13, w2, ids, w)) <= PROFILE.screen_rtol["float32"]


@pytest.mark.parametrize("config", [_c(16, 32, 32, 1, 4, 2), _c(32, 64, 64, 8, 4, 3), _c(64, 32, 64, 2, 4, 2)],
                         ids=str)
def test_every_row_block_and_group_order_gives_the_oracles_result(config):
    """Loads of 1..40 pairs per expert against blocks of 16-64 rows: runs that end mid-block,
    runs longer than a block, and the grouped tile order's last partial group."""
    T, E, K, H, I = 41, 7, 2, 48, 40
    x, w13, w2, ids, w = layer(T, E, K, H, I, seed=3)
    out = torch.full((T, H), float("nan"))
    launch_moe(x, w13, w2, ids, w, out, config)
    assert rel_err(out, reference(x, w13, w2, ids, w)) <= PROFILE.screen_rtol["float32"]


def test_fp16_matches_the_oracle():
    x, w13, w2, ids, w = layer(19, 6, 2, 40, 24, dtype=torch.float16)
    got = moe_experts(x, w13, w2, ids, w)
    assert got.dtype == torch.float16
    assert rel_err(got, reference(x, w13, w2, ids, w)) <= PROFILE.screen_rtol["float16"]


def test_the_sentinel_expert_adds_nothing_as_in_transformers_loop():
    """transformers marks a pair routed to another rank with id E (expert parallelism)."""
    x, w13, w2, ids, w = layer(9, 4, 2, 24, 16)
    ids[::2, 1] = 4
    got = moe_experts(x, w13, w2, ids, w)
    assert rel_err(got, reference(x, w13, w2, ids, w)) <= PROFILE.screen_rtol["float32"]
    torch.testing.assert_close(got, custom_ops.moe_experts(x, w13, w2, ids, w), rtol=1e-5, atol=1e-6)


def test_an_empty_batch_is_zeros_and_bad_calls_say_why():
    x, w13, w2, ids, w = layer(4, 4, 2, 24, 16)
    assert moe_experts(x[:0], w13, w2, ids[:0], w[:0]).shape == (0, 24)
    with pytest.raises(KernelError, match="do not chain"):
        moe_experts(x, w13, w2[:, :, :8], ids, w)
    with pytest.raises(KernelError, match="dtypes"):
        moe_experts(x.half(), w13, w2, ids, w)
    with pytest.raises(KernelError, match="int64/int32 ids"):
        moe_experts(x, w13, w2, ids.float(), w)


@pytest.mark.parametrize("T,E,K,bm", [(600, 4, 2, 16), (150, 64, 2, 32), (5, 3, 2, 16)])
def test_pairs_are_sorted_stably_by_expert_in_padded_runs(T, E, K, bm):
    """Several chunks of pairs (a chunk holds 1024 pairs at 4 experts, 128 at 64): each
    expert's pairs in pair order from a multiple of BLOCK_M, a sentinel id nowhere."""
    import triton

    from nbx_tune.kernels.moe.kernel import _moe_count_kernel, _moe_scatter_kernel, scatter_block

    ids = torch.from_numpy(skewed_routing(np.random.default_rng(5), T, E, K)[0])
    ids[::7, 0] = E  # transformers' expert-parallel sentinel
    flat, S, e_pad = ids.reshape(-1), T * K, triton.next_power_of_2(E)
    sb = scatter_block(e_pad)
    chunks = -(-S // sb)
    counts = torch.zeros(E, dtype=torch.int32)
    table = torch.empty((chunks, e_pad), dtype=torch.int32)
    rows = torch.full((max_blocks(S, E, bm) * bm,), -1, dtype=torch.int32)
    _moe_count_kernel[(chunks,)](flat, counts, table, S, E, E_PAD=e_pad, BLOCK=sb)
    _moe_scatter_kernel[(chunks,)](flat, counts, table, rows, S, E, BLOCK_M=bm, E_PAD=e_pad, BLOCK=sb, ROWS=sb)
    start = 0
    for e in range(E):
        want = torch.nonzero(flat == e).flatten().int()
        assert counts[e] == len(want) and torch.equal(rows[start:start + len(want)], want)
        assert (rows[start + len(want):start + -(-len(want) // bm) * bm] == -1).all()  # padding untouched
        start += -(-len(want) // bm) * bm
    assert (rows[start:] == -1).all()


def test_the_grid_holds_every_padded_block():
    """Each expert with pairs pads fewer than BLOCK_M rows: the worst case of a routing is
    one pair on each of min(E, pairs) experts and the rest on one."""
    for S, E, bm in ((1, 8, 16), (12, 64, 16), (4096, 8, 64), (100, 60, 128)):
        worst = min(E, S) - 1 + -(-(S - min(E, S) + 1) // bm)
        assert max_blocks(S, E, bm) >= worst


# ----------------------------------------------------------------------------- the seat and screen

def test_rows_map_to_seats_keyed_by_tokens_per_expert():
    p = SPEC.problem_from_row(moe_row(8, 2, 4096, 14336, 7, "bfloat16"))
    assert p.dims == (8, 2, 4096, 14336, 2) and p.dtypes == ("bfloat16", "bfloat16") and p.get("T") == 7
    q = SPEC.problem_from_row(moe_row(60, 4, 2048, 1408, 1001, "bfloat16", routing="bfloat16"))
    assert q.dims[4] == 67 and q.get("routing") == "bfloat16"
    assert SPEC.input_shapes(q)["topk_weights"] == ((1001, 4), "bfloat16")
    # DeepSeek-V3's experts: 256 of 2 x 2048 x 7168, 7.5G weight elements (offsets are int64)
    assert SPEC.problem_from_row(moe_row(256, 8, 7168, 2048, 64, "bfloat16")).dims == (256, 8, 7168, 2048, 2)


@pytest.mark.parametrize("dts,shapes,why", [
    (["float32", "float16", "float32", "int64", "float32"], None, "one dtype expected"),
    (["float32"] * 3 + ["float32", "float32"], None, "int64/int32"),
    (["float64"] * 3 + ["int64", "float32"], None, "not served"),
    (None, [(5, 8), (4, 6, 8), (4, 8, 4), (5, 2), (5, 2)], "do not chain"),
    (None, [(5, 8), (4, 6, 8), (4, 8, 3), (5, 2)], "takes 5 tensors"),
])
def test_rows_not_served_say_why(dts, shapes, why):
    from nbx_tune.kernels.rows import make_row

    row = moe_row(4, 2, 8, 3, 5, "float32")
    row = make_row(row.op, dts or row.dtypes, shapes or row.shapes)
    p = SPEC.problem_from_row(row)
    assert isinstance(p, NotServable) and why in p.reason


def test_tile_edge_shapes_stay_in_the_seat_with_tokens_for_its_load():
    p = SPEC.problem_from_row(moe_row(8, 2, 96, 200, 300, "float32"))
    edges = edge_problems(SPEC, PROFILE, p)
    bucket = bucket_of(PROFILE, SPEC.key, p.dims)
    assert edges and all(bucket_of(PROFILE, SPEC.key, e.dims) == bucket for e in edges)
    for e in edges:
        E, K, _, _, M = e.dims
        assert -(-e.get("T") * K // E) == M


def test_the_screen_passes_the_kernel_and_catches_unweighted_experts():
    problem = SPEC.problem_from_row(moe_row(6, 2, 40, 24, 9, "float32"))
    case = screening.make_case(SPEC, problem, "cpu", 7, True)
    rtol = screening.output_rtols(SPEC, problem, PROFILE)["out"]
    out = torch.full((9, 40), float("nan"))
    SPEC.launch(CONFIGS[0], problem, case.inputs, {"out": out})
    assert screening.compare("out", out, case.reference("out", out), rtol, problem).ok
    wrong = torch.full((9, 40), float("nan"))
    unweighted = dict(case.inputs, topk_weights=torch.ones_like(case.inputs["topk_weights"]))
    SPEC.launch(CONFIGS[0], problem, unweighted, {"out": wrong})
    assert screening.compare("out", wrong, case.reference("out", wrong), rtol, problem).reason == "wrong_answer"


def test_gpu_rows_are_servable_and_claim_every_dtype():
    problems = [SPEC.problem_from_row(r) for r in SPEC.example_rows("gpu")]
    assert not [p for p in problems if isinstance(p, NotServable)]
    assert {"float16", "bfloat16", "float32"} <= {p.dtypes[0] for p in problems}
    hopper = get_profile("hopper")
    for p in problems:  # decode seats get 16-row blocks, prefill seats taller ones (fp32's may not fit)
        config = SPEC.default_config(hopper, p)
        assert config in SPEC.configs() and not SPEC.static_refusal(hopper, config, p)
        if p.dtypes[0] != "float32":
            assert (config["BLOCK_M"] == 16) == (p.dims[4] <= 16)


@pytest.mark.slow
def test_selfcheck_small_rows_pass_the_screen():
    checks = check_kernel(SPEC, PROFILE, "cpu", "small", configs_per_row=2)
    bad = [(c.shapes, c.dtype, str(c.config), c.reason, c.detail) for c in checks if not c.ok]
    assert not bad
    assert {"float16", "float32"} <= {c.dtype for c in checks}


# ----------------------------------------------------------------------------- serve()

@pytest.fixture
def transformers_moe(transformers_module):
    return transformers_module


def tiny(transformers, family: str, impl: str):
    torch.manual_seed(0)
    if family == "mixtral":
        cfg = transformers.MixtralConfig(vocab_size=97, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                         num_experts_per_tok=2, max_position_embeddings=64)
        cls = transformers.MixtralForCausalLM
    else:
        cfg = transformers.Qwen2MoeConfig(vocab_size=97, hidden_size=48, intermediate_size=64, moe_intermediate_size=24,
                                          shared_expert_intermediate_size=40, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, num_experts=8,
                                          num_experts_per_tok=3, max_position_embeddings=64)
        cls = transformers.Qwen2MoeForCausalLM
    cfg._experts_implementation = impl
    model = cls(cfg).eval()
    assert model.config._experts_implementation == impl
    return model


def served_logits(model, ids):
    """torch's logits, serve()'s, and the experts calls fused (each checked to have run on the kernel)."""
    from nbx_tune.kernels.serving import serve as serving

    fusions.reset_stats()
    serving.reset_stats()
    with torch.inference_mode():
        ref = model(ids).logits
        with nbx_tune.serve():
            out = model(ids).logits
    fused = fusions.stats().get("moe_experts", 0)
    ran = serving.stats().get("nbx_tune.moe_experts", {"default": 0, "certified": 0, "reasons": {}})
    assert ran["default"] + ran["certified"] == fused and not ran["reasons"], ran
    return ref, out, fused


@pytest.mark.parametrize("impl", ["grouped_mm", "eager", "batched_mm"])
def test_a_mixtral_block_runs_its_experts_as_the_one_op_under_serve(transformers_moe, impl):
    """One MoE block (router, experts): the experts on the kernel where transformers would run
    its loop or its grouped_mm forward, as written under another implementation."""
    from transformers.models.mixtral import modeling_mixtral as m

    cfg = transformers_moe.MixtralConfig(hidden_size=24, intermediate_size=20, num_local_experts=5,
                                         num_experts_per_tok=2)
    cfg._experts_implementation = impl
    torch.manual_seed(0)
    block = m.MixtralSparseMoeBlock(cfg).eval()
    for p in block.parameters():
        nn.init.normal_(p, std=0.3)
    x = torch.randn(2, 7, 24)
    fusions.reset_stats()
    with torch.inference_mode():
        ref = block(x)
        with nbx_tune.serve():
            out = block(x)
    assert fusions.stats().get("moe_experts", 0) == (impl != "batched_mm")
    assert ((out - ref).abs().max() / ref.abs().max()).item() <= 1e-5


def test_a_recorded_mixtral_block_maps_its_experts_to_one_seat(transformers_moe):
    """The recorder enters the fusions too: a block's trace holds one moe_experts row (the
    router's fp32 weights included), which plans to this family's seat."""
    from transformers.models.mixtral import modeling_mixtral as m

    from nbx_tune.kernels.runtime.registry import spec_for_op
    from nbx_tune.kernels.trace import Trace
    from nbx_tune.profiles import current_profile
    from nbx_tune.tuner.census.census import plan
    from nbx_tune.tuner.trace.recorder import Recorder

    cfg = transformers_moe.MixtralConfig(hidden_size=24, intermediate_size=20, num_local_experts=5,
                                         num_experts_per_tok=2)
    block = m.MixtralSparseMoeBlock(cfg).eval()
    for p in block.parameters():
        nn.init.normal_(p, std=0.3)
    with torch.inference_mode(), Recorder() as rec:
        block(torch.randn(2, 7, 24))
    rows = [r for r in rec.rows if r.op == "nbx_tune.moe_experts"]
    assert len(rows) == 1 and rows[0].dtypes == ("float32",) * 3 + ("int64", "float32")
    assert rows[0].shapes == ((14, 24), (5, 40, 24), (5, 24, 20), (14, 2), (14, 2))
    assert spec_for_op("nbx_tune.moe_experts") is SPEC
    p = plan(Trace("recorded", rows), "sha", current_profile())
    assert not p.not_servable and not p.uncovered
    assert [key[0] for key in p.seats] == ["moe_experts"]


@pytest.mark.slow
@pytest.mark.parametrize("family,impl", [("mixtral", "grouped_mm"), ("mixtral", "eager"), ("qwen2_moe", "eager"),
                                         ("qwen2_moe", "grouped_mm")])  # grouped_mm: transformers' default
def test_a_tiny_moe_model_runs_its_experts_fused_within_1e4_of_torch(transformers_moe, family, impl):
    model = tiny(transformers_moe, family, impl)
    ref, out, fused = served_logits(model, torch.randint(0, 97, (2, 9)))
    assert fused == 2  # one call a layer
    assert ((out - ref).abs().max() / ref.abs().max()).item() <= 1e-4


@pytest.mark.slow
def test_another_experts_implementation_runs_as_written(transformers_moe):
    model = tiny(transformers_moe, "mixtral", "batched_mm")
    ref, out, fused = served_logits(model, torch.randint(0, 97, (1, 5)))
    assert fused == 0 and ((out - ref).abs().max() / ref.abs().max()).item() <= 1e-4


def experts_class(folder, forward_source: str):
    """A module class holding an experts module's weights whose forward is `forward_source`,
    defined in a file of its own, so that its source can be read."""
    import importlib.util
    import textwrap

    name = f"experts_{abs(hash(forward_source))}"
    path = folder / f"{name}.py"
    path.write_text("import torch\nfrom torch import nn\n\n\nclass Experts(nn.Module):\n"
                    "    def __init__(self, experts):\n        super().__init__()\n"
                    "        self.num_experts, self.act_fn = experts.num_experts, experts.act_fn\n"
                    "        self.gate_up_proj, self.down_proj = experts.gate_up_proj, experts.down_proj\n"
                    + textwrap.indent(forward_source, "    "))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Experts


@pytest.mark.slow
def test_an_edited_experts_forward_or_gate_is_never_fused(transformers_moe, monkeypatch, tmp_path):
    """A loop whose arithmetic differs (gate and up swapped) and a grouped model whose gate
    differs run as written: the swap matches the code that would run, not the class."""
    from transformers.models.mixtral import modeling_mixtral as m

    model = tiny(transformers_moe, "mixtral", "grouped_mm")
    def doubled_gate(self, gate_up_out):  # transformers' gate, times 2
        gate, up = gate_up_out.chunk(2, dim=-1)
        return self.act_fn(gate) * up * 2

    monkeypatch.setattr(m.MixtralExperts, "_apply_gate", doubled_gate)
    ref, out, fused = served_logits(model, torch.randint(0, 97, (1, 5)))
    assert fused == 0 and torch.allclose(out, ref, rtol=1e-4, atol=1e-5)

    monkeypatch.undo()
    # An experts module of the loop's own text, and one with gate and up exchanged, from a file
    # (the match reads the source): the first is fused, the second never.
    edited = moe_fusions.EXPERTS_LOOP_SOURCE.replace("gate, up = nn.functional", "up, gate = nn.functional")
    assert edited != moe_fusions.EXPERTS_LOOP_SOURCE
    for source, want in ((moe_fusions.EXPERTS_LOOP_SOURCE, 2), (edited, 0)):
        kind = experts_class(tmp_path, source)
        for block in (layer.mlp for layer in model.model.layers):
            block.experts = kind(block.experts)
        ref, out, fused = served_logits(model, torch.randint(0, 97, (1, 5)))
        assert fused == want and ((out - ref).abs().max() / ref.abs().max()).item() <= 1e-4


def test_the_loop_pattern_is_transformers_experts_forward(transformers_moe):
    from transformers.models.mixtral import modeling_mixtral as m
    from transformers.integrations import moe as tm

    assert moe_fusions.EXPERTS_LOOP_PATTERN.matches(m.MixtralExperts.forward.__wrapped__)
    assert moe_fusions.GROUPED_FORWARD.matches(tm.grouped_mm_experts_forward)
    assert moe_fusions.EXPERTS.pattern.matches(m.MixtralExperts.forward)


def test_the_torch_op_is_transformers_loop_bit_for_bit(transformers_moe):
    from transformers.models.mixtral import modeling_mixtral as m

    cfg = transformers_moe.MixtralConfig(hidden_size=24, intermediate_size=16, num_local_experts=5,
                                         num_experts_per_tok=2)
    experts = m.MixtralExperts(cfg)
    nn.init.normal_(experts.gate_up_proj), nn.init.normal_(experts.down_proj)
    x, _, _, ids, w = layer(11, 5, 2, 24, 16)
    want = m.MixtralExperts.forward.__wrapped__(experts, x, ids, w)
    assert torch.equal(custom_ops.moe_experts(x, experts.gate_up_proj, experts.down_proj, ids, w), want)
