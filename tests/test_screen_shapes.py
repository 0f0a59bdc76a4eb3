"""Nothing certified that is wrong at a shape it serves: the contenders are screened at
every shape seen in the bucket and at its tile edges, a winner is screened at shapes seen
after it was certified, a config far less precise than the best is refused, and so is one
whose two launches on the same inputs differ. The faulty configs are the fastest here
(the benchmarker says so), so only the screen stands between them and a certificate."""

import pytest

from nbx_tune.testing import planted
from nbx_tune.kernels.runtime.registry import register
from nbx_tune.kernels.spec import Problem, seat_flags
from nbx_tune.profiles import get_profile
from nbx_tune.tuner import commands as api
from nbx_tune.tuner.timing.benchmarkers import Timing
from nbx_tune.tuner.execution.executor import InProcess
from nbx_tune.tuner.timing.strategies import get_strategy
from nbx_tune.tuner.certify.tune import seat_job, tune_seat

PROFILE = get_profile("interpreter")
register(planted.GEMM)
register(planted.GEMM_SEEN)
FAULTY = ("MASK_BUG=1", "ACC16=1", "SPLIT_K=4")


def faulty_first(fn, mode="full"):
    """Times a launch as 1 ms if it is a faulty config's, else 2 ms."""
    before = dict(planted.LAUNCHES)
    fn()
    key = next(k for k, n in planted.LAUNCHES.items() if n != before.get(k, 0))
    ms = 1.0 if any(f in key for f in FAULTY) else 2.0
    return Timing(ms, ms, ms, "fake")


def gemm(M, N, K, dtype="float16", kernel="test_gemm"):
    return Problem(kernel, (dtype,), seat_flags(), (M, N, K))


def tune(spec, problems):
    return tune_seat(spec, PROFILE, spec.name, problems, InProcess(faulty_first),
                     get_strategy("exhaustive"), "cpu")


def by_config(res):
    return {r.config: r for r in res.records}


def test_a_mask_bug_seen_only_inside_the_bucket_is_refused_there():
    shapes = [gemm(16, 1056, 32, kernel="test_gemm_seen"), gemm(16, 1100, 32, kernel="test_gemm_seen"),
              gemm(16, 1152, 32, kernel="test_gemm_seen")]  # 1056 and 1152: whole tiles of 32
    job, _ = seat_job(planted.GEMM_SEEN, PROFILE, "g", shapes, "cpu")
    assert job.screen_problems == (shapes[2], shapes[0]) and job.confirm_problems == (shapes[1],)
    res = tune(planted.GEMM_SEEN, shapes)
    bug = by_config(res)[planted.MASK_BUG]
    assert bug.reason == "wrong_answer" and bug.problem == shapes[1]
    assert bug.failed_screen.err > bug.failed_screen.rtol
    assert res.outcome == "certified" and res.winner.config == planted.GEMM_GOOD[0]
    assert {s.problem for s in res.winner.screens} == set(shapes)  # the winner at every shape seen


def test_tile_edges_of_the_bucket_are_screened_even_if_no_census_saw_them():
    shapes = [gemm(16, 1056, 32), gemm(16, 1152, 32)]  # the bucket N=1025..1152: all whole tiles
    job, _ = seat_job(planted.GEMM, PROFILE, "g", shapes, "cpu")
    assert gemm(16, 1025, 32) in job.confirm_problems  # the bucket's bottom
    spec = planted.GemmSpec((planted.GEMM_GOOD[0], planted.MASK_BUG))
    res = tune(spec, shapes)
    bug = by_config(res)[planted.MASK_BUG]
    assert bug.reason == "wrong_answer" and bug.problem == gemm(16, 1025, 32)
    assert res.winner.config == planted.GEMM_GOOD[0]


