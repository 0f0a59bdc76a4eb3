"""The GPU timer's lead (tuner/timing.lead_ms): how long the GPU waits so that a slow host has
queued every timed launch before the GPU reaches it. The timer itself needs a GPU
(lab/ranking_stability/ranking_repeat.py runs it on one); its arithmetic is checked here."""

import pytest

from nbx_tune.tuner.timing.benchmarkers import LEAD_CAP, lead_ms


def test_a_host_faster_than_the_gpu_needs_only_the_first_launch_queued():
    # 30 us of host work a launch against 90 us of GPU work: the host gains on every launch.
    for n in (1, 10, 1000):
        assert lead_ms(n, host_ms=0.03, gpu_ms=0.09, rep_ms=25) == pytest.approx(1.5 * 2 * 0.03)


def test_a_host_slower_than_the_gpu_is_given_its_whole_deficit():
    # The H200's 2048^3 GEMM: about 0.085 ms of flush and kernel behind 0.11 ms of host work.
    n = 294
    lead = lead_ms(n, host_ms=0.11, gpu_ms=0.085, rep_ms=25)
    deficit = n * (0.11 - 0.085)
    assert lead >= deficit + 0.11  # every launch queued before the GPU gets to it
    assert lead == pytest.approx(1.5 * (deficit + 2 * 0.11))
    # Twice the launches, about twice the lead.
    assert lead_ms(2 * n, 0.11, 0.085, 50) > 1.9 * lead - 1.5 * 2 * 0.11


def test_the_cap_leaves_a_round_bounded():
    # A host ten times slower than the GPU: the lead would be 13x the round; it is capped.
    rep_ms = 25.0
    n = int(rep_ms / 0.09)
    assert lead_ms(n, 0.9, 0.09, rep_ms) == LEAD_CAP * rep_ms + 10
    assert lead_ms(n, 0.9, 0.09, rep_ms, margin=0.01) < LEAD_CAP * rep_ms + 10  # under it, uncapped
