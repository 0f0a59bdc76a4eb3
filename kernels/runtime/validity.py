"""Whether a certificate may be served here: its provenance (the staleness rule, written
once) and its config (a point of the kernel's declared space).

A certificate holds only for the kernel source, config space and profile it was made
under, for the Triton version (where the reader compiles), and for its device's compile
target: the profile must still claim the target it was made on and, where the running
device is known, that target must be the running device's own. A sibling device of one
target (an H200's certificate on an H100, both `cuda:90`) is the same compiled code and
stays valid; another target (`cuda:80` on a `cuda:90` device) is never served.

A config read from a table or a database is served only if it is one of the kernel's
declared configs: a hand-edited `BLOCK_M=0`, an unknown or missing constexpr or
`num_warps=0` is never launched.

Used by the launch-time read (kernels/runtime/certified.py), seat status (tuner/certify/provenance.py) and
export/import (tuner/store/export.py); it lives here because kernels/ never imports the tuner.
"""

from __future__ import annotations

from typing import Any

from nbx_tune.kernels.spec import Config
from nbx_tune.errors import ProfileError


def _getter(prov: Any):
    return prov.get if isinstance(prov, dict) else (lambda k: getattr(prov, k, None))


def claims(profile, target) -> bool:
    """Whether `profile` covers devices of compile target `target` (its prefixes)."""
    return isinstance(target, str) and any(target.startswith(p) for p in profile.compute_capability_matches)


def profile_hash(profile, spec) -> str:
    """The profile hash `spec`'s certificates are made under and checked against."""
    return profile.hash_for(d.ladder for d in spec.key)


def _held_profile_hash(profile, spec) -> str:
    # A key naming a ladder this profile lacks (a plugin's) holds no certificate: stale, not a crash.
    try:
        return profile_hash(profile, spec)
    except ProfileError as e:
        return f"none: {e}"


def stale_reason(prov: Any, spec, profile, triton_version: str | None = None,
                 device_target: str | None = None) -> str | None:
    """Why a certificate with provenance `prov` (a mapping, or a row with those attributes)
    does not hold, or None if it does. `triton_version` / `device_target`: the running
    ones, checked when given (an exporter judges the code only; a reader judges all)."""
    if spec is None:
        return "kernel not registered here"
    get = _getter(prov)
    checks = [("kernel source", get("kernel_source_hash"), spec.source_hash),
              ("config space", get("config_space_hash"), spec.config_space_hash),
              ("profile", get("profile_hash"), _held_profile_hash(profile, spec))]
    if triton_version is not None:
        checks.append(("Triton", get("triton_version"), triton_version))
    for what, then, now in checks:
        if then != now:
            return f"{what} changed ({then} -> {now})"
    target = get("device_target")
    if not claims(profile, target):
        return f"made on device {target}, which profile {profile.name} does not claim"
    if device_target is not None and target != device_target:
        return f"made for compile target {target}, not this device's {device_target}"
    return None


def _norm(c: Config) -> tuple:
    return (tuple(sorted(c.meta)), c.num_warps, c.num_stages)


def config_index(spec) -> dict:
    """The kernel's declared configs by content (the order of the constexprs aside)."""
    return {_norm(c): c for c in spec.configs()}


def declared_config(index: dict, text: str) -> Config:
    """The declared config `text` names; ValueError saying why when it names none."""
    try:
        cfg = Config.parse(text)
    except ValueError:
        raise ValueError(f"config {text!r} is not name=integer pairs") from None
    found = index.get(_norm(cfg))
    if found is None:
        raise ValueError(f"config {text!r} is not in the kernel's declared config space")
    return found