@pytest.mark.slow
def test_an_fp16_accumulator_is_imprecise_and_a_racing_split_k_nondeterministic():
    spec = planted.GemmSpec((*planted.GEMM_GOOD, planted.ACC16, planted.SPLIT_K), edges=False)
    p = gemm(16, 24, 8192)
    res = tune(spec, [p])
    recs = by_config(res)
    acc = recs[planted.ACC16]
    assert acc.reason == "imprecise", acc.detail
    judged = acc.failed_screen
    assert judged.problem == p and judged.err > judged.rtol  # rtol: the gate's limit there
    assert judged.err < PROFILE.rtol("float16")  # within the tolerance: only the gate refuses it
    assert "most accurate candidate" in acc.detail
    split = recs[planted.SPLIT_K]
    assert split.reason == "nondeterministic" and "differ bit for bit" in split.detail
    assert res.winner.config in planted.GEMM_GOOD and res.runner_up.config in planted.GEMM_GOOD
    assert res.winner.screens[0].repeat == "bitwise"


def test_a_kernel_that_allows_run_to_run_variation_is_certified_and_says_so():
    spec = planted.GemmSpec((planted.GEMM_GOOD[0], planted.SPLIT_K), edges=False)
    spec.run_to_run_variation = True
    res = tune(spec, [gemm(16, 16, 64)])
    assert res.winner.config == planted.SPLIT_K
    assert res.winner.screens[0].repeat == "varies (allowed)"


HEAD = "# nbx-tune trace v1\nop\tdtypes\tshapes\tparams\tcount\n"


def _trace(tmp_path, name, Ns):
    p = tmp_path / name
    p.write_text(HEAD + "".join(f"test.gemm_seen\tfloat16,float16\t16x32;32x{n}\t\t1\n" for n in Ns))
    return str(p)


@pytest.mark.slow
def test_a_shape_seen_later_has_the_winner_screened_there_and_a_failure_retunes(tmp_path, db_url, monkeypatch):
    import nbx_tune.tuner.timing.benchmarkers as bench

    monkeypatch.setattr(bench, "for_profile", lambda profile: faulty_first)
    first = api.census(_trace(tmp_path, "a.tsv", (1056, 1152)), db_url, isolate=False)
    assert first.seats[0].status == "certified" and first.seats[0].config == planted.MASK_BUG.key()

    later = _trace(tmp_path, "b.tsv", (1120,))  # whole tiles again: the winner passes
    plan = api.census(later, db_url, dry_run=True)
    assert plan.seats[0].status == "unscreened" and "never screened at" in plan.seats[0].why
    rep = api.census(later, db_url, isolate=False)
    assert rep.seats[0].status == "certified" and rep.seats[0].action == "rescreened"
    assert rep.seats[0].config == planted.MASK_BUG.key()
    shown = api.show_seat(str(rep.seats[0].id), db_url)
    assert [h["kind"] for h in shown["history"]] == ["tune", "rescreen"]
    screened = {tuple(s["problem"]["dims"]) for s in shown["history"][-1]["certificate"]["screens"]}
    assert screened == {(16, 1056, 32), (16, 1120, 32), (16, 1152, 32)}

    rep = api.census(_trace(tmp_path, "c.tsv", (1100,)), db_url, isolate=False)  # a partial tile
    # The winner fails there, so the seat is certified again, from its history (issue 61: the
    # census says re-certified, not tuned, for such a seat).
    assert rep.seats[0].status == "certified" and rep.seats[0].action == "re-certified"
    assert rep.seats[0].config == planted.GEMM_GOOD[0].key()
    (bad,) = [r for r in api.refusal_rows(db_url, reason="wrong_answer") if r["config"] == planted.MASK_BUG.key()]
    assert bad["problem"]["dims"] == [16, 1100, 32] and bad["err"] > bad["rtol"] == pytest.approx(2e-2)


