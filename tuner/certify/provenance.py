"""Provenance: what a certificate was made under, and whether it still holds here.

A certificate is valid only for the kernel source hash, the config-space hash, the Triton
version, the profile hash and the device it was made under. The device is judged through
the profile: a certificate made on `cuda:90` holds for any device the hopper profile
claims (an H100 or an H200), and goes stale if the profile stops claiming it.
"""

from __future__ import annotations

import torch
import triton

from nbx_tune.kernels.runtime import validity
from nbx_tune.kernels.spec import KernelSpec
from nbx_tune.profiles import DeviceInfo, Profile

FIELDS = ("device_name", "device_target", "driver", "triton_version", "torch_version",
          "kernel_source_hash", "config_space_hash", "profile_hash")


def current(spec: KernelSpec, profile: Profile, device: DeviceInfo) -> dict[str, str]:
    return {
        "device_name": device.name,
        "device_target": device.target,
        "driver": device.driver,
        "triton_version": triton.__version__,
        "torch_version": torch.__version__,
        "kernel_source_hash": spec.source_hash,
        "config_space_hash": spec.config_space_hash,
        "profile_hash": validity.profile_hash(profile, spec),
    }


def stale_reason(prov, spec: KernelSpec | None, profile: Profile) -> str | None:
    """Why a certificate with provenance `prov` (a mapping or a row with those attributes)
    is no longer valid here, or None if it holds (the rule: kernels/runtime/validity.py)."""
    return validity.stale_reason(prov, spec, profile, triton_version=triton.__version__)
