"""Layer, RMS and group norm on the interpreter: every example row against the fp64 oracle
(output and statistics) under several configs, every distinct config on looped rows, the
public ops against torch.nn.functional and the oracle, trace rows to problems, NotServable
rows, and planted wrong results the screen must catch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from nbx_tune.errors import KernelError
from nbx_tune.kernels import norms
from nbx_tune.kernels.runtime.registry import register, spec_for_op
from nbx_tune.kernels.spec import Config, NotServable, Problem, bucket_of
from nbx_tune.oracles import norms as oracle
from nbx_tune.profiles import get_profile
from nbx_tune.tuner.certify import screen as screening
from nbx_tune.tuner.trace.recorder import Recorder, describe
from nbx_tune.tuner.certify.selfcheck import check_kernel
from nbx_tune.kernels.trace import TraceRow, Params, make_row
from nbx_tune.tuner.certify.tune import static_prune

LN, RMS, GN = norms.LAYER_NORM, norms.RMS_NORM, norms.GROUP_NORM


@pytest.fixture(scope="module")
def interp():
    return get_profile("interpreter")


def _row(key) -> TraceRow:
    op, dtypes, shapes, params = key
    return TraceRow(op, dtypes, shapes, Params(dict(params)), 1)


def _screen(spec, problem, config, profile, seed=5):
    case = screening.make_case(spec, problem, "cpu", seed, True)
    return screening.screen(spec, config, case, profile.rtol(problem.dtypes[0]), "cpu")


# ----------------------------------------------------------------------------- correctness

# The small example row of each family that is longer than some blocks: (shape, row length).
LOOPED = {"layer_norm": ((3, 1100), 1100), "rms_norm": ((3, 1100), 1100),
          "group_norm": ((2, 4, 30, 37), 2220)}


@pytest.mark.parametrize("spec", norms.SPECS, ids=lambda s: s.name)
def test_selfcheck_small_rows(interp, spec):
    checks = check_kernel(spec, interp, "cpu", "small", configs_per_row=3)
    bad = [c for c in checks if not c.ok]
    assert not bad, [(c.op, c.shapes, c.dtype, str(c.config), c.reason, c.detail) for c in bad]
    assert checks and all(c.err is not None and c.err <= c.rtol for c in checks)
    assert {c.dtype for c in checks} == {"float16", "float32"}
    # Some checks loop over a row longer than their block, some hold it in one block.
    shape, n = LOOPED[spec.name]
    assert any(c.shapes[0] == shape and c.config["BLOCK"] < n for c in checks)
    assert any(c.shapes[0] == shape and c.config["BLOCK"] >= n for c in checks)


@pytest.mark.parametrize("spec,key", [
    (LN, ("aten.native_layer_norm", ("float32",) * 3, ((3, 1300), (1300,), (1300,)),
          (("normalized_shape", "1300"), ("eps", "1e-05")))),
    (RMS, ("aten._fused_rms_norm", ("float16",) * 2, ((5, 2, 650), (2, 650)),
           (("normalized_shape", "2x650"), ("eps", "None")))),
    (GN, ("aten.native_group_norm", ("float32",) * 3, ((2, 6, 9, 41), (6,), (6,)),
          (("N", "2"), ("C", "6"), ("HxW", "369"), ("group", "2"), ("eps", "1e-05")))),
], ids=["layer", "rms", "group"])
def test_every_distinct_config(interp, spec, key):
    problem = spec.problem_from_row(_row(key))
    assert isinstance(problem, Problem), problem
    keep, _ = static_prune(spec, interp, problem)
    assert len(keep) >= 6
    case = screening.make_case(spec, problem, "cpu", 3, True)
    for config in keep:
        r = screening.screen(spec, config, case, interp.rtol(problem.dtypes[0]), "cpu")
        assert r.ok, (str(config), r.reason, r.detail)


def test_oracles_match_torch_in_float64():
    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal((4, 3, 10)), rng.standard_normal((3, 10)), rng.standard_normal((3, 10))
    tx, tw, tb = map(torch.from_numpy, (x, w, b))
    y, mean, rstd = oracle.layer_norm(x, 2, w, b, 1e-5)
    ty, tm, tr = torch.ops.aten.native_layer_norm(tx, [3, 10], tw, tb, 1e-5)
    for a, t in ((y, ty), (mean, tm), (rstd, tr)):
        np.testing.assert_allclose(a, t.numpy(), rtol=1e-10, atol=1e-12)
    y, rstd = oracle.rms_norm(x, 1, w[0], 1e-6)
    ty, tr = torch.ops.aten._fused_rms_norm(tx, [10], tw[0], 1e-6)
    np.testing.assert_allclose(y, ty.numpy(), rtol=1e-10)
    np.testing.assert_allclose(rstd, tr.numpy(), rtol=1e-10)
    xg = rng.standard_normal((2, 6, 5, 7))
    y, mean, rstd = oracle.group_norm(xg, 3, w[0, :6], b[0, :6], 1e-5)
    ty, tm, tr = torch.ops.aten.native_group_norm(torch.from_numpy(xg), tw[0, :6], tb[0, :6], 2, 6, 35, 3, 1e-5)
    for a, t in ((y, ty), (mean, tm), (rstd, tr)):
        np.testing.assert_allclose(a, t.numpy(), rtol=1e-10, atol=1e-12)


def test_statistics_outputs_follow_torch():
    ln = LN.problem_from_row(make_row("aten.native_layer_norm", ["float16"], [(3, 7, 11)],
                                      {"normalized_shape": "7x11", "weight": "None", "bias": "None", "eps": "1e-05"}))
    # CUDA's layer norm returns float32 statistics for half inputs; shaped (3, 1, 1).
    assert LN.output_specs(ln) == {"out": ((3, 7, 11), "float16"), "mean": ((3, 1, 1), "float32"),
                                   "rstd": ((3, 1, 1), "float32")}
    rms = RMS.problem_from_row(make_row("aten._fused_rms_norm", ["bfloat16"], [(3, 7, 11)],
                                        {"normalized_shape": "11", "weight": "None", "eps": "None"}))
    assert RMS.output_specs(rms) == {"out": ((3, 7, 11), "bfloat16"), "rstd": ((3, 7, 1), "float32")}
    assert rms.get("eps") == torch.finfo(torch.float32).eps
    x = torch.randn(3, 7, 11, dtype=torch.bfloat16)
    assert torch.ops.aten._fused_rms_norm(x, [11], None, None)[1].dtype == torch.float32
    gn = GN.problem_from_row(make_row("aten.native_group_norm", ["float16"], [(2, 6, 5, 7)],
                                      {"weight": "None", "bias": "None", "N": "2", "C": "6", "HxW": "35",
                                       "group": "3", "eps": "1e-05"}))
    assert GN.output_specs(gn) == {"out": ((2, 6, 5, 7), "float16"), "mean": ((2, 3), "float16"),
                                   "rstd": ((2, 3), "float16")}
    xg = torch.randn(2, 6, 5, 7, dtype=torch.float16)
    assert torch.ops.aten.native_group_norm(xg, None, None, 2, 6, 35, 3, 1e-5)[1].dtype == torch.float16


# ----------------------------------------------------------------------------- public ops

@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_public_ops_against_torch_and_oracle(dtype):
    torch.manual_seed(0)
    tol = 1e-2 if dtype == torch.float16 else 1e-5
    x = (1.5 + 2 * torch.randn(5, 37)).to(dtype)
    w, b = (1 + 0.5 * torch.randn(37)).to(dtype), (0.5 * torch.randn(37)).to(dtype)
    for wt, bt in ((w, b), (w, None), (None, None)):
        y = norms.layer_norm(x, (37,), wt, bt, 1e-5)
        ref = F.layer_norm(x.float(), (37,), None if wt is None else wt.float(),
                           None if bt is None else bt.float(), 1e-5)
        assert y.dtype == dtype
        np.testing.assert_allclose(y.float().numpy(), ref.numpy(), atol=tol * 4, rtol=0)
    x3 = (1.5 + 2 * torch.randn(3, 7, 11)).to(dtype)
    y = norms.layer_norm(x3, [7, 11])
    ref = oracle.layer_norm(x3.double().numpy(), 2)[0]
    assert np.max(np.abs(y.double().numpy() - ref)) <= tol * np.max(np.abs(ref))
    w11 = (1 + torch.randn(11)).to(dtype)
    y = norms.rms_norm(x3, 11, w11, eps=1e-6)
    ref = oracle.rms_norm(x3.double().numpy(), 1, w11.double().numpy(), 1e-6)[0]
    assert np.max(np.abs(y.double().numpy() - ref)) <= tol * np.max(np.abs(ref))
    wr = (1 + torch.randn(7, 11)).to(dtype)
    y = norms.rms_norm(x3, (7, 11), wr)
    ref = F.rms_norm(x3.double(), (7, 11), wr.double(), eps=torch.finfo(torch.float32).eps)
    assert y.dtype == dtype
    np.testing.assert_allclose(y.double().numpy(), ref.numpy(), atol=tol * 4, rtol=0)
    xg = (1 + 2 * torch.randn(2, 6, 5, 7)).to(dtype)
    wg, bg = (1 + 0.5 * torch.randn(6)).to(dtype), (0.5 * torch.randn(6)).to(dtype)
    for wt, bt in ((wg, bg), (None, None)):
        y = norms.group_norm(xg, 3, wt, bt)
        ref = F.group_norm(xg.double(), 3, None if wt is None else wt.double(),
                           None if bt is None else bt.double())
        np.testing.assert_allclose(y.double().numpy(), ref.numpy(), atol=tol * 4, rtol=0)


def test_public_ops_strided_and_looped_inputs():
    torch.manual_seed(2)
    x = torch.randn(20000, 3).t()  # not contiguous; rows of 20000 loop under every block
    y = norms.layer_norm(x, 20000)
    np.testing.assert_allclose(y.numpy(), F.layer_norm(x, (20000,)).numpy(), atol=1e-4)
    y = norms.rms_norm(x, (20000,), eps=1e-5)
    np.testing.assert_allclose(y.numpy(), F.rms_norm(x, (20000,), eps=1e-5).numpy(), atol=1e-4)
    xg = torch.randn(2, 4, 150, 150)  # groups of 45000 elements loop
    np.testing.assert_allclose(norms.group_norm(xg, 2).numpy(), F.group_norm(xg, 2).numpy(), atol=1e-4)


def test_public_ops_refuse_what_they_do_not_serve():
    x = torch.randn(4, 6)
    with pytest.raises(KernelError):
        norms.layer_norm(x, (5,))
    with pytest.raises(KernelError):
        norms.layer_norm(x, (6,), torch.ones(6, dtype=torch.float16))
    with pytest.raises(KernelError):
        norms.rms_norm(x.double(), (6,))
    with pytest.raises(KernelError):
        norms.group_norm(x, 4)
    with pytest.raises(KernelError, match="bfloat16"):
        norms.rms_norm(x.bfloat16(), (6,))


# ----------------------------------------------------------------------------- trace rows

def test_problems_from_recorded_rows():
    x = torch.empty(3, 7, 11, device="meta", dtype=torch.float16)
    w = torch.empty(7, 11, device="meta", dtype=torch.float16)
    xg = torch.empty(2, 6, 5, 7, device="meta", dtype=torch.bfloat16)
    wg = torch.empty(6, device="meta", dtype=torch.bfloat16)
    with Recorder() as rec:
        F.layer_norm(x, (7, 11), w, w)
        F.layer_norm(x, (11,))
        F.layer_norm(x, (7, 11), w, None, eps=1e-6)
        F.group_norm(xg, 3, wg, wg)
        F.group_norm(xg, 2)
    got = {}
    for r in rec.rows:
        spec = LN if r.op == "aten.native_layer_norm" else GN if r.op == "aten.native_group_norm" else None
        if spec is not None:
            got.setdefault(r.op, []).append(spec.problem_from_row(r))
    ln, gn = got["aten.native_layer_norm"], got["aten.native_group_norm"]
    assert all(isinstance(p, Problem) for p in ln + gn), ln + gn
    assert [p.dims for p in ln] == [(77,), (11,), (77,)]
    assert [dict(p.flags) for p in ln] == [{"weight": "1", "bias": "1"}, {"weight": "0", "bias": "0"},
                                           {"weight": "1", "bias": "0"}]
    assert [p.get("eps") for p in ln] == [1e-5, 1e-5, 1e-6]
    assert [p.get("M") for p in ln] == [3, 21, 3]
    assert [p.dims for p in gn] == [(70,), (105,)]
    assert [dict(p.flags) for p in gn] == [{"weight": "1", "bias": "1"}, {"weight": "0", "bias": "0"}]
    assert all(p.dtypes == ("bfloat16",) for p in gn)
    assert [p.get("M") for p in gn] == [6, 4]
    # RMS norm decomposes on the CPU and meta devices; CUDA dispatches _fused_rms_norm,
    # whose row is what the recorder's describe() writes.
    xr = torch.empty(3, 7, 11, dtype=torch.bfloat16)
    a = RMS.problem_from_row(_row(describe(torch.ops.aten._fused_rms_norm.default, (xr, [11], xr[0, 0], None), {})))
    b = RMS.problem_from_row(_row(describe(torch.ops.aten._fused_rms_norm.default, (xr, [7, 11], None, 1e-6), {})))
    c = RMS.problem_from_row(_row(describe(torch.ops.aten.rms_norm.default, (xr, [11]), {})))
    assert (a.dims, dict(a.flags), a.get("eps")) == ((11,), {"weight": "1"}, torch.finfo(torch.float32).eps)
    assert (b.dims, dict(b.flags), b.get("eps")) == ((77,), {"weight": "0"}, 1e-6)
    assert (c.dims, dict(c.flags)) == ((11,), {"weight": "0"})


LN_P = {"normalized_shape": "11", "eps": "1e-05"}
GN_P = {"N": "2", "C": "6", "HxW": "35", "group": "3", "eps": "1e-05"}


@pytest.mark.parametrize("spec,op,dtypes,shapes,params", [
    (LN, "aten.native_layer_norm", ["float32"] * 3, [(3, 11), (11,), (11,)], {"normalized_shape": "7", "eps": "1e-05"}),
    (LN, "aten.native_layer_norm", ["float32"] * 3, [(3, 11), (12,), (11,)], LN_P),
    (LN, "aten.native_layer_norm", ["float32"] * 2, [(3, 11), (11,)], LN_P),  # bias=None missing
    (LN, "aten.native_layer_norm", ["float32"], [(3, 11)], {**LN_P, "weight": "None"}),
    (LN, "aten.native_layer_norm", ["float32", "float16", "float16"], [(3, 11), (11,), (11,)], LN_P),
    (LN, "aten.native_layer_norm", ["float64"] * 3, [(3, 11), (11,), (11,)], LN_P),
    (LN, "aten.native_layer_norm", ["float32"] * 3, [(3, 11), (11,), (11,)], {"normalized_shape": "11"}),
    (LN, "aten.native_layer_norm", ["float32"] * 3, [(3, 11), (11,), (11,)], {"normalized_shape": "a", "eps": "1e-5"}),
    (LN, "aten.native_layer_norm", ["float32"] * 3, [(3, 11), (11,), (11,)], {"normalized_shape": "()", "eps": "1e-5"}),
    (LN, "aten.native_layer_norm", ["float32"] * 3, [(11,), (3, 11), (3, 11)], {"normalized_shape": "3x11", "eps": "1e-5"}),
    (LN, "aten.native_layer_norm", ["float32"] * 3, [(0, 11), (11,), (11,)], LN_P),
    (RMS, "aten._fused_rms_norm", ["float32"] * 2, [(3, 11), (7,)], {"normalized_shape": "11", "eps": "None"}),
    (RMS, "aten._fused_rms_norm", ["float32"], [(3, 11)], {"normalized_shape": "11", "eps": "None"}),
    (RMS, "aten._fused_rms_norm", ["int32"] * 2, [(3, 11), (11,)], {"normalized_shape": "11"}),
    (RMS, "aten._fused_rms_norm", ["float32"] * 2, [(3, 11), (11,)], {"normalized_shape": "11", "eps": "x"}),
    (RMS, "aten.rms_norm", ["float32"], [(3, 11)], {"weight": "None"}),
    (GN, "aten.native_group_norm", ["float32"] * 3, [(2, 6, 5, 7), (6,), (6,)], {**GN_P, "group": "4"}),
    (GN, "aten.native_group_norm", ["float32"] * 3, [(2, 6, 5, 7), (6,), (6,)], {**GN_P, "HxW": "36"}),
    (GN, "aten.native_group_norm", ["float32"] * 3, [(2, 6, 5, 7), (6,), (6,)], {**GN_P, "C": "7"}),
    (GN, "aten.native_group_norm", ["float32"] * 3, [(2, 6, 5, 7), (3,), (6,)], GN_P),
    (GN, "aten.native_group_norm", ["float32"] * 3, [(6,), (6,), (6,)], GN_P),
    (GN, "aten.native_group_norm", ["float32"] * 3, [(2, 6, 5, 7), (6,), (6,)], {**GN_P, "group": "0"}),
    (GN, "aten.native_group_norm", ["float32"] * 3, [(2, 6, 5, 7), (6,), (6,)], {"N": "2", "C": "6"}),
    (GN, "aten.native_group_norm", ["float32"], [(2, 6, 5, 7)], GN_P),  # weight/bias None missing
])
def test_not_servable_rows(spec, op, dtypes, shapes, params):
    r = spec.problem_from_row(make_row(op, dtypes, shapes, params))
    assert isinstance(r, NotServable) and r.reason, r


# ----------------------------------------------------------------------------- planted faults

class _WrongEps(norms.LayerNormSpec):
    def launch(self, config, problem, inputs, outputs):
        x = inputs["input"]
        N = problem.dims[0]
        norms.launch_row_norm(x, inputs.get("weight"), inputs.get("bias"), outputs["out"], outputs["mean"],
                              outputs["rstd"], x.numel() // N, N, 10.0, False, config)


class _LastRowSkipped(norms.RMSNormSpec):
    def launch(self, config, problem, inputs, outputs):
        x = inputs["input"]
        N = problem.dims[0]
        norms.launch_row_norm(x, inputs.get("weight"), None, outputs["out"], None, outputs["rstd"],
                              x.numel() // N - 1, N, problem.get("eps"), True, config)


class _OnePassAlways(norms.GroupNormSpec):
    """The one-block path whatever the group size: a group's tail is never written."""

    def launch(self, config, problem, inputs, outputs):
        shape = tuple(problem.get("shape"))
        G = problem.get("groups")
        hw = int(np.prod(shape[2:]))
        D = shape[1] // G * hw
        x = inputs["input"]
        norms._group_norm_kernel[(shape[0] * G,)](
            x, inputs["weight"], inputs["bias"], outputs["out"], outputs["mean"], outputs["rstd"],
            G, D, hw, shape[1] // G, problem.get("eps"), HAS_W=True, HAS_B=True, ONE_PASS=True,
            **config.kwargs)


