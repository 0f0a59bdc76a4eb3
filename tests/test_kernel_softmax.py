"""Softmax family on the interpreter: every example row against the fp64 oracle under
several configs, every distinct config on a long and a strided row, the public ops,
trace rows (recorded by the dispatcher and hand-written) to problems, NotServable rows,
and planted wrong results the screen must catch."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from nbx_tune.errors import KernelError
from nbx_tune.kernels.runtime.registry import register, spec_for_op
from nbx_tune.kernels.spec import Config, NotServable, Problem
from nbx_tune.oracles import softmax as oracle
from nbx_tune.profiles import get_profile
from nbx_tune.tuner.certify import screen as screening
from nbx_tune.tuner.certify.selfcheck import check_kernel
from nbx_tune.kernels.trace import make_row
from nbx_tune.tuner.certify.tune import static_prune

# Masked lanes hold -inf; the interpreter's numpy warns about -inf - -inf there.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

sm = importlib.import_module("nbx_tune.kernels.softmax")  # the module (the package's `softmax` is the op)
SPEC = sm.SPEC


@pytest.fixture(scope="module")
def interp():
    return get_profile("interpreter")


def _problem(op, dtype, shape, **params):
    p = SPEC.problem_from_row(make_row(op, [dtype], [shape], {k: str(v) for k, v in params.items()}))
    assert isinstance(p, Problem), p
    return p


def _screen(spec, problem, config, profile, seed=7):
    case = screening.make_case(spec, problem, "cpu", seed, True)
    return screening.screen(spec, config, case, profile.rtol(problem.dtypes[0]), "cpu")


# ----------------------------------------------------------------------------- correctness

def test_selfcheck_small_rows(interp):
    checks = check_kernel(SPEC, interp, "cpu", "small", configs_per_row=3)
    bad = [c for c in checks if not c.ok]
    assert not bad, [(c.op, c.shapes, c.dtype, str(c.config), c.reason, c.detail) for c in bad]
    assert all(c.err is not None and c.err <= c.rtol for c in checks)
    assert {c.op for c in checks} == set(SPEC.ops)
    assert {c.dtype for c in checks} == {"float16", "float32"}  # bf16 is skipped here
    # Both paths ran: a row held in one block and a row longer than the block.
    assert any(c.shapes == ((1, 4099),) and c.config["BLOCK"] < 4099 for c in checks)
    assert any(c.shapes == ((1, 4099),) and c.config["BLOCK"] >= 4099 for c in checks)


@pytest.mark.parametrize("op,dtype,shape,dim", [
    ("aten._softmax", "float32", (2, 1300), -1),      # loops under every block < 2048
    ("aten._log_softmax", "float16", (3, 67, 5), 1),  # strided rows
    ("aten._safe_softmax", "float32", (6, 45), -1),   # fully masked rows
])
def test_every_distinct_config(interp, op, dtype, shape, dim):
    params = {"dim": dim} if op == "aten._safe_softmax" else {"dim": dim, "half_to_float": False}
    problem = _problem(op, dtype, shape, **params)
    keep, refused = static_prune(SPEC, interp, problem)
    assert len(keep) >= 8  # the interpreter collapses warps / stages, not block shapes
    case = screening.make_case(SPEC, problem, "cpu", 11, True)
    for config in keep:
        r = screening.screen(SPEC, config, case, interp.rtol(dtype), "cpu")
        assert r.ok, (str(config), r.reason, r.detail)


def test_safe_softmax_zeroes_masked_rows_and_softmax_gives_nan():
    x = np.array([[0.0, 1.0, -np.inf], [-np.inf, -np.inf, -np.inf]])
    assert np.all(oracle.safe_softmax(x, 1)[1] == 0)
    assert np.all(np.isnan(oracle.softmax(x, 1)[1]))
    assert oracle.log_softmax(x, 1)[0, 2] == -np.inf
    np.testing.assert_allclose(oracle.softmax(x, 1)[0, :2], np.exp([0, 1]) / np.exp([0, 1]).sum())


def test_inputs_include_dominant_and_masked_rows():
    problem = _problem("aten._safe_softmax", "float32", (9, 45), dim=-1)
    x, _ = SPEC.make_inputs(problem, np.random.default_rng(0))["x"]
    assert np.all(np.isneginf(x[1]))                     # a fully masked row
    assert np.isneginf(x[2]).any() and np.isfinite(x[2]).any()  # a partly masked one
    assert x[0].max() - np.sort(x[0])[-2] > 5            # one entry dominates
    assert np.isfinite(x[3:]).sum() > 0 and x[np.isfinite(x)].std() > 2


# ----------------------------------------------------------------------------- public ops

@pytest.mark.parametrize("shape,dim", [((3, 45), -1), ((2, 5, 37), 1), ((1, 4099), -1), ((37,), 0)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_public_ops_against_oracle(shape, dim, dtype):
    torch.manual_seed(0)
    x = (3 * torch.randn(shape)).to(dtype)
    ref64 = x.double().numpy()
    tol = 2e-3 if dtype == torch.float16 else 1e-5
    y = sm.softmax(x, dim)
    assert y.dtype == dtype and y.shape == x.shape
    np.testing.assert_allclose(y.double().numpy(), oracle.softmax(ref64, dim % x.dim()), atol=tol, rtol=0)
    z = sm.log_softmax(x, dim)
    ref = oracle.log_softmax(ref64, dim % x.dim())
    assert np.max(np.abs(z.double().numpy() - ref)) <= tol * np.max(np.abs(ref)) * 10


def test_public_ops_strided_input_and_fp32_output():
    torch.manual_seed(1)
    x = (3 * torch.randn(37, 6)).to(torch.float16).t()  # not contiguous
    y = sm.softmax(x, -1, dtype=torch.float32)
    assert y.dtype == torch.float32
    np.testing.assert_allclose(y.numpy(), F.softmax(x.float(), -1).numpy(), atol=1e-6)
    np.testing.assert_allclose(sm.log_softmax(x, 0).float().numpy(),
                               F.log_softmax(x.float(), 0).numpy(), atol=2e-2)


def test_public_ops_refuse_what_they_do_not_serve():
    x = torch.randn(3, 4)
    with pytest.raises(KernelError):
        sm.softmax(x.double(), -1)
    with pytest.raises(KernelError):
        sm.softmax(x, 2)
    with pytest.raises(KernelError):
        sm.softmax(x, -1, dtype=torch.float16)
    with pytest.raises(KernelError, match="bfloat16"):  # not on the interpreter profile
        sm.softmax(x.bfloat16(), -1)
    assert sm.softmax(torch.empty(0, 5), -1).shape == (0, 5)


# ----------------------------------------------------------------------------- trace rows

def test_problems_from_recorded_rows():
    from nbx_tune.tuner.trace.recorder import Recorder

    x = torch.empty(3, 7, 11, device="meta", dtype=torch.float16)
    with Recorder() as rec:
        F.softmax(x, -1)
        F.softmax(x, 1)
        F.log_softmax(x, 0)
        torch.ops.aten._safe_softmax(x, 2)
    rows = [r for r in rec.rows if r.op in ("aten._softmax", "aten._log_softmax", "aten._safe_softmax")]
    assert len(rows) == 4
    got = [SPEC.problem_from_row(r) for r in rows]
    assert all(isinstance(p, Problem) for p in got), got
    assert [p.dims for p in got] == [(11,), (7,), (3,), (11,)]
    assert [dict(p.flags) for p in got] == [
        {"log": "0", "safe": "0", "strided": "0"}, {"log": "0", "safe": "0", "strided": "1"},
        {"log": "1", "safe": "0", "strided": "1"}, {"log": "0", "safe": "1", "strided": "0"}]
    assert all(p.dtypes == ("float16", "float16") for p in got)
    assert [p.get("dim") for p in got] == [2, 1, 0, 2]


def test_problems_from_hand_written_rows():
    def p(op, dt, shape, **params):
        return SPEC.problem_from_row(make_row(op, [dt], [shape], params))

    assert p("aten._softmax", "float16", (8, 151936), dim="-1", half_to_float="True").dtypes == ("float16", "float32")
    assert p("aten._softmax.default", "bfloat16", (4, 9), dim="1").dtypes == ("bfloat16", "bfloat16")
    assert p("aten._safe_softmax", "bfloat16", (4, 9), dim="1", dtype="float32").dtypes == ("bfloat16", "float32")
    assert p("aten._safe_softmax", "float32", (4, 9), dim="1", dtype="float32").dtypes == ("float32", "float32")
    big = p("aten._log_softmax", "float32", (8, 32, 512, 512), dim="-1", half_to_float="False")
    assert big.dims == (512,) and dict(big.flags)["strided"] == "0" and big.get("M") == 8 * 32 * 512
    # Of two problems with one row length, the one with more rows is the larger.
    many = p("aten._softmax", "float32", (100, 1000), dim="-1")
    few = p("aten._softmax", "float32", (2, 3, 1000), dim="2")
    assert max([few, many], key=Problem.order) is many


@pytest.mark.parametrize("op,dtypes,shapes,params", [
    ("aten._softmax", ["float32", "float32"], [(3, 4), (3, 4)], {"dim": "-1"}),
    ("aten._softmax", ["float64"], [(3, 4)], {"dim": "-1"}),
    ("aten._softmax", ["int64"], [(3, 4)], {"dim": "-1"}),
    ("aten._softmax", ["float32"], [(3, 4)], {"dim": "2"}),
    ("aten._softmax", ["float32"], [(3, 4)], {"dim": "-3"}),
    ("aten._softmax", ["float32"], [(3, 4)], {"dim": "abc"}),
    ("aten._softmax", ["float32"], [(3, 4)], {}),
    ("aten._softmax", ["float32"], [()], {"dim": "0"}),
    ("aten._softmax", ["float32"], [(0, 4)], {"dim": "-1"}),
    ("aten._softmax", ["float32"], [(3, 4)], {"dim": "-1", "half_to_float": "True"}),
    ("aten._softmax", ["float16"], [(3, 4)], {"dim": "-1", "half_to_float": "maybe"}),
    ("aten._safe_softmax", ["float32"], [(3, 4)], {"dim": "-1", "dtype": "float16"}),
    ("aten._safe_softmax", ["float16"], [(3, 4)], {"dim": "-1", "dtype": "float64"}),
    ("aten._softmax", ["float32"], [(2, 2**31)], {"dim": "-1"}),
    ("aten._softmax", [], [], {"dim": "-1"}),
    ("aten.softmax", ["float32"], [(3, 4)], {"dim": "-1"}),
])
def test_not_servable_rows(op, dtypes, shapes, params):
    r = SPEC.problem_from_row(make_row(op, dtypes, shapes, params))
    assert isinstance(r, NotServable) and r.reason


# ----------------------------------------------------------------------------- planted faults

class _OnePassAlways(sm.SoftmaxSpec):
    """Launches the one-block path whatever the row length: the tail is never written."""

    def launch(self, config, problem, inputs, outputs):
        x, y = inputs["x"], outputs["out"]
        d3 = sm._view3(x.shape, problem.get("dim"))
        x3, y3 = x.view(d3), y.view(d3)
        sm._softmax_kernel[(d3[0] * d3[2],)](
            x3, y3, d3[0] * d3[2], d3[1], d3[2], x3.stride(0), x3.stride(2), x3.stride(1),
            y3.stride(0), y3.stride(2), y3.stride(1), LOG=False, SAFE=False, ONE_PASS=True,
            **config.kwargs)


class _LogInstead(sm.SoftmaxSpec):
    def launch(self, config, problem, inputs, outputs):
        d3 = sm._view3(inputs["x"].shape, problem.get("dim"))
        sm.launch_softmax(inputs["x"].view(d3), outputs["out"].view(d3), True, False, config)


class _SkipLastRows(sm.SoftmaxSpec):
    def launch(self, config, problem, inputs, outputs):
        d3 = sm._view3(inputs["x"].shape, problem.get("dim"))
        d3 = (d3[0] - 1, d3[1], d3[2])
        sm.launch_softmax(inputs["x"][:-1].view(d3), outputs["out"][:-1].view(d3), False, False, config)


def test_screen_catches_planted_faults(interp):
    problem = _problem("aten._softmax", "float32", (3, 300), dim=-1, half_to_float=False)
    small = Config.make(ROWS=1, BLOCK=64, num_warps=4, num_stages=1)
    assert _screen(SPEC, problem, small, interp).ok
    r = _screen(_OnePassAlways(), problem, small, interp)
    assert r.reason == "unwritten_output", r
    unmasked = _problem("aten._softmax", "float32", (2, 300), dim=-1, half_to_float=False)
    r = _screen(_LogInstead(), unmasked, small, interp)
    assert r.reason == "wrong_answer", r
    r = _screen(_SkipLastRows(), problem, Config.make(ROWS=2, BLOCK=512, num_warps=4, num_stages=1), interp)
    assert r.reason == "unwritten_output", r


# ----------------------------------------------------------------------------- spec shape

def test_spec_declarations(interp):
    register(SPEC, "tests")
    assert spec_for_op("aten._softmax.default") is SPEC
    assert spec_for_op("aten._safe_softmax") is SPEC
    assert 10 <= len(SPEC.configs()) <= 40
    assert len({c.key() for c in SPEC.configs()}) == len(SPEC.configs())
    hopper = get_profile("hopper")
    long_row = _problem("aten._softmax", "float32", (8, 151936), dim=-1, half_to_float=False)
    short = _problem("aten._softmax", "float16", (4096, 45), dim=-1, half_to_float=False)
    for c in SPEC.configs():
        assert 0 < SPEC.smem_bytes(c, short) <= 2048  # cross-warp reduction scratch only
        assert SPEC.static_refusal(hopper, c, long_row) is None
    # More rows or warps a program need more cross-warp scratch.
    assert SPEC.smem_bytes(Config.make(ROWS=8, BLOCK=128, num_warps=8), short) > \
        SPEC.smem_bytes(Config.make(ROWS=1, BLOCK=1024, num_warps=4), short)
    # Defaults grow with the row: the smallest block that holds it, the largest beyond.
    assert SPEC.default_config(interp, short)["BLOCK"] == 64
    assert SPEC.default_config(interp, _problem("aten._softmax", "float32", (2, 1000), dim=-1))["BLOCK"] == 1024
    assert SPEC.default_config(hopper, long_row)["BLOCK"] == 16384
    # The launch key buckets the row length on the `row` ladder.
    from nbx_tune.kernels.spec import bucket_of
    assert bucket_of(hopper, SPEC.key, long_row.dims) == ((131073, 262144),)
    assert SPEC.source_hash and SPEC.config_space_hash


def test_gpu_rows_are_servable():
    rows = SPEC.example_rows("gpu")
    assert {r.dtypes[0] for r in rows} == set(SPEC.dtypes)
    probs = [SPEC.problem_from_row(r) for r in rows]
    assert all(isinstance(p, Problem) for p in probs), probs
    assert any(p.dims == (151936,) for p in probs)
