"""Device profiles: what a device can run, how its launches are bucketed and screened.

Imports yaml (and triton, lazily, for detection); never the tuner.
"""

from __future__ import annotations

import functools
from pathlib import Path

from nbx_tune.errors import ProfileError
from nbx_tune.profiles.detect import (
    INTERPRETER,
    DeviceInfo,
    current_target,
    device_info,
    gpu_available,
    use_interpreter_without_gpu,
    interpreter_enabled,
    match_profile,
)
from nbx_tune.profiles.ladder import Ladder, LadderRow, format_range, parse_range
from nbx_tune.profiles.schema import Memory, Profile, Timing, load_profile_file

PROFILE_DIR = Path(__file__).resolve().parent

__all__ = [
    "INTERPRETER", "DeviceInfo", "Ladder", "LadderRow", "Memory", "Profile", "Timing",
    "builtin_profiles", "current_profile", "current_target", "device_info", "format_range",
    "get_profile", "gpu_available", "interpreter_enabled", "load_profile_file",
    "match_profile", "parse_range",
]


@functools.lru_cache(maxsize=1)
def builtin_profiles() -> dict[str, Profile]:
    """Every shipped profile by name (`hopper`, `cdna3`, `interpreter`, ...)."""
    out: dict[str, Profile] = {}
    for path in sorted(PROFILE_DIR.rglob("*.yml")):
        p = load_profile_file(path)
        if p.name in out:
            raise ProfileError(f"{path}: profile name {p.name!r} is also {out[p.name].source}")
        out[p.name] = p
    return out


def get_profile(name_or_path: str) -> Profile:
    """A shipped profile by name, or a profile file by path."""
    profiles = builtin_profiles()
    if name_or_path in profiles:
        return profiles[name_or_path]
    if name_or_path.endswith((".yml", ".yaml")) or "/" in name_or_path:
        return load_profile_file(name_or_path)
    raise ProfileError(
        f"unknown profile {name_or_path!r}; known: {', '.join(sorted(profiles))} "
        "(or give a path to a .yml file)"
    )


def current_profile() -> Profile:
    """The profile of the device this process runs on."""
    return match_profile(current_target(), builtin_profiles().values())