def test_screen_catches_planted_faults(interp):
    key = ("aten.native_layer_norm", ("float32",) * 3, ((4, 37), (37,), (37,)),
           (("normalized_shape", "37"), ("eps", "1e-05")))
    p = LN.problem_from_row(_row(key))
    cfg = Config.make(ROWS=2, BLOCK=64, num_warps=4, num_stages=1)
    assert _screen(LN, p, cfg, interp).ok
    assert _screen(_WrongEps(), p, cfg, interp).reason == "wrong_answer"
    p = RMS.problem_from_row(make_row("aten._fused_rms_norm", ["float16"] * 2, [(5, 37), (37,)],
                                      {"normalized_shape": "37", "eps": "None"}))
    assert _screen(RMS, p, cfg, interp).ok
    assert _screen(_LastRowSkipped(), p, cfg, interp).reason == "unwritten_output"
    p = GN.problem_from_row(make_row("aten.native_group_norm", ["float32"] * 3, [(2, 6, 5, 7), (6,), (6,)], GN_P))
    small = Config.make(BLOCK=64, num_warps=4, num_stages=1)
    assert _screen(GN, p, small, interp).ok
    assert _screen(_OnePassAlways(), p, small, interp).reason == "unwritten_output"


# ----------------------------------------------------------------------------- spec shape