def test_a_gemm_seats_edge_shapes_keep_its_alignment_flag():
    from nbx_tune.kernels.matmul import SPEC as MATMUL, alignment

    def flag(M, N, K):  # float32: 4 elements to a 16-byte vector
        return str(alignment((M * K, K, 1), (K * N, N, 1), N, K, 4))

    hopper = get_profile("hopper")
    for M, N, K in ((500, 4000, 1024), (500, 4004, 1000), (500, 4001, 1000)):
        p = Problem("matmul", ("float32",), seat_flags(bias=0, aligned=flag(M, N, K)), (1, M, N, K))
        edges = seat_job(MATMUL, hopper, "m", [p], "cpu")[0].confirm_problems
        assert edges, p.flags
        for e in edges:
            assert e.flags == p.flags and flag(*e.dims[1:]) == dict(p.flags)["aligned"]
    # The bottom of a seat's N bucket leaves a partial tile against 32-wide blocks.
    p = Problem("matmul", ("float16",), seat_flags(bias=0, aligned="16"), (1, 512, 4000, 4096))
    assert any(e.dims[2] % 32 for e in seat_job(MATMUL, hopper, "m", [p], "cpu")[0].confirm_problems)


def test_every_seat_of_every_example_trace_is_screened_on_hopper():
    import glob
    from pathlib import Path

    from nbx_tune.kernels.runtime.registry import all_specs
    from nbx_tune.tuner.census.census import load_plan

    hopper, specs = get_profile("hopper"), all_specs()
    root = Path(__file__).resolve().parents[1] / "examples" / "traces"
    traces = sorted(glob.glob(str(root / "*.tsv")))
    assert any("llama3_8b" in t for t in traces)  # a 128k-vocabulary LM head among them
    for t in traces:
        for sp in load_plan(t, hopper).seats.values():
            job, skipped = seat_job(specs[sp.kernel], hopper, sp.label, list(sp.problems), "cpu")
            assert not skipped, f"{t}: {sp.label} over the byte budget"


def test_refusals_and_show_give_the_shape_error_and_tolerance_as_fields(tmp_path, db_url, monkeypatch):
    import json

    from typer.testing import CliRunner

    import nbx_tune.tuner.timing.benchmarkers as bench
    from nbx_tune.cli.app import app

    monkeypatch.setattr(bench, "for_profile", lambda profile: faulty_first)
    rep = api.census(_trace(tmp_path, "a.tsv", (1056, 1100)), db_url, isolate=False)
    r = CliRunner().invoke(app, ["refusals", "--json", "--reason", "wrong_answer", "--db", db_url])
    assert r.exit_code == 0, r.output
    (bad,) = json.loads(r.stdout)
    assert bad["problem"]["dims"] == [16, 1100, 32] and bad["err"] > bad["rtol"] > 0
    r = CliRunner().invoke(app, ["show", str(rep.seats[0].id), "--json", "--db", db_url])
    shown = json.loads(r.stdout)
    (refused,) = [x for x in shown["refusals"] if x["reason"] == "wrong_answer"]
    assert refused["problem"]["dims"] == [16, 1100, 32] and refused["err"] == bad["err"]
    assert {s.get("repeat") for s in shown["history"][0]["certificate"]["screens"]} == {"bitwise", None}


def test_an_attention_seat_is_screened_at_its_sequence_edges():
    from nbx_tune.kernels.attention import SPEC as ATTENTION

    hopper = get_profile("hopper")
    extra = (("B", 1), ("Hkv", 8), ("Hq", 32), ("lse", "none"), ("scale", 0.125))
    p = Problem("attention", ("bfloat16",), seat_flags(causal=1), (32, 1000, 1000, 128, 128), extra)
    edges = seat_job(ATTENTION, hopper, "a", [p], "cpu")[0].confirm_problems
    assert [e.dims for e in edges] == [(32, 993, 993, 128, 128), (32, 1024, 1024, 128, 128)]
    assert all(e.extra == p.extra and e.flags == p.flags for e in edges)


