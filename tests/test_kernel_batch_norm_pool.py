"""Batch norm (inference) and max pooling on the interpreter: example rows through the screen
under several configs, the public ops against torch at odd shapes (max pooling's values and
indices bit for bit, ties included), recorded rows to problems, refusals, and a planted
pooling that keeps the last maximum instead of the first."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from nbx_tune.errors import KernelError
from nbx_tune.kernels import batchnorm as bn
from nbx_tune.kernels import pool
from nbx_tune.kernels.runtime.registry import spec_for_op
from nbx_tune.kernels.spec import NotServable
from nbx_tune.oracles import pool as pool_oracle
from nbx_tune.profiles import get_profile
from nbx_tune.tuner.certify import screen as screening
from nbx_tune.tuner.certify.selfcheck import check_kernel
from nbx_tune.kernels.trace import make_row

PROFILE = get_profile("interpreter")
RTOL = {torch.float16: 2e-2, torch.float32: 1e-4}


@pytest.mark.parametrize("spec", [bn.SPEC, pool.SPEC], ids=lambda s: s.name)
def test_selfcheck_small_rows_pass_the_screen(spec):
    checks = check_kernel(spec, PROFILE, "cpu", "small", configs_per_row=3)
    bad = [(c.op, c.shapes, c.dtype, str(c.config), c.reason, c.detail) for c in checks if not c.ok]
    assert not bad
    assert {c.dtype for c in checks} >= {"float16", "float32"} and len({c.config for c in checks}) >= 2
    if spec is pool.SPEC:
        assert all(c.err == 0.0 and c.rtol == 0.0 for c in checks)  # values and indices exact
    else:
        assert all(c.err <= c.rtol for c in checks) and max(c.err for c in checks) > 0


@pytest.mark.parametrize("spec", [bn.SPEC, pool.SPEC], ids=lambda s: s.name)
def test_gpu_rows_are_servable_and_claim_every_dtype(spec):
    problems = [spec.problem_from_row(r) for r in spec.example_rows("gpu")]
    assert not [p for p in problems if isinstance(p, NotServable)]
    assert {p.dtypes[0] for p in problems} == {"float16", "bfloat16", "float32"}
    assert 3 <= len(spec.configs()) <= 6


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_batch_norm_equals_torch(dtype):
    g = torch.Generator().manual_seed(0)
    for shape in ((3, 7, 5, 9), (2, 13), (1, 24, 2, 2), (2, 5, 3, 4, 3)):
        C = shape[1]
        x = (torch.randn(shape, generator=g) * 2).to(dtype)
        mean, var = torch.randn(C, generator=g), torch.rand(C, generator=g) + 0.25
        w, b = torch.randn(C, generator=g), torch.randn(C, generator=g)
        for stats in ((mean, var, w, b), tuple(t.to(dtype) for t in (mean, var, w, b))):
            m, v, ww, bb = stats
            want = F.batch_norm(x.double(), m.double(), v.double(), ww.double(), bb.double(), False, 0.1, 1e-3)
            got = bn.batch_norm(x, ww, bb, m, v, False, 0.1, 1e-3)
            assert got.dtype == dtype and got.shape == x.shape
            err = float((got.double() - want).abs().max() / want.abs().max())
            assert err <= RTOL[dtype], (shape, err)
        got, sm, si = bn._native_batch_norm_legit_no_training(x, None, None, mean, var, 0.1, 1e-5)
        want = F.batch_norm(x.double(), mean.double(), var.double(), None, None, False, 0.1, 1e-5)
        assert float((got.double() - want).abs().max() / want.abs().max()) <= RTOL[dtype]
        assert sm.numel() == 0 and si.numel() == 0
    with pytest.raises(KernelError):
        bn.batch_norm(x, None, None, mean, var, True, 0.1, 1e-5)
    with pytest.raises(KernelError):
        bn.batch_norm(x, None, None, None, None, False, 0.1, 1e-5)


def _ties(shape, g, dtype):
    """Few distinct values: windows hold equal maxima, which torch resolves to the first."""
    return (torch.randint(-3, 4, shape, generator=g).to(dtype) * 0.5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_max_pool_values_and_indices_equal_torch(dtype):
    g = torch.Generator().manual_seed(1)
    cases = [((1, 3, 17, 13), dict(kernel_size=3, stride=2, padding=1)),
             ((2, 5, 9), dict(kernel_size=2)),
             ((1, 3, 17, 13), dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 0), dilation=(2, 1))),
             ((2, 5, 9, 11), dict(kernel_size=3, stride=2, ceil_mode=True)),
             ((1, 2, 8, 8), dict(kernel_size=1))]
    for shape, kw in cases:
        for x in (torch.randn(shape, generator=g).to(dtype), _ties(shape, g, dtype)):
            want, want_i = F.max_pool2d(x, return_indices=True, **kw)
            k = kw["kernel_size"]
            got, got_i = pool.max_pool2d_with_indices(x, k, kw.get("stride", ()), kw.get("padding", 0),
                                                      kw.get("dilation", 1), kw.get("ceil_mode", False))
            assert torch.equal(got, want) and torch.equal(got_i, want_i), (shape, kw)
            o, oi = pool_oracle.max_pool2d_with_indices(
                x.double().numpy(), *[(v, v) if isinstance(v, int) else v for v in (
                    k, kw.get("stride", k), kw.get("padding", 0), kw.get("dilation", 1))],
                kw.get("ceil_mode", False))
            assert np.array_equal(o, want.double().numpy()) and np.array_equal(oi, want_i.numpy())
    xt = torch.randn(1, 3, 13, 17, generator=g).to(dtype).transpose(2, 3)  # non-contiguous
    assert torch.equal(pool.max_pool2d_with_indices(xt, 3, 2, 1)[0], F.max_pool2d(xt, 3, 2, 1))
    with pytest.raises(KernelError):
        pool.max_pool2d_with_indices(x, 3, 1, 2)  # padding over half the window


def _last_max_indices(x: np.ndarray, k: int, st: int, p: int) -> np.ndarray:
    """A planted pooling: `>=` instead of `>`, so a tie keeps the last maximum."""
    *lead, H, W = x.shape
    OH, OW = (H + 2 * p - k) // st + 1, (W + 2 * p - k) // st + 1
    best = np.full((*lead, OH, OW), -np.inf)
    idx = np.zeros((*lead, OH, OW), dtype=np.int64)
    for oh in range(OH):
        for ow in range(OW):
            for h in range(oh * st - p, oh * st - p + k):
                for w in range(ow * st - p, ow * st - p + k):
                    if 0 <= h < H and 0 <= w < W:
                        v = x[..., h, w]
                        take = v >= best[..., oh, ow]
                        best[..., oh, ow] = np.where(take, v, best[..., oh, ow])
                        idx[..., oh, ow] = np.where(take, h * W + w, idx[..., oh, ow])
    return idx


def test_planted_last_maximum_fails_the_exact_screen():
    """Indices of the last maximum in each window are off exactly where windows tie (fp16
    inputs are drawn on a coarse grid so that they do): the exact screen catches it."""
    spec = pool.SPEC
    problem = spec.problem_from_row(make_row("aten.max_pool2d_with_indices", ["float16"], [(1, 3, 17, 13)],
                                             {"kernel_size": "3x3", "stride": "2x2", "padding": "1x1"}))
    case = screening.make_case(spec, problem, "cpu", 3, True)
    x = case.inputs["x"].reshape(1, 3, 17, 13)
    out, first = F.max_pool2d(x, 3, 2, 1, return_indices=True)
    last = torch.from_numpy(_last_max_indices(x.double().numpy(), 3, 2, 1))
    assert not torch.equal(last, first)  # the inputs do tie
    r = screening.compare("indices", last, case.reference("indices", first), 0.0, problem)
    assert r.reason == "wrong_answer"
    assert screening.compare("indices", first, case.reference("indices", first), 0.0, problem).ok
    assert screening.compare("out", out, case.reference("out", out), 0.0, problem).ok


def test_recorded_rows_map_and_bad_rows_say_why():
    from nbx_tune.tuner.trace.recorder import Recorder

    x = torch.randn(2, 8, 9, 9)
    m = torch.nn.BatchNorm2d(8).eval()
    with torch.inference_mode(), Recorder() as rec:
        m(x)
        F.max_pool2d(x, 3, 2, 1)
        F.batch_norm(x, m.running_mean, m.running_var, None, None, False)
    names = [spec_for_op(r.op).name for r in rec.rows]
    assert set(names) == {"batch_norm", "max_pool2d"}
    for r in rec.rows:
        assert not isinstance(spec_for_op(r.op).problem_from_row(r), NotServable), r
    bad = [(make_row("aten.batch_norm", ["float32"] * 5, [(2, 8, 3), (8,), (8,), (8,), (8,)],
                     {"training": "True"}), "training=True"),
           (make_row("aten.batch_norm", ["float32"] * 3, [(2, 8, 3), (8,), (8,)],
                     {"running_mean": "None", "running_var": "None"}), "running statistics"),
           (make_row("aten.batch_norm", ["float32"] * 5, [(2, 8, 3), (8,), (8,), (8,), (7,)]), "statistics of shapes"),
           (make_row("aten.max_pool2d_with_indices", ["float32"], [(2, 8, 9, 9)],
                     {"kernel_size": "9x9"}), "taps"),
           (make_row("aten.max_pool2d_with_indices", ["float64"], [(2, 8, 9, 9)], {"kernel_size": "2x2"}), "dtype")]
    for row, why in bad:
        p = spec_for_op(row.op).problem_from_row(row)
        assert isinstance(p, NotServable) and why in p.reason, (row.op, p)