def test_spec_declarations(interp):
    for s in norms.SPECS:
        register(s, "tests")
        assert 10 <= len(s.configs()) <= 40
        assert len({c.key() for c in s.configs()}) == len(s.configs())
        assert s.source_hash and s.config_space_hash
    assert spec_for_op("aten.native_layer_norm.default") is LN
    assert spec_for_op("aten._fused_rms_norm") is RMS and spec_for_op("aten.rms_norm") is RMS
    assert spec_for_op("aten.native_group_norm") is GN
    hopper = get_profile("hopper")
    p = GN.problem_from_row(make_row("aten.native_group_norm", ["float16"] * 3, [(8, 320, 64, 64), (320,), (320,)],
                                     {"N": "8", "C": "320", "HxW": "4096", "group": "32", "eps": "1e-05"}))
    assert p.dims == (40960,)
    assert bucket_of(hopper, GN.key, p.dims) == ((32769, 65536),)
    assert GN.default_config(hopper, p)["BLOCK"] == 16384
    for c in GN.configs():
        assert GN.static_refusal(hopper, c, p) is None and GN.smem_bytes(c, p) > 0
    ln = LN.problem_from_row(make_row("aten.native_layer_norm", ["bfloat16"] * 3, [(512, 768), (768,), (768,)],
                                      {"normalized_shape": "768", "eps": "1e-05"}))
    assert LN.default_config(interp, ln)["BLOCK"] == 1024
    for c in LN.configs():
        assert 0 < LN.smem_bytes(c, ln) <= 2048  # cross-warp reduction scratch only
    assert LN.smem_bytes(Config.make(ROWS=8, BLOCK=256, num_warps=8), ln) > \
        LN.smem_bytes(Config.make(ROWS=1, BLOCK=1024, num_warps=4), ln)


@pytest.mark.parametrize("spec", norms.SPECS, ids=lambda s: s.name)
def test_gpu_rows_are_servable(spec):
    rows = spec.example_rows("gpu")
    assert {r.dtypes[0] for r in rows} == set(spec.dtypes)
    probs = [spec.problem_from_row(r) for r in rows]
    assert all(isinstance(p, Problem) for p in probs), probs
