"""Profiles: every shipped file loads, detection picks the right one, the ladder math
holds its definition, and a bad file names the file and the key path."""

from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from nbx_tune.errors import DeviceError, ProfileError
from nbx_tune.profiles import builtin_profiles, get_profile, load_profile_file, match_profile
from nbx_tune.profiles.ladder import Ladder, LadderRow

EXPECTED = {"volta", "turing", "ampere", "ampere_ga10x", "ada", "hopper", "blackwell",
            "blackwell_geforce", "cdna2", "cdna3", "apple_m", "interpreter"}


def test_every_shipped_profile_loads_with_its_facts():
    profiles = builtin_profiles()
    assert EXPECTED <= set(profiles)
    hopper = profiles["hopper"]
    assert hopper.memory.max_shared_memory_per_block == 232448
    assert hopper.memory.warp_size == 32
    assert profiles["cdna3"].memory.warp_size == 64
    assert profiles["apple_m"].memory.max_shared_memory_per_block == 32768
    for p in profiles.values():
        assert p.screen_rtol["float32"] == 1e-4
        assert all(p.screen_rtol[d] == 0.0 for d in ("int32", "int64") if d in p.screen_rtol)
        assert "default" in p.ladders and "elements" in p.ladders
    # The interpreter refuses to screen bf16 rather than certify garbage.
    assert "bfloat16" in profiles["interpreter"].screen_unsupported
    assert "bfloat16" not in profiles["interpreter"].screen_rtol


@pytest.mark.parametrize("target,name", [
    ("cuda:90", "hopper"), ("cuda:80", "ampere"), ("cuda:86", "ampere_ga10x"), ("cuda:89", "ada"),
    ("cuda:70", "volta"), ("cuda:75", "turing"), ("cuda:100", "blackwell"), ("cuda:120", "blackwell_geforce"),
    ("hip:gfx90a", "cdna2"), ("hip:gfx942", "cdna3"), ("metal:apple-m4-pro", "apple_m"),
    ("interpreter", "interpreter"),
])
def test_detection_by_target_prefix(target, name):
    assert match_profile(target, builtin_profiles().values()).name == name


def test_detection_longest_prefix_wins_and_ties_are_errors(tmp_path):
    base = yaml.safe_load(Path(builtin_profiles()["hopper"].source).read_text())
    wide = dict(base, compute_capability_matches=["cuda:9"])
    (tmp_path / "wide.yml").write_text(yaml.safe_dump(wide))
    (tmp_path / "twin.yml").write_text(yaml.safe_dump(wide))
    hopper = builtin_profiles()["hopper"]
    w = load_profile_file(tmp_path / "wide.yml")
    assert match_profile("cuda:90", [w, hopper]).name == "hopper"
    assert match_profile("cuda:91", [w, hopper]).name == "wide"
    with pytest.raises(ProfileError, match="equally"):
        match_profile("cuda:91", [w, load_profile_file(tmp_path / "twin.yml")])
    with pytest.raises(ProfileError, match="no profile matches device target 'cuda:61'"):
        match_profile("cuda:61", builtin_profiles().values())


def test_detect_interpreter_from_environment_without_a_driver(monkeypatch):
    from nbx_tune.profiles import current_profile, current_target

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert current_target() == "interpreter"
    assert current_profile().name == "interpreter"


def test_an_nvidia_target_comes_from_torch_without_tritons_driver(monkeypatch):
    import torch

    from nbx_tune.profiles import current_target, detect

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))

    class NoDriver:  # any use of Triton's driver fails the test
        def __getattr__(self, name):
            raise AssertionError(f"Triton's driver was asked for {name}")

    import triton.runtime

    monkeypatch.setattr(triton.runtime, "driver", NoDriver())
    assert current_target() == "cuda:90"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (12, 1))
    assert current_target() == "cuda:121"
    # A ROCm build, or no GPU seen: Triton's driver decides (here: it fails as it would).
    monkeypatch.setattr(torch.version, "hip", "7.0")
    assert detect._torch_cuda_target() is None
    with pytest.raises(DeviceError, match="no GPU found by Triton"):
        current_target()

