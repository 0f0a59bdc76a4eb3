"""The certified tables shipped in the package hold for this code: an edit to a kernel,
its config space or a profile makes their entries stale (never served), and this test says
so, so that the tables are re-certified on the GPU or the entries removed."""

from pathlib import Path

import pytest

from nbx_tune.kernels.runtime import table_format, validity
from nbx_tune.kernels.runtime.registry import all_specs
from nbx_tune.profiles import get_profile

TABLES = sorted((Path(__file__).resolve().parents[1] / "kernels" / "tables").glob("*.json"))


@pytest.mark.parametrize("path", TABLES, ids=lambda p: p.name)
def test_shipped_table_entries_are_current(path):
    doc = table_format.read(path)
    profile = get_profile(doc["profile"])
    assert doc["profile_hash"] == profile.hash and path.stem == profile.name
    specs = all_specs()
    for e in doc["entries"]:
        spec, prov = specs[e["kernel"]], e["provenance"]
        label = f"{e['kernel']}|{e['dtypes']}|{e['flags']}|{e['bucket']}"
        assert prov["kernel_source_hash"] == spec.source_hash, f"{label}: kernel edited since certified"
        assert prov["config_space_hash"] == spec.config_space_hash, f"{label}: config space changed"
        assert prov["profile_hash"] == validity.profile_hash(profile, spec)
        assert any(prov["device_target"].startswith(p) for p in profile.compute_capability_matches)
        assert all(s["err"] <= s["rtol"] for s in e["screens"]) and e["screens"]


# The shipped hopper table certifies every seat of every real-scale example trace (the
# bf16 ones, fused or not; the small ones are for the CPU's interpreter profile).
def fully_shipped(trace: Path) -> bool:
    return trace.stem.endswith(("_bf16", "_bf16_fused"))


def test_the_hopper_table_serves_whole_example_traces_and_no_dead_entries():
    # A change to a kernel's seat key (flags, ladders, trace mapping) leaves entries that
    # no launch can find: they would be shipped dead weight, and the seats they were meant
    # for would miss. Both directions are checked.
    from nbx_tune.tuner.census.census import load_plan

    profile = get_profile("hopper")
    traces = Path(__file__).resolve().parents[1] / "examples" / "traces"
    doc = table_format.read(TABLES[0])
    shipped = {(e["kernel"], e["dtypes"], e["flags"], e["bucket"]) for e in doc["entries"]}
    seen = set()
    for trace in traces.glob("*.tsv"):
        seats = set(load_plan(str(trace), profile).seats)
        seen |= seats
        if fully_shipped(trace):
            assert seats - shipped == set(), f"seats of {trace.name} not in the table"
    assert shipped - seen == set(), "entries for seats no example trace has"


def test_there_is_a_hopper_table():
    assert [p.name for p in TABLES] == ["hopper.json"]
