"""Masked attention on the interpreter: the example rows against the fp64 oracle under several
configs, the oracle against torch, the public op at odd shapes and window / padding edges,
mask recognition (exact, once per mask), and serve() on SDPA calls with masks: by hand, a tiny
sliding-window Mistral and a padded batch on a tiny Llama."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import nbx_tune
from nbx_tune.errors import KernelError
from nbx_tune.kernels.masked_attention import CONFIGS, OP, SPEC, masked_attention, pattern
from nbx_tune.kernels.masked_attention.kernel import BOOL_MASK, launch_masked_attention
from nbx_tune.kernels.rows import make_row
from nbx_tune.kernels.spec import Config, NotServable, Problem
from nbx_tune.oracles import masked_attention as oracle
from nbx_tune.profiles import get_profile
from nbx_tune.tuner.certify.selfcheck import check_kernel
from tests.test_serve import no_repo_root_on_path  # noqa: F401  (a fixture)

PROFILE = get_profile("interpreter")
HOPPER = get_profile("hopper")


def test_example_rows_pass_the_screen():
    checks = check_kernel(SPEC, PROFILE, "cpu", "small", configs_per_row=3)
    bad = [c for c in checks if not c.ok]
    assert not bad, "\n".join(f"{c.op} {c.shapes} {c.dtype} {c.config}: {c.reason} {c.detail}" for c in bad)
    assert {c.dtype for c in checks} == {"float16", "float32"}
    assert len({str(c.config) for c in checks}) >= 4
    assert max(c.err for c in checks if c.dtype == "float32") < 1e-5


def test_gpu_rows_are_servable_with_configs_left_on_hopper():
    rows = SPEC.example_rows("gpu")
    assert {r.dtypes[0] for r in rows} == set(SPEC.dtypes)
    for r in rows:
        p = SPEC.problem_from_row(r)
        assert isinstance(p, Problem), (r, p)
        keep = [c for c in SPEC.configs() if not SPEC.static_refusal(HOPPER, c, p)]
        assert len(keep) >= 3, (r.shapes, r.dtypes)
    decode = SPEC.problem_from_row(rows[1])
    assert any(c["SPLIT"] > 1 and not SPEC.static_refusal(HOPPER, c, decode) for c in CONFIGS)


# ----------------------------------------------------------------------------- the oracle

def _torch(q, k, v, mask, scale=None):
    t = [torch.from_numpy(np.ascontiguousarray(x)) for x in (q, k, v)]
    m = torch.from_numpy(np.ascontiguousarray(mask))
    return F.scaled_dot_product_attention(*t, attn_mask=m, scale=scale, enable_gqa=t[1].shape[1] != t[0].shape[1]).numpy()


def test_oracle_matches_torch_on_bool_and_additive_masks_with_empty_rows():
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((2, 4, 7, 8)), rng.standard_normal((2, 2, 9, 8)), rng.standard_normal((2, 2, 9, 5))
    keep = rng.random((2, 1, 7, 9)) < 0.6
    keep[1, 0, 3] = False  # a row that sees nothing: torch gives 0
    np.testing.assert_allclose(oracle.masked_attention(q, k, v, keep, scale=0.3), _torch(q, k, v, keep, 0.3),
                               rtol=1e-10, atol=1e-12)
    bias = np.where(rng.random((7, 9)) < 0.3, -np.inf, rng.standard_normal((7, 9)))
    bias[2] = -np.inf
    bias[4] = np.finfo(np.float64).min  # finite: a uniform row, as torch computes it
    np.testing.assert_allclose(oracle.masked_attention(q, k, v, bias), _torch(q, k, v, bias), rtol=1e-10, atol=1e-12)
    assert not oracle.masked_attention(q, k, v, bias)[:, :, 2].any()


@pytest.mark.parametrize("Lq,Lk,window,pad", [(7, 7, 3, None), (3, 11, 4, "left"), (1, 9, 2, "right"), (5, 5, 0, "left")])
def test_oracle_pattern_is_the_mask_it_describes(Lq, Lk, window, pad):
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((2, 2, Lq, 8)), rng.standard_normal((2, 2, Lk, 8)), rng.standard_normal((2, 2, Lk, 8))
    ranges = None if pad is None else np.array([[0, Lk], [2, Lk]] if pad == "left" else [[0, Lk], [0, Lk - 3]])
    keep = oracle.visible(2, Lq, Lk, True, Lk - Lq, window, ranges)
    np.testing.assert_allclose(oracle.masked_attention(q, k, v, None, True, Lk - Lq, window, ranges),
                               _torch(q, k, v, keep), rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------------------- the public op

def _ref(q, k, v, **kw):
    return oracle.masked_attention(q.double().numpy(), k.double().numpy(), v.double().numpy(), **kw)


def _rel(out, ref):
    return float(np.abs(out.double().numpy() - ref).max() / max(np.abs(ref).max(), 1e-30))


@pytest.mark.parametrize("D", [64, 80, 128])
@pytest.mark.parametrize("mask_shape", [(2, 1, 19, 37), (1, 4, 19, 37), (19, 37), (2, 4, 19, 37)])
def test_public_op_reads_masks_broadcast_over_batch_and_heads(D, mask_shape):
    g = torch.Generator().manual_seed(D)
    q, k, v = torch.randn(2, 4, 19, D, generator=g), torch.randn(2, 2, 37, D, generator=g), torch.randn(2, 2, 37, D, generator=g)
    keep = torch.rand(mask_shape, generator=g) < 0.7
    bias = torch.where(torch.rand(mask_shape, generator=g) < 0.2, float("-inf"), torch.randn(mask_shape, generator=g))
    for mask in (keep, bias):
        out = masked_attention(q, k, v, mask)
        assert _rel(out, _ref(q, k, v, mask=mask.numpy())) < 1e-5


@pytest.mark.parametrize("Lq,Lk,window,lens,padding", [
    (37, 37, 1, None, "right"),     # the window is the diagonal alone
    (37, 37, 36, None, "right"),    # one key short of every key
    (37, 37, 64, None, "right"),    # wider than the keys: plain causal
    (33, 70, 17, [70, 40], "left"),
    (33, 70, 17, [70, 5], "right"),  # a sequence shorter than its queries: empty rows
    (1, 70, 16, [70, 9], "left"),   # decode
    (5, 70, None, [70, 0], "left"),  # an empty sequence
])
def test_public_op_window_and_padding_edges(Lq, Lk, window, lens, padding):
    g = torch.Generator().manual_seed(Lq + Lk)
    q, k, v = torch.randn(2, 4, Lq, 16, generator=g), torch.randn(2, 2, Lk, 16, generator=g), torch.randn(2, 2, Lk, 24, generator=g)
    seq = None if lens is None else torch.tensor(lens)
    out = masked_attention(q, k, v, window=window, seq_lens=seq, is_causal=True, padding=padding)
    ranges = None
    if lens is not None:
        n = np.array(lens)
        lo = Lk - n if padding == "left" else np.zeros_like(n)
        ranges = np.stack([lo, lo + n], 1)
    ref = _ref(q, k, v, causal=True, offset=Lk - Lq, window=window or 0, ranges=ranges)
    assert _rel(out, ref) < 1e-5
    assert torch.isfinite(out).all()


def test_public_op_reads_a_mask_inside_the_window_and_the_sequences():
    g = torch.Generator().manual_seed(11)
    q, k, v = torch.randn(2, 2, 30, 16, generator=g), torch.randn(2, 2, 41, 16, generator=g), torch.randn(2, 2, 41, 16, generator=g)
    bias = torch.where(torch.rand(2, 1, 30, 41, generator=g) < 0.2, float("-inf"), torch.randn(2, 1, 30, 41, generator=g))
    out = masked_attention(q, k, v, bias, window=9, seq_lens=torch.tensor([41, 20]), padding="left")
    ref = _ref(q, k, v, mask=bias.numpy(), causal=True, offset=11, window=9, ranges=np.array([[0, 41], [21, 41]]))
    assert _rel(out, ref) < 1e-5


@pytest.mark.parametrize("config", [c for c in CONFIGS if c["SPLIT"] > 1][:3] + [CONFIGS[0]])
def test_split_key_decode_and_a_mask_with_empty_rows(config):
    """Decode configs split the keys; a row no slice saw a key of is 0, not NaN."""
    g = torch.Generator().manual_seed(3)
    B, Hq, Hkv, Lk = 3, 8, 2, 300
    q, k, v = torch.randn(B, Hq, 1, 32, generator=g), torch.randn(B, Hkv, Lk, 32, generator=g), torch.randn(B, Hkv, Lk, 32, generator=g)
    keep = torch.rand(B, 1, 1, Lk, generator=g) < 0.5
    keep[1] = False
    out = torch.full((B, Hq, 1, 32), float("nan"))
    launch_masked_attention(q, k, v, out, 32 ** -0.5, config, mask=keep, mask_kind=BOOL_MASK)
    assert _rel(out, _ref(q, k, v, mask=keep.numpy())) < 1e-5
    assert not out[1].any()


def test_public_op_refuses_what_it_cannot_serve():
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(KernelError, match="does not broadcast"):
        masked_attention(q, q, q, torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(KernelError, match="int64 mask"):
        masked_attention(q, q, q, torch.ones(4, 4, dtype=torch.int64))
    with pytest.raises(KernelError, match="window=0"):
        masked_attention(q, q, q, window=0)


# ----------------------------------------------------------------------------- rows and seats

def test_rows_map_to_seats_with_the_window_in_the_key():
    d3 = ["bfloat16"] * 3
    p = SPEC.problem_from_row(make_row(OP, [*d3, "int32"], [(2, 32, 4096, 128), (2, 8, 4096, 128), (2, 8, 4096, 128),
                                                            (2, 2)], {"window": "1024", "ranges": "left"}))
    assert dict(p.flags) == {"causal": "1", "mask": "none", "ranges": "1", "window": "1"}
    assert p.dims == (64, 4, 4096, 4096, 128, 128, 1024)
    p = SPEC.problem_from_row(make_row("aten.scaled_dot_product_attention", [*d3, "bool"],
                                       [(2, 8, 9, 64)] * 3 + [(2, 1, 9, 9)], {}))
    assert dict(p.flags)["mask"] == "bool" and p.get("mask_shape") == (2, 1, 9, 9)


@pytest.mark.parametrize("op,dtypes,shapes,params,why", [
    (OP, ["float32"] * 3 + ["bool"], [(1, 2, 4, 8)] * 3 + [(3, 4)], {}, "does not broadcast"),
    (OP, ["float32"] * 3 + ["float16"], [(1, 2, 4, 8)] * 3 + [(4, 4)], {}, "additive mask of float16"),
    (OP, ["float32"] * 3, [(1, 2, 4, 8)] * 3, {"ranges": "left"}, "needs a last int32"),
    ("aten.scaled_dot_product_attention", ["float32"] * 4, [(1, 2, 4, 8)] * 3 + [(4, 4)], {"is_causal": "True"},
     "torch refuses"),
    ("aten.scaled_dot_product_attention", ["float32"] * 4, [(1, 4, 4, 8)] + [(1, 2, 4, 8)] * 2 + [(4, 4)], {},
     "enable_gqa"),
])
def test_rows_not_servable(op, dtypes, shapes, params, why):
    p = SPEC.problem_from_row(make_row(op, dtypes, shapes, params))
    assert isinstance(p, NotServable) and why in p.reason


def test_split_configs_refused_for_prefill_and_short_spans():
    prefill = SPEC.problem_from_row(make_row(OP, ["float16"] * 3, [(1, 8, 512, 64), (1, 2, 512, 64), (1, 2, 512, 64)]))
    short = SPEC.problem_from_row(make_row(OP, ["float16"] * 3, [(1, 8, 1, 64), (1, 2, 100, 64), (1, 2, 100, 64)]))
    split = Config.make(BLOCK_M=16, BLOCK_N=64, SPLIT=4, num_warps=4, num_stages=3)
    assert SPEC.static_refusal(HOPPER, split, prefill)[0] == "not_applicable"
    assert "fewer than 2 blocks" in SPEC.static_refusal(HOPPER, split, short)[1]


# ----------------------------------------------------------------------------- recognition

def _sliding(B, Lq, Lk, window=0, lens=None, padding="left"):
    keep = torch.tensor(oracle.visible(B, Lq, Lk, True, Lk - Lq, window, None if lens is None else np.stack(
        [(Lk - np.array(lens)) if padding == "left" else np.zeros(B, int),
         np.full(B, Lk) if padding == "left" else np.array(lens)], 1)))
    return keep


@pytest.mark.parametrize("Lq,Lk,window,lens,padding", [
    (9, 9, 0, None, "left"), (9, 9, 4, None, "left"), (9, 9, 4, [9, 5], "left"), (9, 9, 0, [9, 5], "right"),
    (1, 20, 8, [20, 11], "left"), (6, 20, 8, None, "left")])
def test_recognised_masks_are_computed_not_read(Lq, Lk, window, lens, padding):
    mask = _sliding(2, Lq, Lk, window, lens, padding)
    found = pattern.recognise(mask, Lq, Lk)
    assert found is not None and found.causal
    seen = oracle.visible(2, Lq, Lk, found.causal, found.offset, found.window,
                          None if found.ranges is None else found.ranges.numpy())
    assert np.array_equal(seen, mask.numpy())  # the pattern is the mask, exactly
    additive = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    assert _fields(pattern.recognise(additive, Lq, Lk)) == _fields(found)


def _fields(p):
    return p.causal, p.offset, p.window, None if p.ranges is None else p.ranges.tolist()


def test_masks_that_are_no_pattern_are_read():
    mask = _sliding(2, 9, 9, 4)
    holes = mask.clone()
    holes[1, 0, 7, 5] = False  # a hole inside a row's interval
    assert pattern.recognise(holes, 9, 9) is None
    shifted = mask.clone()
    shifted[0, 0, 6, 2] = True  # one row's window one key wider
    assert pattern.recognise(shifted, 9, 9) is None
    per_head = mask.expand(2, 3, 9, 9).contiguous()  # heads given separately: read
    assert pattern.recognise(per_head, 9, 9) is None
    bias = torch.zeros(mask.shape).masked_fill(~mask, -1.0)  # a bias, not a keep-mask
    assert pattern.recognise(bias, 9, 9) is None


def test_an_additive_mask_of_the_lowest_value_is_a_pattern_only_where_no_row_is_all_lowest():
    mask = _sliding(2, 9, 9, 4, [9, 5])  # left padding: rows 0..3 of batch 1 see no key
    low = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    assert pattern.recognise(low, 9, 9) is None  # torch averages those rows uniformly: read
    q, k = torch.randn(2, 2, 9, 16), torch.randn(2, 2, 9, 16)
    ref = F.scaled_dot_product_attention(q, k, k, attn_mask=low)
    out, st = _served(lambda: F.scaled_dot_product_attention(q, k, k, attn_mask=low))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    right = _sliding(2, 9, 9, 0, [9, 5], "right")  # every row keeps a key
    low = torch.zeros(right.shape).masked_fill(~right, torch.finfo(torch.float32).min)
    assert _fields(pattern.recognise(low, 9, 9)) == _fields(pattern.recognise(right, 9, 9))


def test_recognition_is_redone_when_the_mask_changes_in_place():
    mask = _sliding(1, 9, 9, 4)
    assert pattern.recognise(mask, 9, 9).window == 4
    mask[0, 0, 8, 2] = True  # same tensor, same storage: its version moved
    assert pattern.recognise(mask, 9, 9) is None
    mask.copy_(_sliding(1, 9, 9, 3))
    assert pattern.recognise(mask, 9, 9).window == 3


# ----------------------------------------------------------------------------- serve()

def _served(fn):
    from nbx_tune.kernels.serving import serve as S

    S.reset_stats()
    with nbx_tune.serve(fuse=False):
        out = fn()
    return out, S.stats().get("aten.scaled_dot_product_attention", {})


@pytest.mark.parametrize("mask_kind", ["pattern", "random", "additive"])
def test_serve_runs_sdpa_with_a_mask_on_the_family(mask_kind):
    g = torch.Generator().manual_seed(5)
    q, k, v = torch.randn(2, 4, 13, 16, generator=g), torch.randn(2, 2, 13, 16, generator=g), torch.randn(2, 2, 13, 16, generator=g)
    mask = {"pattern": _sliding(2, 13, 13, 5, [13, 8]),
            "random": torch.rand(2, 1, 13, 13, generator=g) < 0.6,
            "additive": torch.randn(13, 13, generator=g)}[mask_kind]
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True, scale=0.3)
    out, st = _served(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True, scale=0.3))
    assert st.get("torch", 0) == 0 and st["certified"] + st["default"] == 1, st
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def _tiny(name, **kw):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = getattr(transformers, f"{name}Config")(vocab_size=64, hidden_size=64, intermediate_size=96,
                                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                 attn_implementation="sdpa", **kw)
    return getattr(transformers, f"{name}ForCausalLM")(cfg).eval()


@pytest.mark.parametrize("name,kw,attention_mask", [
    pytest.param("Mistral", {"sliding_window": 4}, None, marks=pytest.mark.slow),
    ("Llama", {}, [[0, 0, 0, 1, 1, 1, 1, 1, 1], [1] * 9]),
    ("Mistral", {"sliding_window": 3}, [[1] * 9, [0, 0, 1, 1, 1, 1, 1, 1, 1]]),
])
def test_serve_gives_torchs_logits_on_tiny_sliding_window_and_padded_models(name, kw, attention_mask,
                                                                           no_repo_root_on_path, monkeypatch):
    from nbx_tune.kernels.masked_attention import ops

    launches = []
    real = ops.launch_masked_attention
    monkeypatch.setattr(ops, "launch_masked_attention",
                        lambda *a, **k: (launches.append((k["mask"] is None, k["window"])), real(*a, **k))[1])
    model = _tiny(name, **kw)
    ids = torch.randint(0, 64, (1 if attention_mask is None else 2, 9))
    am = None if attention_mask is None else torch.tensor(attention_mask)
    with torch.inference_mode():
        ref = model(ids, attention_mask=am).logits
        got, st = _served(lambda: model(ids, attention_mask=am).logits)
    assert st.get("torch", 0) == 0 and st["certified"] + st["default"] == 2, st  # both layers served
    err = float((got - ref).abs().max() / ref.abs().max())
    assert err < 1e-4, err
    # The models' masks were recognised: computed, never read; the window is the model's.
    assert launches == [(True, kw.get("sliding_window", 0))] * 2


@pytest.mark.parametrize("name,kw", [("Mistral", {"sliding_window": 4}), ("Llama", {})])
def test_serve_a_padded_decode_step_with_a_cache(name, kw, no_repo_root_on_path):
    model = _tiny(name, **kw)
    ids, am = torch.randint(0, 64, (2, 7)), torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1] * 7])
    nxt, am2 = torch.randint(0, 64, (2, 1)), torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1], [1] * 8])
    with torch.inference_mode():
        ref = model(nxt, attention_mask=am2, cache=model(ids, attention_mask=am).past_key_values).logits
        cache = model(ids, attention_mask=am).past_key_values
        got, st = _served(lambda: model(nxt, attention_mask=am2, cache=cache).logits)
    assert st.get("torch", 0) == 0 and st["certified"] + st["default"] == 2, st
    assert float((got - ref).abs().max() / ref.abs().max()) < 1e-4


# ----------------------------------------------------------------------------- trace and census

def test_a_census_seats_what_serve_launches(tmp_path, no_repo_root_on_path, monkeypatch):
    """Recorded on real tensors, a recognised mask's SDPA call is written as the launch serve()
    makes (the public op's row: window, key ranges), a mask that is read as the SDPA row; the
    census maps both to this family's seats, and serve() then launches on exactly those seats."""
    from nbx_tune.kernels.masked_attention import ops
    from nbx_tune.kernels.spec import bucket_of, encode_bucket, encode_dtypes, encode_flags
    from nbx_tune.tuner.census.census import plan
    from nbx_tune.tuner.trace.recorder import Recorder
    from nbx_tune.kernels.trace import read_trace

    model = _tiny("Mistral", sliding_window=3)
    ids, am = torch.randint(0, 64, (2, 9)), torch.tensor([[1] * 9, [0, 0, 1, 1, 1, 1, 1, 1, 1]])
    g = torch.Generator().manual_seed(9)
    q, k = torch.randn(1, 2, 5, 16, generator=g), torch.randn(1, 2, 7, 16, generator=g)
    holes = torch.rand(1, 1, 5, 7, generator=g) < 0.5

    def run():
        model(ids, attention_mask=am)
        F.scaled_dot_product_attention(q, k, k, attn_mask=holes)

    with torch.inference_mode(), Recorder(fuse=False) as rec:
        run()
    rec.write(tmp_path / "t.tsv")
    trace = read_trace(tmp_path / "t.tsv")
    ops_seen = {r.op: r for r in trace.rows if "attention" in r.op}
    assert set(ops_seen) == {OP, "aten.scaled_dot_product_attention"}
    assert dict(ops_seen[OP].params) == {"is_causal": "True", "window": "3", "ranges": "left", "scale": "0.25"}
    p = plan(trace, "x", PROFILE)
    seats = {k_ for k_ in p.seats if k_[0] == "masked_attention"}
    assert len(seats) == 2 and not [n for n in p.not_servable if "attention" in n[1]]

    launched = []
    real = ops.config_for
    monkeypatch.setattr(ops, "config_for", lambda spec, d, f, dims: (launched.append(
        (spec.name, encode_dtypes(d), encode_flags(f), encode_bucket(spec.key, bucket_of(PROFILE, spec.key, dims)))),
        real(spec, d, f, dims))[1])
    with torch.inference_mode(), nbx_tune.serve(fuse=False):
        run()
    assert set(launched) == seats


def test_resized_problems_pass_the_screen_at_tile_edges():
    """The screen's tile-edge shapes: the lengths moved, the mask's shape and W with them."""
    from nbx_tune.tuner.certify import screen as screening

    for row in [r for r in SPEC.example_rows("small") if r.dtypes[0] == "float32"]:
        p = SPEC.problem_from_row(row)
        BH, G, Lq, Lk, D, Dv, W = p.dims
        r = SPEC.resized(p, (BH, G, Lq + 16, Lk + 31, D, Dv, W))
        assert r.dims[2:4] == (Lq + 16, Lk + 31) and r.dims[6] == (min(p.get("window"), Lk + 31) or Lk + 31)
        rtol = screening.output_rtols(SPEC, r, PROFILE)
        case = screening.make_case(SPEC, r, "cpu", 7, True)
        got = screening.screen(SPEC, SPEC.default_config(PROFILE, r), case, rtol, "cpu")
        assert got.ok, (row.shapes, got.reason, got.detail)
