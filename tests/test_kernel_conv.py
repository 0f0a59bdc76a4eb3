"""Convolution family on the interpreter: every example row against the fp64 oracle under
several configs (implicit GEMM and depthwise, 1-D and 2-D, grouped), the public ops
(strides, padding 'same'/'valid', non-contiguous inputs, unbatched), trace rows recorded by
the dispatcher to problems, NotServable rows, the depthwise config equivalence, and planted
wrong results the screen must catch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from nbx_tune.errors import KernelError
from nbx_tune.kernels import conv as cv
from nbx_tune.kernels.runtime.registry import register, spec_for_op
from nbx_tune.kernels.spec import NotServable, Problem, bucket_of
from nbx_tune.oracles import conv as oracle
from nbx_tune.profiles import get_profile
from nbx_tune.tuner.certify import screen as screening
from nbx_tune.tuner.certify.selfcheck import check_kernel
from nbx_tune.kernels.trace import make_row
from nbx_tune.tuner.certify.tune import static_prune

SPEC = cv.SPEC
ROW_PARAMS = ("stride", "padding", "dilation", "transposed", "output_padding", "groups")


@pytest.fixture(scope="module")
def interp():
    return get_profile("interpreter")


def _row(dtype, x, w, bias=True, stride="1x1", padding="0x0", dilation="1x1", groups=1, **more):
    shapes = [x, w] + ([(w[0],)] if bias else [])
    params = {} if bias else {"bias": "None"}
    params.update(stride=stride, padding=padding, dilation=dilation, transposed="False",
                  output_padding="0x0" if len(x) == 4 else "0", groups=str(groups))
    params.update(more)
    return make_row("aten.convolution", [dtype] * len(shapes), shapes, params)


def _problem(*args, **kw):
    p = SPEC.problem_from_row(_row(*args, **kw))
    assert isinstance(p, Problem), p
    return p


def _screen(spec, problem, config, profile, seed=11):
    case = screening.make_case(spec, problem, "cpu", seed, True)
    return screening.screen(spec, config, case, profile.rtol(problem.dtypes[0]), "cpu")


def _rel(out: torch.Tensor, ref: np.ndarray) -> float:
    return float(np.abs(out.double().numpy() - ref).max() / np.abs(ref).max())


# ----------------------------------------------------------------------------- correctness

@pytest.mark.slow
def test_selfcheck_small_rows(interp):
    checks = check_kernel(SPEC, interp, "cpu", "small", configs_per_row=3)
    bad = [c for c in checks if not c.ok]
    assert not bad, [(c.shapes, c.dtype, str(c.config), c.reason, c.detail) for c in bad]
    assert all(c.err is not None and c.err <= c.rtol for c in checks)
    assert {c.dtype for c in checks} == {"float16", "float32"}  # bf16 is skipped here
    # every kind of row ran: 2-D and 1-D, GEMM (dense and grouped) and depthwise
    rows = {(r.shapes, r.dtypes[0]): r for r in SPEC.example_rows("small")}
    seen = set()
    for c in checks:
        p = SPEC.problem_from_row(rows[(c.shapes, c.dtype)])
        seen.add((p.get("rank"), dict(p.flags)["kind"], p.dims[-1] > 1))
    assert {(2, "gemm", False), (2, "gemm", True), (2, "depthwise", True), (1, "gemm", False),
            (1, "depthwise", True), (2, "pointwise", False)} <= seen
    per_row = {}
    for c in checks:
        per_row.setdefault((c.shapes, c.dtype), set()).add(c.config)
    assert len(per_row) == 16 and all(len(v) >= 2 for v in per_row.values())


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("x,w,stride,padding,dilation,groups,bias", [
    ((1, 5, 17, 6), (4, 5, 2, 3), "3x1", "2x0", "1x2", 1, True),     # anisotropic everything
    ((3, 33, 5, 7), (19, 33, 3, 3), "1x1", "1x1", "1x1", 1, False),  # C_in over BLOCK_K
    ((2, 4, 9, 8), (12, 1, 3, 3), "2x2", "1x1", "1x1", 4, True),     # depthwise, multiplier 3
    ((1, 1, 13, 11), (6, 1, 5, 5), "1x1", "2x2", "1x1", 1, False),   # C_in=1: direct kernel
    ((2, 8, 6, 7), (8, 2, 1, 3), "1x2", "0x1", "1x1", 4, False),     # grouped
])
@pytest.mark.slow
def test_each_config_class(interp, dtype, x, w, stride, padding, dilation, groups, bias):
    """Distinct tile shapes at awkward geometries, each against the oracle."""
    p = _problem(dtype, x, w, bias, stride, padding, dilation, groups)
    keep, _ = static_prune(SPEC, interp, p)
    picked = [next(c for c in keep if (c["BLOCK_M"], c["BLOCK_N"]) == (32, 32)),
              next(c for c in keep if (c["BLOCK_M"], c["BLOCK_N"]) == (128, 16))]
    if dict(p.flags)["kind"] == "gemm":  # channels-last copies (the depthwise kernel ignores NHWC)
        picked.append(next(c for c in keep if c["NHWC"] == 1))
    else:
        assert not any(c["NHWC"] for c in keep)
    for c in picked:
        r = _screen(SPEC, p, c, interp)
        assert r.ok and r.err <= r.rtol, (str(c), r.reason, r.detail)


def test_public_ops_match_oracle():
    g = torch.Generator().manual_seed(3)
    rn = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    for dt in (torch.float16, torch.float32):
        tol = 2e-2 if dt == torch.float16 else 1e-4
        x, w, b = rn(2, 6, 15, 12).to(dt), (rn(10, 6, 3, 3) / 7).to(dt), rn(10).to(dt)
        xd, wd, bd = (t.double().numpy() for t in (x, w, b))
        y = cv.conv2d(x, w, b, stride=(2, 1), padding=(1, 2), dilation=(1, 2))
        assert y.dtype == dt and y.is_contiguous()
        assert _rel(y, oracle.conv2d(xd, wd, bd, (2, 1), (1, 2), (1, 2))) <= tol
        # channels-last and a sliced view: strides are honoured, the output is NCHW contiguous
        ycl = cv.conv2d(x.contiguous(memory_format=torch.channels_last), w, b, padding=1)
        assert ycl.is_contiguous() and _rel(ycl, oracle.conv2d(xd, wd, bd, 1, 1)) <= tol
        xs = x[:, :, 1:, ::2]
        assert _rel(cv.conv2d(xs, w), oracle.conv2d(xs.double().numpy(), wd)) <= tol
        # padding='same' with an even filter pads one more after than before, like torch
        we = (rn(4, 6, 4, 2) / 7).to(dt)
        ys = cv.conv2d(x, we, padding="same")
        ref = oracle.conv2d(np.pad(xd, ((0, 0), (0, 0), (1, 2), (0, 1))), we.double().numpy())
        assert ys.shape == (2, 4, 15, 12) and _rel(ys, ref) <= tol
        assert cv.conv2d(x, w, padding="valid").shape == (2, 10, 13, 10)
        # unbatched, depthwise with multiplier 2 (the direct kernel)
        wdw = (rn(12, 1, 3, 3) / 3).to(dt)
        yu = cv.conv2d(x[0], wdw, None, stride=2, padding=1, groups=6)
        assert yu.shape == (12, 8, 6)
        assert _rel(yu, oracle.conv2d(xd[:1], wdw.double().numpy(), None, 2, 1, 1, 6)[0]) <= tol
        # conv1d: plain, strided-dilated-grouped, 'same', unbatched
        x1, w1, b1 = rn(3, 4, 37).to(dt), (rn(7, 4, 5) / 4).to(dt), rn(7).to(dt)
        x1d, w1d, b1d = (t.double().numpy() for t in (x1, w1, b1))
        assert _rel(cv.conv1d(x1, w1, b1, padding=2), oracle.conv1d(x1d, w1d, b1d, 1, 2)) <= tol
        wg = (rn(6, 2, 3) / 3).to(dt)
        assert _rel(cv.conv1d(x1, wg, None, 2, 1, 3, 2),
                    oracle.conv1d(x1d, wg.double().numpy(), None, 2, 1, 3, 2)) <= tol
        y1 = cv.conv1d(x1[1], w1, b1, padding="same")
        assert y1.shape == (7, 37) and _rel(y1, oracle.conv1d(x1d[1:], w1d, b1d, 1, 2)[0]) <= tol


def test_public_ops_agree_with_torch_shapes_and_refuse_bad_calls():
    x, w = torch.randn(1, 4, 9, 9), torch.randn(8, 4, 3, 3)
    assert cv.conv2d(x, w, stride=3, padding=2, dilation=2).shape == \
        F.conv2d(x, w, stride=3, padding=2, dilation=2).shape
    with pytest.raises(KernelError, match="groups"):
        cv.conv2d(x, torch.randn(8, 3, 3, 3))
    with pytest.raises(KernelError, match="mixed dtypes"):
        cv.conv2d(x, w.half())
    with pytest.raises(KernelError, match="not served"):
        cv.conv2d(x.double(), w.double())
    with pytest.raises(KernelError, match="same"):
        cv.conv2d(x, w, stride=2, padding="same")
    with pytest.raises(KernelError, match="larger"):
        cv.conv2d(x, torch.randn(8, 4, 11, 3))
    with pytest.raises(KernelError, match="rank"):
        cv.conv1d(x, w)
    with pytest.raises(KernelError, match="bias"):
        cv.conv2d(x, w, torch.randn(7))


# ----------------------------------------------------------------------------- trace rows

def test_rows_recorded_by_the_dispatcher_map_to_problems():
    from nbx_tune.tuner.trace.recorder import Recorder

    x = torch.randn(2, 3, 11, 13)
    with torch.inference_mode(), Recorder() as rec:
        F.conv2d(x, torch.randn(5, 3, 3, 3), torch.randn(5), padding=1)
        F.conv2d(x, torch.randn(5, 3, 3, 3), stride=2, dilation=2)
        F.conv2d(torch.randn(2, 6, 9, 10), torch.randn(12, 1, 3, 3), padding=1, groups=6)
        F.conv1d(torch.randn(2, 4, 37), torch.randn(7, 4, 5), torch.randn(7), padding=2)
        F.conv2d(torch.randn(1, 8, 6, 6), torch.randn(8, 2, 3, 3), groups=4)
    rows = [r for r in rec.rows if r.op == "aten.convolution"]
    assert len(rows) == 5
    assert spec_for_op("aten.convolution") is None or spec_for_op("aten.convolution") is SPEC
    register(SPEC)
    assert spec_for_op("aten.convolution") is SPEC
    ps = [SPEC.problem_from_row(r) for r in rows]
    assert all(isinstance(p, Problem) for p in ps), ps
    flags = [dict(p.flags) for p in ps]
    assert [p.dims for p in ps] == [
        (2 * 11, 13, 3, 5, 1),  # R = N*H_out, W = W_out, CI, CO, G
        (2 * 4, 5, 3, 5, 1),
        (2 * 9, 10, 6, 12, 6),
        (2, 37, 4, 7, 1),  # 1-D: one row per batch entry, the width on the W ladder
        (1 * 4, 4, 8, 8, 4),
    ]
    assert flags[0] == {"bias": "1", "filter": "3x3", "kind": "gemm", "stride": "1x1"}
    assert flags[1] == {"bias": "0", "filter": "3x3", "kind": "gemm", "stride": "2x2"}
    assert flags[2]["kind"] == "depthwise" and flags[4]["kind"] == "gemm"
    assert flags[3] == {"bias": "1", "filter": "1x5", "kind": "gemm", "stride": "1x1"}
    assert all(p.dtypes == ("float32",) for p in ps)
    assert ps[1].get("dilation") == (2, 2) and ps[3].get("padding") == (0, 2) and ps[3].get("rank") == 1
    # shapes round-trip: the inputs the screen builds are the recorded ones
    for r, p in zip(rows, ps):
        assert [s for s, _ in SPEC.input_shapes(p).values()] == [tuple(s) for s in r.shapes]
    assert SPEC.output_specs(ps[3])["out"] == ((2, 7, 37), "float32")
    # the 1-D width buckets on the W ladder: above 8192 it steps coarser than `default`
    prof = get_profile("interpreter")
    long1d = _problem("float16", (1, 64, 10007), (64, 64, 3), True, "1", "1", "1")
    assert long1d.dims[1] == 10007
    assert bucket_of(prof, SPEC.key, long1d.dims)[1] == prof.ladder("W").bucket(10007)
    assert prof.ladder("W").bucket(10007) != prof.ladder("default").bucket(10007)


@pytest.mark.parametrize("row,why", [
    (_row("float32", (1, 4, 8, 8), (4, 4, 3, 3), transposed="True"), "transposed"),
    (_row("float32", (1, 4, 4, 8, 8), (4, 4, 3, 3, 3), stride="1x1x1", padding="0x0x0",
          dilation="1x1x1"), "rank 5"),
    (_row("float32", (4, 8), (4, 4, 3)), "rank 2"),
    (_row("float32", (1, 4, 8, 8), (4, 4, 3)), "does not match"),
    (_row("float32", (1, 4, 8, 8), (6, 3, 3, 3)), "groups"),
    (_row("float32", (1, 4, 8, 8), (6, 2, 3, 3), groups=3), "groups"),
    (_row("float32", (1, 6, 8, 8), (4, 2, 3, 3), groups=3), "groups"),
    (make_row("aten.convolution", ["float32"] * 3, [(1, 4, 8, 8), (6, 4, 3, 3), (5,)], {}), "bias"),
    (make_row("aten.convolution", ["float32"] * 3, [(1, 4, 8, 8), (6, 4, 3, 3), (6,)],
              {"bias": "None"}), "bias=None"),
    (make_row("aten.convolution", ["float32"], [(1, 4, 8, 8)], {}), "tensors"),
    (make_row("aten.convolution", ["float16", "float32"], [(1, 4, 8, 8), (6, 4, 3, 3)], {}), "mixed"),
    (_row("float64", (1, 4, 8, 8), (6, 4, 3, 3)), "float64"),
    (_row("int64", (1, 4, 8, 8), (6, 4, 3, 3)), "int64"),
    (_row("float32", (1, 4, 8, 8), (6, 4, 3, 3), stride="0x1"), "stride >= 1"),
    (_row("float32", (1, 4, 8, 8), (6, 4, 3, 3), padding="-1x0"), "padding >= 0"),
    (_row("float32", (1, 4, 8, 8), (6, 4, 3, 3), dilation="1x1x1"), "3 values"),
    (_row("float32", (1, 4, 8, 8), (6, 4, 3, 3), stride="axb"), "bad params"),
    (_row("float32", (1, 4, 8, 8), (6, 4, 3, 3), groups="two"), "bad params"),
    (_row("float32", (1, 4, 8, 8), (6, 4, 3, 3), transposed="maybe"), "bad params"),
    (_row("float32", (1, 4, 8, 8), (6, 4, 9, 3)), "empty output"),
    (_row("float32", (1, 4, 8, 8), (6, 4, 3, 3), dilation="4x1"), "empty output"),
    (_row("float32", (0, 4, 8, 8), (6, 4, 3, 3)), "empty"),
    (_row("float32", (1, 4, 8, 8), (0, 4, 3, 3)), "empty"),
    (_row("float16", (64, 256, 512, 512), (256, 256, 3, 3), padding="1x1"), "2^31"),
])
def test_not_servable_rows(row, why):
    p = SPEC.problem_from_row(row)
    assert isinstance(p, NotServable), p
    assert why in p.reason, p.reason


def test_single_value_params_expand_and_missing_params_default():
    p = _problem("float16", (1, 4, 9, 9), (6, 4, 3, 3), True, "2", "1", "1")
    assert dict(p.flags)["stride"] == "2x2" and p.dims == (5, 5, 4, 6, 1)
    bare = SPEC.problem_from_row(make_row("aten.convolution", ["float16"] * 2, [(1, 4, 9, 9), (6, 4, 3, 3)],
                                          {"bias": "None"}))
    assert isinstance(bare, Problem) and bare.dims == (7, 7, 4, 6, 1)
    # output_padding is ignored by torch when not transposed
    assert isinstance(SPEC.problem_from_row(_row("float16", (1, 4, 9, 9), (6, 4, 3, 3),
                                                 output_padding="1x1")), Problem)


# ----------------------------------------------------------------------------- config space

def test_config_space_and_static_prune(interp):
    hopper = get_profile("hopper")
    configs = SPEC.configs()
    assert 20 <= len(cv.GEMM_CONFIGS) <= 56 and 12 <= len(cv.POINTWISE_CONFIGS) <= 28
    assert configs == cv.GEMM_CONFIGS + cv.POINTWISE_CONFIGS and len(set(configs)) == len(configs)
    for c in configs:
        for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
            assert c[k] >= 16 and c[k] & (c[k] - 1) == 0  # tl.dot needs >= 16, powers of two
    gemm = _problem("float32", (2, 64, 20, 20), (64, 64, 3, 3), False, padding="1x1")
    big = next(c for c in configs if (c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"], c.num_stages) == (128, 256, 64, 4))
    assert SPEC.smem_bytes(big, gemm) == 4 * (128 + 256) * 64 * 4
    assert SPEC.static_refusal(interp, big, gemm)[0] == "smem_over_budget"
    assert SPEC.static_refusal(hopper, big, gemm)[0] == "smem_over_budget"  # 393 KB in fp32
    assert SPEC.default_config(interp, gemm) in configs
    # Depthwise seats: configs that differ only in BLOCK_K / GROUP_M are one candidate.
    dw = _problem("float16", (2, 8, 9, 9), (8, 1, 3, 3), False, padding="1x1", groups=8)
    assert SPEC.smem_bytes(big, dw) == 0
    for prof in (interp, hopper):
        keep, refused = static_prune(SPEC, prof, dw)
        ident = lambda c: (c["BLOCK_M"], c["BLOCK_N"], *(getattr(c, o) for o in prof.launch_options))  # noqa: E731
        assert len({ident(c) for c in keep}) == len(keep)  # no two kept compile the same
        assert {ident(c) for c in keep} == {ident(c) for c in cv.GEMM_CONFIGS if "SPLIT_K" not in c.kwargs}  # each once
        assert any(r.reason == "equivalent" for r in refused)
        d = SPEC.default_config(prof, dw)
        assert d in keep and d["BLOCK_M"] == 128 and d["BLOCK_N"] == 32
        # the launch path resolves a default from flags and dims alone (no extra)
        bare = Problem(SPEC.name, dw.dtypes, dw.flags, dw.dims)
        assert SPEC.default_config(prof, bare) == d


def test_source_hash_covers_both_kernels():
    parts = SPEC.source_parts()
    assert cv._conv_gemm_kernel in parts and cv._conv_depthwise_kernel in parts
    assert cv.launch_conv_gemm in parts and cv.launch_conv_depthwise in parts


# ----------------------------------------------------------------------------- planted faults

class _NarrowStore(cv.ConvSpec):
    """Writes all but the last output column: the screen must see the poison."""

    def launch(self, config, problem, inputs, outputs):
        super().launch(config, problem, inputs, {"out": outputs["out"][..., :-1]})


class _WrongDilation(cv.ConvSpec):
    """Launches with dilation 1 where the problem says 2."""

    def launch(self, config, problem, inputs, outputs):
        g = self._geometry(problem)
        cv.launch_conv_gemm(inputs["input"], inputs["weight"], inputs.get("bias"), outputs["out"],
                            g["stride"], g["padding"], (1, 1), g["groups"], config)


class _NoBias(cv.ConvSpec):
    """Drops the bias of a depthwise launch."""

    def launch(self, config, problem, inputs, outputs):
        super().launch(config, problem, {k: v for k, v in inputs.items() if k != "bias"}, outputs)


def test_planted_faults_are_caught(interp):
    p = _problem("float32", (1, 3, 10, 11), (4, 3, 3, 3), True, padding="1x1")
    c = SPEC.default_config(interp, p)
    assert _screen(SPEC, p, c, interp).ok
    r = _screen(_NarrowStore(), p, c, interp)
    assert r.reason == "unwritten_output", r
    pd = _problem("float16", (1, 3, 12, 11), (4, 3, 3, 3), False, padding="2x2", dilation="2x2")
    r = _screen(_WrongDilation(), pd, SPEC.default_config(interp, pd), interp)
    assert r.reason == "wrong_answer", r
    pw = _problem("float16", (1, 6, 7, 9), (6, 1, 3, 3), True, padding="1x1", groups=6)
    assert _screen(SPEC, pw, SPEC.default_config(interp, pw), interp).ok
    r = _screen(_NoBias(), pw, SPEC.default_config(interp, pw), interp)
    assert r.reason == "wrong_answer", r


def test_make_inputs_are_random_and_seeded():
    p = _problem("float16", (2, 3, 5, 6), (4, 3, 3, 3), True)
    a = SPEC.make_inputs(p, np.random.default_rng(1))
    b = SPEC.make_inputs(p, np.random.default_rng(1))
    for k in a:
        assert np.array_equal(a[k][0], b[k][0]) and a[k][1] == "float16"
        assert np.unique(a[k][0]).size > a[k][0].size // 2  # never constant


def test_defaults_follow_channels_per_group(interp):
    hopper = get_profile("hopper")
    for x, w, groups, want in [
        ((8, 256, 28, 28), (256, 8, 3, 3), 32, (128, 16, 32)),  # 8 out channels per group
        ((8, 64, 56, 56), (64, 64, 3, 3), 1, (128, 64, 64)),
        ((2, 3, 64, 64), (32, 3, 3, 3), 1, (128, 32, 16)),  # a stem: 3 input channels
        ((2, 320, 64, 64), (320, 320, 3, 3), 1, (128, 128, 32)),
    ]:
        p = _problem("float16", x, w, False, padding="1x1", groups=groups)
        d = SPEC.default_config(hopper, p)
        assert d in SPEC.configs() and (d["BLOCK_M"], d["BLOCK_N"], d["BLOCK_K"]) == want
        assert SPEC.static_refusal(hopper, d, p) is None
        # a smaller device falls back to a default that fits it
        d32 = SPEC.default_config(interp, _problem("float32", x, w, False, padding="1x1", groups=groups))
        assert SPEC.smem_bytes(d32, p) * 2 <= interp.memory.max_shared_memory_per_block


def test_stride_span_is_the_largest_offset():
    x = torch.randn(2, 3, 4, 5)
    assert cv._span(x) == x.numel() - 1
    assert cv._span(x[:, :, ::2, 1:]) == 1 * 60 + 2 * 20 + 1 * 10 + 3 * 1
    assert cv._span(x.contiguous(memory_format=torch.channels_last)) == x.numel() - 1
    assert cv._span(torch.randn(3, 1).expand(3, 7)) == 2


# ----------------------------------------------------------------------------- pointwise (1x1)

@pytest.mark.parametrize("row,kind", [
    (_row("float16", (3, 7, 5, 6), (9, 7, 1, 1)), "pointwise"),
    (_row("float16", (1, 7, 5, 6), (9, 7, 1, 1), False, stride="2x2"), "pointwise"),  # a downsample
    (_row("float16", (1, 7, 5, 6), (9, 7, 1, 1), False, stride="2x1", dilation="3x2"), "pointwise"),
    (_row("float32", (2, 6, 11), (4, 6, 1), True, "1", "0", "1"), "pointwise"),  # 1-D, kernel size 1
    (_row("float16", (1, 7, 5, 6), (9, 7, 1, 1), padding="1x1"), "gemm"),  # padded: the border is bias only
    (_row("float16", (1, 7, 5, 6), (9, 7, 1, 1), padding="0x1"), "gemm"),
    (_row("float16", (1, 7, 5, 6), (9, 7, 3, 3)), "gemm"),
    (_row("float16", (1, 7, 5, 6), (9, 7, 1, 3)), "gemm"),
    (_row("float32", (2, 6, 11), (4, 6, 3), True, "1", "0", "1"), "gemm"),
    (_row("float16", (1, 8, 5, 6), (6, 4, 1, 1), groups=2), "gemm"),  # grouped
    (_row("float16", (1, 8, 5, 6), (8, 1, 1, 1), groups=8), "depthwise"),
    (_row("float16", (1, 1, 5, 6), (8, 1, 1, 1)), "depthwise"),  # C_in = 1
])
def test_pointwise_seat_only_for_unpadded_ungrouped_1x1(interp, row, kind):
    p = SPEC.problem_from_row(row)
    assert dict(p.flags)["kind"] == kind
    keep, refused = static_prune(SPEC, interp, p)
    # the seat's kind picks the kernel: pointwise seats launch only PW=1 configs, others never
    assert keep and all(cv._is_pointwise_config(c) == (kind == "pointwise") for c in keep)
    other_kernel = {r.config for r in refused if r.reason == "not_applicable" and "kernel at a" in r.detail}
    assert other_kernel == {c for c in SPEC.configs() if cv._is_pointwise_config(c) != (kind == "pointwise")}
    for prof in (interp, get_profile("hopper")):
        d = SPEC.default_config(prof, p)
        assert d in SPEC.configs() and cv._is_pointwise_config(d) == (kind == "pointwise")
        assert SPEC.static_refusal(prof, d, p) is None


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("x,w,stride,bias", [
    ((1, 37, 9, 11), (19, 37, 1, 1), "1x1", True),    # C_in, C_out, H*W all off the tiles
    ((3, 70, 5, 13), (33, 70, 1, 1), "1x1", False),   # C_in over two BLOCK_K of 32
    ((3, 20, 13, 10), (70, 20, 1, 1), "2x2", True),   # a strided downsample (odd H)
    ((2, 12, 7, 9), (5, 12, 1, 1), "1x3", False),     # anisotropic stride
    ((3, 21, 67), (10, 21, 1), "1", True),            # 1-D, kernel size 1
])
@pytest.mark.slow
def test_pointwise_configs_match_oracle(interp, dtype, x, w, stride, bias):
    """PW tiles of every shape class (narrow, wide, BLOCK_K over C_in), each against the
    fp64 oracle; the interpreter runs them whatever a device's shared memory admits."""
    p = _problem(dtype, x, w, bias, stride, "0" if len(x) == 3 else "0x0", "1" if len(x) == 3 else "1x1")
    assert dict(p.flags)["kind"] == "pointwise"
    picked = [next(c for c in cv.POINTWISE_CONFIGS if (c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"]) == t)
              for t in ((32, 64, 64), (64, 32, 64), (64, 64, 32), (128, 64, 32), (64, 128, 64))]
    for c in picked:
        r = _screen(SPEC, p, c, interp)
        assert r.ok and r.err <= r.rtol, (str(c), r.reason, r.detail)


def test_pointwise_public_ops_any_layout():
    """channels-last and sliced inputs (their own strides), batch 1 and 3, bias or not,
    conv1d with kernel size 1, unbatched; the output is NCHW contiguous."""
    g = torch.Generator().manual_seed(5)
    rn = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    for dt, tol in ((torch.float16, 2e-2), (torch.float32, 1e-5)):
        for nb in (1, 3):
            x, w, b = rn(nb, 35, 9, 10).to(dt), (rn(18, 35, 1, 1) / 6).to(dt), rn(18).to(dt)
            xd, wd, bd = (t.double().numpy() for t in (x, w, b))
            for xin in (x, x.contiguous(memory_format=torch.channels_last)):
                for bias, bref in ((b, bd), (None, None)):
                    for stride in (1, 2):
                        y = cv.conv2d(xin, w, bias, stride=stride)
                        assert y.is_contiguous() and y.dtype == dt
                        assert _rel(y, oracle.conv2d(xd, wd, bref, stride)) <= tol
            xs = x[:, :, 1:, ::2]  # rows not one strided axis: the kernel splits pixels
            assert _rel(cv.conv2d(xs, w, b), oracle.conv2d(xs.double().numpy(), wd, bd)) <= tol
            assert _rel(cv.conv2d(x, w, b, dilation=3), oracle.conv2d(xd, wd, bd, 1, 0, 3)) <= tol
        x1, w1, b1 = rn(3, 21, 40).to(dt), (rn(7, 21, 1) / 4).to(dt), rn(7).to(dt)
        ref1 = oracle.conv1d(*(t.double().numpy() for t in (x1, w1, b1)))
        assert _rel(cv.conv1d(x1, w1, b1), ref1) <= tol
        assert _rel(cv.conv1d(x1.transpose(1, 2).contiguous().transpose(1, 2), w1, b1), ref1) <= tol
        assert _rel(cv.conv1d(x1[2], w1, b1), ref1[2]) <= tol


def test_public_ops_and_serve_launch_the_pointwise_kernel(monkeypatch):
    import nbx_tune
    from torch import nn

    calls = []
    real = cv.launch_conv_pointwise
    monkeypatch.setattr(cv.ops, "launch_conv_pointwise",  # where the public ops read it
                        lambda *a, **k: calls.append((tuple(a[4]), cv.pixels_flat(a[0]))) or real(*a, **k))
    x = torch.randn(2, 6, 5, 7)
    w = torch.randn(4, 6, 1, 1)
    cv.conv2d(x, w, stride=2)
    cv.conv1d(x[:, :, 0], w[..., 0])
    # a stride-1 view whose pixels are not one axis is copied: the seat runs the flat path
    cv.conv2d(x[:, :, :, ::2], w)
    assert calls == [((2, 2), True), ((1, 1), True), ((1, 1), True)] and not cv.pixels_flat(x[:, :, :, ::2])
    cv.conv2d(x, w, padding=1)
    cv.conv2d(x, torch.randn(4, 6, 3, 3))
    cv.conv2d(x, torch.randn(4, 3, 1, 1), groups=2)
    assert len(calls) == 3  # padded, 3x3 and grouped ones take the implicit GEMM
    conv = nn.Conv2d(6, 9, 1).eval()
    with torch.no_grad():
        ref = conv(x)
        with nbx_tune.serve():
            y = conv(x)
    assert len(calls) == 4
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)


class _PointwiseNoStride(cv.ConvSpec):
    """Launches a strided pointwise seat with stride 1."""

    def launch(self, config, problem, inputs, outputs):
        cv.launch_conv_pointwise(inputs["input"], inputs["weight"], inputs.get("bias"), outputs["out"], (1, 1),
                                 config)


def test_pointwise_planted_faults_are_caught(interp):
    p = _problem("float32", (2, 9, 7, 8), (5, 9, 1, 1), True, stride="2x2")
    c = SPEC.default_config(interp, p)
    assert cv._is_pointwise_config(c) and _screen(SPEC, p, c, interp).ok
    assert _screen(_PointwiseNoStride(), p, c, interp).reason == "wrong_answer"
    p1 = _problem("float16", (3, 9, 7, 8), (5, 9, 1, 1), False)
    assert _screen(_NarrowStore(), p1, SPEC.default_config(interp, p1), interp).reason == "unwritten_output"
    assert _screen(_NoBias(), p, c, interp).reason == "wrong_answer"


def test_pointwise_default_narrows_where_wide_tiles_are_few():
    hopper = get_profile("hopper")
    late = _problem("bfloat16", (8, 2048, 7, 7), (512, 2048, 1, 1), False)  # 32 programs of 128 x 64
    early = _problem("bfloat16", (8, 64, 56, 56), (256, 64, 1, 1), False)
    assert [(d["BLOCK_M"], d["BLOCK_N"]) for d in (SPEC.default_config(hopper, p) for p in (late, early))] == \
        [(64, 64), (128, 64)]


def test_pointwise_bench_smoke(tmp_path, monkeypatch, capsys):
    """bench/conv_pointwise.py end to end on tiny shapes: every PW config checked, a table."""
    import sys
    from pathlib import Path

    from nbx_tune.bench import conv_pointwise

    monkeypatch.setenv("OUT", str(tmp_path))
    assert conv_pointwise.main(["--smoke"]) == 0
    out = capsys.readouterr().out
    assert "2x24x7x7 -> 40" in out and "WRONG" not in out
    assert (tmp_path / "conv_pointwise.json").exists()
    # the trace's 1x1 unpadded rows are what the GPU run times: ResNet-50 has 15 distinct ones
    rows = conv_pointwise.pointwise_rows(False, "bfloat16")
    kinds = [dict(SPEC.problem_from_row(r).flags)["kind"] for r, _ in rows]
    assert kinds.count("pointwise") == 15 and "gemm" in kinds


@pytest.mark.parametrize("x,w,stride", [
    ((3, 20, 13, 10), (70, 20, 1, 1), "2x2"),
    ((2, 70, 40, 9), (19, 70, 1, 1), "1x1"),  # R = 80, CI = 70: buckets 16 wide
    ((3, 21, 67), (10, 21, 1), "1"),
])
def test_pointwise_seats_are_screened_at_tile_edges(interp, x, w, stride):
    from nbx_tune.tuner.certify.screen_shapes import edge_problems

    p = _problem("float16", x, w, True, stride, "0" if len(x) == 3 else "0x0", "1" if len(x) == 3 else "1x1")
    edges = edge_problems(SPEC, interp, p)
    bucket = bucket_of(interp, SPEC.key, p.dims)
    assert edges and all(e.dims != p.dims and e.flags == p.flags for e in edges)
    assert all(bucket_of(interp, SPEC.key, e.dims) == bucket for e in edges)
    for e in edges:
        g = SPEC._geometry(e)
        # the recorded geometry agrees with the dims: the output the oracle makes is the key's
        out = SPEC.output_specs(e)["out"][0]
        assert out[0] == g["nb"] and out[-1] == e.dims[1] and g["nb"] * (out[2] if len(out) == 4 else 1) == e.dims[0]
        r = _screen(SPEC, e, SPEC.default_config(interp, e), interp)
        assert r.ok, (e.dims, r.reason, r.detail)
    # other kinds keep the shapes seen
    assert SPEC.resized(_problem("float16", (2, 7, 5, 6), (9, 7, 3, 3), padding="1x1"), p.dims) is None


def test_pointwise_aligned_flag_follows_pixel_rows(monkeypatch):
    """`aligned`: the elements (up to 16 bytes) every NCHW pixel row starts on, which the
    kernel is told (ALIGN) because Triton sees only multiples of 16: a seat of its own."""
    for dt, x, w, stride, want in [
        ("bfloat16", (8, 256, 14, 14), (1024, 256, 1, 1), "1x1", "4"),   # P = 196
        ("bfloat16", (8, 64, 56, 56), (256, 64, 1, 1), "1x1", "8"),      # P = 3136: a 16-byte vector
        ("float32", (8, 64, 56, 56), (256, 64, 1, 1), "1x1", "4"),
        ("bfloat16", (8, 512, 7, 7), (2048, 512, 1, 1), "1x1", "1"),     # P = 49
        ("bfloat16", (8, 512, 28, 28), (1024, 512, 1, 1), "2x2", "4"),   # strided: staged dense, P = 196
        ("bfloat16", (8, 256, 56, 56), (512, 256, 1, 1), "2x2", "8"),    # P = 784
    ]:
        assert dict(_problem(dt, x, w, False, stride).flags)["aligned"] == want
    assert "aligned" not in dict(_problem("float16", (2, 6, 5, 6), (4, 6, 3, 3), False).flags)
    # the public op computes it from the real strides: channels-last rows are not pixel rows
    seen = []
    real = cv.ops.config_for
    monkeypatch.setattr(cv.ops, "config_for", lambda spec, d, f, dims: seen.append(dict(f)["aligned"]) or real(spec, d, f, dims))
    x, w = torch.randn(2, 6, 6, 6), torch.randn(4, 6, 1, 1)
    ref = oracle.conv2d(x.double().numpy(), w.double().numpy())
    for xin in (x, x.contiguous(memory_format=torch.channels_last)):
        assert _rel(cv.conv2d(xin, w), ref) <= 1e-5
    assert seen == ["4", "1"]


def _assert_screens(interp, config, problem, dtype):
    """config passes the screen at problem on the interpreter: against fp64, twice bit for bit."""
    case = screening.make_case(SPEC, problem, "cpu", 5, True)
    r = screening.screen(SPEC, config, case, interp.rtol(dtype), "cpu", repeat=True)
    assert r.ok and r.err <= r.rtol, (str(config), r.reason, r.detail)


def _screen_unrefused(interp, configs, problem, dtype, screen_over_budget=False):
    """Screens each config the static prune does not refuse at problem (with
    screen_over_budget, those refused for shared memory alone too: the interpreter runs any
    tile); returns how many were screened and the other refusals."""
    ran, refused = 0, []
    for c in configs:
        why = SPEC.static_refusal(interp, c, problem)
        if why is not None and not (screen_over_budget and why[0] == "smem_over_budget"):
            refused.append(why)
            continue
        _assert_screens(interp, c, problem, dtype)
        ran += 1
    return ran, refused


SPLITS = [c for c in cv.POINTWISE_CONFIGS if c.kwargs.get("SPLIT_K", 1) > 1 and not c.kwargs.get("PAD")]


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("x,w,stride,bias", [
    ((2, 1030, 5, 3), (19, 1030, 1, 1), "1x1", True),   # C_in past every split's whole blocks
    ((1, 600, 7, 9), (33, 600, 1, 1), "2x2", False),    # 32x64x128 over 4 splits: the last is empty
    ((2, 520, 11), (7, 520, 1), "1", True),             # 1-D
])
def test_pointwise_split_k_matches_oracle_bit_for_bit_twice(interp, dtype, x, w, stride, bias):
    p = _problem(dtype, x, w, bias, stride, "0" if len(x) == 3 else "0x0", "1" if len(x) == 3 else "1x1")
    assert len(SPLITS) >= 2
    for c in SPLITS:
        if c["BLOCK_K"] * c["SPLIT_K"] * 2 > x[1]:
            continue
        why = SPEC.static_refusal(interp, c, p)  # applicable here (the interpreter runs any tile)
        assert why is None or why[0] == "smem_over_budget", why
        _assert_screens(interp, c, p, dtype)


def test_pointwise_split_k_only_where_tiles_are_few_and_k_long():
    hopper = get_profile("hopper")
    late = _problem("bfloat16", (8, 2048, 7, 7), (512, 2048, 1, 1), False)   # 64 tiles of 64 x 64, K = 2048
    early = _problem("bfloat16", (8, 64, 56, 56), (256, 64, 1, 1), False)    # K = 64
    wide = _problem("bfloat16", (8, 1024, 28, 28), (1024, 1024, 1, 1), False)  # 1664 tiles
    for c in SPLITS:
        assert SPEC.static_refusal(hopper, c, late) is None
        assert SPEC.static_refusal(hopper, c, early)[0] == "not_applicable"
        assert "output tiles" in SPEC.static_refusal(hopper, c, wide)[1]


GEMM_SPLITS = [c for c in cv.GEMM_CONFIGS if c.kwargs.get("SPLIT_K", 1) > 1]


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("x,w,stride,padding,groups,bias", [
    ((2, 70, 5, 6), (19, 70, 3, 3), "1x1", "1x1", 1, True),    # taps x channel blocks over the splits
    ((1, 64, 7, 9), (12, 32, 3, 3), "2x2", "1x1", 2, False),   # grouped, strided
    ((2, 140, 11), (7, 140, 3), "1", "1", 1, True),            # 1-D
])
def test_implicit_gemm_split_k_matches_oracle_bit_for_bit_twice(interp, dtype, x, w, stride, padding, groups, bias):
    one = len(x) == 3
    p = _problem(dtype, x, w, bias, stride, padding, "1" if one else "1x1", groups=groups)
    assert dict(p.flags)["kind"] == "gemm" and len(GEMM_SPLITS) >= 2
    ran, refused = _screen_unrefused(interp, GEMM_SPLITS, p, dtype)
    assert all(why[0] in ("smem_over_budget", "not_applicable") for why in refused), refused
    assert ran >= 1


def test_implicit_gemm_split_k_only_where_tiles_are_few_and_the_loop_long():
    hopper = get_profile("hopper")
    late = _problem("bfloat16", (8, 512, 7, 7), (512, 512, 3, 3), False, "1x1", "1x1")     # 56 tiles of 64 x 64
    early = _problem("bfloat16", (8, 64, 56, 56), (128, 64, 3, 3), False, "1x1", "1x1")    # >= 392 tiles
    short = _problem("bfloat16", (8, 3, 7, 7), (64, 3, 1, 2), False, "1x1", "1x1")         # 2 taps x 1 block
    for c in GEMM_SPLITS:
        assert SPEC.static_refusal(hopper, c, late) is None, str(c)
        assert "output tiles" in SPEC.static_refusal(hopper, c, early)[1]
        assert SPEC.static_refusal(hopper, c, short)[0] == "not_applicable"
    dw = _problem("bfloat16", (2, 8, 9, 9), (8, 1, 3, 3), False, "1x1", "1x1", groups=8)
    assert all(SPEC.static_refusal(hopper, c, dw)[0] == "not_applicable" for c in GEMM_SPLITS)


PADS = [c for c in cv.POINTWISE_CONFIGS if c.kwargs.get("PAD")]


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("x,w,stride,bias", [
    ((2, 520, 7, 7), (19, 520, 1, 1), "1x1", True),     # 49 pixels: rows padded to 56 (52 in fp32)
    ((1, 130, 14, 14), (33, 130, 1, 1), "2x2", False),  # staged dense to 7 x 7, then padded
    ((2, 150, 3), (7, 150, 1), "1", True),              # 1-D, 3 pixels
])
@pytest.mark.slow
def test_padded_pixel_rows_match_oracle_bit_for_bit_twice(interp, dtype, x, w, stride, bias):
    p = _problem(dtype, x, w, bias, stride, "0" if len(x) == 3 else "0x0", "1" if len(x) == 3 else "1x1")
    assert dict(p.flags)["aligned"] == "1" and len(PADS) >= 3
    ran, refused = _screen_unrefused(interp, PADS, p, dtype, screen_over_budget=True)
    assert all(why[0] == "not_applicable" and "PAD" not in why[1] for why in refused), refused
    assert ran >= 2


def test_padded_pixel_rows_only_where_rows_are_not_aligned():
    hopper = get_profile("hopper")
    odd = _problem("bfloat16", (8, 2048, 7, 7), (512, 2048, 1, 1), False)
    even = _problem("bfloat16", (8, 1024, 14, 14), (256, 1024, 1, 1), False)
    for c in PADS:
        assert SPEC.static_refusal(hopper, c, odd) is None, str(c)
        assert "PAD" in SPEC.static_refusal(hopper, c, even)[1]
