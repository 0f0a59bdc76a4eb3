"""serve() against torch on PyTorch's OpInfo samples (testing/opinfo.py): the CPU
interpreter at float32, int64 and bool. By default the first 2 samples of each OpInfo and
dtype (about 15 s on an idle core); NBX_TUNE_OPINFO_FULL=1 runs every sample."""

import os

import pytest
import torch

pytest.importorskip("expecttest")  # torch's OpInfo database imports it (the `test` extra)

from nbx_tune.testing import opinfo  # noqa: E402

FULL = os.environ.get("NBX_TUNE_OPINFO_FULL") == "1"
DTYPES = (torch.float32, torch.int64, torch.bool)


def test_every_routed_op_with_an_opinfo_matches_torch_under_serve():
    report = opinfo.run_opinfo("cpu", DTYPES, max_samples=None if FULL else 2)
    print(report.line(), f"(served {report.served}, handed to torch {report.fell_through})")
    assert [m for m in report.mismatches] == []
    # the harness reached the families serve() routes (a broken match would pass vacuously)
    assert len(report.ops) >= 60 and report.served >= 200


def test_special_values_overlap_and_indices_match_torch_but_the_known_differences():
    report = opinfo.run_extra("cpu", (torch.float32,))
    found = {m.op: m.why for m in report.mismatches}
    assert set(found) == set(opinfo.KNOWN), found  # a fixed one: remove it from KNOWN
    assert report.samples == len(opinfo.extra_cases("cpu", torch.float32))


def test_the_harness_tells_a_wrong_answer_from_torchs():
    # the comparison is what the test stands on: a sign of zero, an infinity, a dtype
    assert opinfo.compare(torch.tensor([0.0]), torch.tensor([-0.0]))
    assert opinfo.compare(torch.tensor([float("inf")]), torch.tensor([float("-inf")]))
    assert opinfo.compare(torch.tensor([3]), torch.tensor([3.0]))
    assert opinfo.compare(torch.tensor([1.0 + 1e-4]), torch.tensor([1.0]))
    assert opinfo.compare(torch.tensor([float("nan")]), torch.tensor([float("nan")])) is None


def test_a_value_off_torch_counts_only_when_no_farther_from_fp64():
    # The arbiter of tolerance-only differences: serve()'s value is accepted where it is no
    # farther from the op computed in float64 than torch's own, and refused where it is.
    x = torch.tensor([1.1, 2.3, -3.7], dtype=torch.float16)
    fn = lambda t: t * 3.3  # noqa: E731
    ref = fn(x)
    assert opinfo._nearer_exact(fn, (x,), {}, ref.clone(), ref)
    exact = fn(x.double())
    nearer = exact.to(torch.float16)  # correctly rounded: never farther than torch's
    assert opinfo._nearer_exact(fn, (x,), {}, nearer, ref)
    worse = ref.clone()
    worse[1] += 0.05
    assert not opinfo._nearer_exact(fn, (x,), {}, worse, ref)