def test_an_elementwise_seat_is_screened_at_its_bucket_edges():
    from nbx_tune.kernels.elementwise import UNARY_SPEC as UNARY

    hopper = get_profile("hopper")
    p = Problem("elementwise_unary", ("bfloat16",), seat_flags(fn="silu"), (4 * 1024 * 1024,),
                (("shape", (1024, 4096)),))
    edges = seat_job(UNARY, hopper, "u", [p], "cpu")[0].confirm_problems
    assert [(e.dims, e.get("shape")) for e in edges] == [((2097153,), (2097153,)), ((4194304,), (4194304,))]


@pytest.mark.parametrize("kernel", ["softmax", "layer_norm", "rms_norm"])
def test_a_row_seat_is_screened_at_its_row_length_edges_and_they_match_the_oracle(kernel):
    """Row kernels (softmax, layer and RMS norm) mask a row against its length: their edges
    are rows of the bucket's bottom and top length, as many rows, and the kernel's default
    config is right there."""
    from nbx_tune.kernels.runtime.registry import get_spec
    from nbx_tune.kernels.rows import make_row
    from nbx_tune.tuner.certify.screen import make_case, output_rtols, screen

    spec = get_spec(kernel)
    profile = get_profile("interpreter")
    op, params = {"softmax": ("aten._softmax", {"dim": "-1", "half_to_float": "False"}),
                  "layer_norm": ("aten.native_layer_norm", {"normalized_shape": "150", "eps": "1e-05"}),
                  "rms_norm": ("aten._fused_rms_norm", {"normalized_shape": "150", "eps": "1e-05"})}[kernel]
    n_inputs = {"softmax": 1, "layer_norm": 3, "rms_norm": 2}[kernel]
    shapes = [(3, 150)] + [(150,)] * (n_inputs - 1)
    p = spec.problem_from_row(make_row(op, ["float32"] * n_inputs, shapes, params))
    assert isinstance(p, Problem), p
    edges = seat_job(spec, profile, kernel, [p], "cpu")[0].confirm_problems
    lengths = sorted(e.dims[0] for e in edges)
    assert lengths and lengths[0] < 150 < lengths[-1]  # the bucket's bottom and top around 150
    for e in edges:
        assert e.flags == p.flags and e.get("shape") == (3, e.dims[0])
        case = make_case(spec, e, "cpu", 1, with_oracle=True)
        res = screen(spec, spec.default_config(profile, e), case, output_rtols(spec, e, profile), "cpu")
        assert res.ok, (e.dims, res.detail)


@pytest.mark.parametrize("shapes, layout", [([(7, 50), (7, 50)], "same"), ([(7, 50), ()], "scalar"),
                                            ([(7, 50), (50,)], "bcast")])
def test_a_binary_elementwise_seat_is_screened_at_its_edges_unless_it_broadcasts(shapes, layout):
    from nbx_tune.kernels.runtime.registry import get_spec
    from nbx_tune.kernels.rows import make_row
    from nbx_tune.tuner.certify.screen import make_case, output_rtols, screen

    spec = get_spec("elementwise_binary")
    profile = get_profile("interpreter")
    dts = ["float32", "float32" if shapes[1] else "float64"]
    p = spec.problem_from_row(make_row("aten.add.Tensor", dts, shapes, {}))
    assert isinstance(p, Problem) and dict(p.flags)["layout"] == layout, p
    edges = seat_job(spec, profile, "b", [p], "cpu")[0].confirm_problems
    if layout == "bcast":
        assert edges == ()
        return
    assert sorted(e.dims[0] for e in edges)[-1] > 350
    for e in edges:
        assert e.flags == p.flags and e.get("out_shape") == (e.dims[0],)
        case = make_case(spec, e, "cpu", 1, with_oracle=True)
        res = screen(spec, spec.default_config(profile, e), case, output_rtols(spec, e, profile), "cpu")
        assert res.ok, (e.dims, res.detail)