def test_ladder_math_matches_the_definition():
    lad = builtin_profiles()["hopper"].ladder("default")
    want = {1: (1, 1), 64: (64, 64), 65: (65, 80), 257: (257, 288), 4096: (3969, 4096), 8193: (8193, 8320),
            16384: (16257, 16384), 16900: (16897, 17024), 32769: (32769, 32896), 33800: (33793, 33920),
            65536: (65409, 65536), 70000: (65537, 81920)}
    assert {n: lad.bucket(n) for n in want} == want
    with pytest.raises(ValueError):
        lad.bucket(0)


@st.composite
def ladder_st(draw):
    rows, up = [], 0
    for _ in range(draw(st.integers(1, 6))):
        step = draw(st.integers(1, 64))
        up = (up // step + draw(st.integers(1, 10))) * step
        rows.append(LadderRow(up, step))
    if draw(st.booleans()):
        rows.append(LadderRow(None, draw(st.integers(1, 4096))))
    return Ladder("h", tuple(rows))


@settings(max_examples=300, deadline=None)
@given(ladder_st(), st.integers(1, 10**7))
def test_ladder_property_bucket_contains_value_and_is_a_fixed_point(lad, v):
    last = lad.rows[-1].up_to
    if last is not None and v > last:
        with pytest.raises(ValueError):
            lad.bucket(v)
        return
    lo, hi = lad.bucket(v)
    assert lo <= v <= hi
    # Every value in the bucket maps to the same bucket, and its neighbours do not.
    assert lad.bucket(lo) == (lo, hi) and lad.bucket(hi) == (lo, hi)
    if lo > 1:
        assert lad.bucket(lo - 1)[1] == lo - 1
    if last is None or hi < last:
        assert lad.bucket(hi + 1)[0] == hi + 1
    # The top is a multiple of the step of the row the value falls in.
    row = next(r for r in lad.rows if r.up_to is None or v <= r.up_to)
    assert hi % row.step == 0


def _write(tmp_path, mutate):
    data = yaml.safe_load(Path(builtin_profiles()["turing"].source).read_text())
    mutate(data)
    p = tmp_path / "bad.yml"
    p.write_text(yaml.safe_dump(data))
    return p


@pytest.mark.parametrize("mutate,where", [
    (lambda d: d.update(colour="red"), "colour: unknown key"),
    (lambda d: d["memory"].update(max_shared_memory_per_block="lots"), "memory.max_shared_memory_per_block: expected an integer"),
    (lambda d: d["memory"].pop("warp_size"), "memory.warp_size: missing"),
    (lambda d: d["autotune"]["buckets"]["default"].__setitem__(2, {"up_to": 200, "step": 16}),
     "autotune.buckets.default[2].up_to: must increase"),
    (lambda d: d["autotune"]["buckets"]["default"].__setitem__(0, {"up_to": 64, "step": 0}),
     "autotune.buckets.default[0].step: must be > 0"),
    (lambda d: d["autotune"]["buckets"]["default"].__setitem__(1, {"up_to": 250, "step": 16}),
     "autotune.buckets.default[1].up_to: 250 is not a multiple of its row's step 16"),
    (lambda d: d["autotune"]["buckets"]["elements"].__setitem__(0, {"up_to": None, "step": 64}),
     "autotune.buckets.elements[0].up_to: null (unbounded) is only allowed on the last row"),
    (lambda d: d["autotune_screen_rtol"].update(int64=0.5), "autotune_screen_rtol.int64: integer results"),
    (lambda d: d["autotune_screen_rtol"].update(float8=0.5), "autotune_screen_rtol.float8: unknown dtype"),
    (lambda d: d["autotune"]["timing"].update(method="stopwatch"), "autotune.timing.method:"),
    (lambda d: d.update(launch_options=["num_threads"]), "launch_options[0]:"),
])
def test_bad_profile_names_file_and_key_path(tmp_path, mutate, where):
    p = _write(tmp_path, mutate)
    with pytest.raises(ProfileError) as e:
        load_profile_file(p)
    msg = str(e.value)
    assert msg.startswith(str(p)) and where in msg and "\n" not in msg


def test_bad_yaml_and_missing_file_are_one_line_errors(tmp_path):
    p = tmp_path / "broken.yml"
    p.write_text("vendor: nvidia\nmemory: [unclosed\n")
    with pytest.raises(ProfileError, match=r"broken.yml: line \d+, column \d+: not valid YAML"):
        load_profile_file(p)
    with pytest.raises(ProfileError, match="cannot read"):
        load_profile_file(tmp_path / "absent.yml")
    with pytest.raises(ProfileError, match="unknown profile 'pascal'"):
        get_profile("pascal")


def test_profile_hash_ignores_comments_and_timing_but_not_ladders(tmp_path):
    src = Path(builtin_profiles()["turing"].source).read_text()
    (tmp_path / "a.yml").write_text("# another comment\n" + src.replace("rep_ms: 100", "rep_ms: 50"))
    data = yaml.safe_load(src)
    data["autotune"]["buckets"]["default"][0] = {"up_to": 32, "step": 1}
    (tmp_path / "b.yml").write_text(yaml.safe_dump(data))
    turing = builtin_profiles()["turing"]
    assert load_profile_file(tmp_path / "a.yml").hash == turing.hash
    assert load_profile_file(tmp_path / "b.yml").hash != turing.hash


def test_yaml_is_never_executed(tmp_path):
    marker = tmp_path / "pwned"
    p = tmp_path / "evil.yml"
    p.write_text(f'vendor: !!python/object/apply:os.system ["touch {marker}"]\n')
    with pytest.raises(ProfileError, match="not valid YAML"):
        load_profile_file(p)
    assert not marker.exists()


def test_a_kernels_profile_hash_covers_only_the_ladders_its_key_uses(tmp_path):
    # Re-laddering element counts stales the element-wise certificates, not the GEMMs'.
    src = Path(builtin_profiles()["turing"].source).read_text()
    data = yaml.safe_load(src)
    data["autotune"]["buckets"]["elements"][0] = {"up_to": 4096, "step": 4096}
    (tmp_path / "e.yml").write_text(yaml.safe_dump(data))
    data["autotune_screen_rtol"]["float32"] = 2.0e-4
    (tmp_path / "r.yml").write_text(yaml.safe_dump(data))
    turing, laddered, strict = (builtin_profiles()["turing"], load_profile_file(tmp_path / "e.yml"),
                                load_profile_file(tmp_path / "r.yml"))
    assert laddered.hash_for(["default"]) == turing.hash_for(["default"])
    assert laddered.hash_for(["elements"]) != turing.hash_for(["elements"])
    assert strict.hash_for(["default"]) != laddered.hash_for(["default"])  # the rest of the profile counts
    assert turing.hash_for(["default", "default"]) == turing.hash_for(["default"])
    with pytest.raises(ProfileError, match="no ladder 'absent'"):
        turing.hash_for(["absent"])


def test_a_key_on_a_ladder_the_profile_lacks_makes_its_certificates_stale_not_a_crash():
    # A plugin's key may name a ladder the running profile does not define.
    import copy

    from nbx_tune.testing import planted

    from nbx_tune.kernels.runtime import validity
    from nbx_tune.kernels.spec import KeyDim

    turing, spec = builtin_profiles()["turing"], planted.SPEC
    prov = {"kernel_source_hash": spec.source_hash, "config_space_hash": spec.config_space_hash,
            "profile_hash": validity.profile_hash(turing, spec), "device_target": "cuda:75"}
    assert validity.stale_reason(prov, spec, turing) is None
    odd = copy.copy(spec)
    odd.key = (KeyDim("N", "absent"),)
    assert "profile changed" in validity.stale_reason(prov, odd, turing)
