"""Whether an imported table entry is a seat this build can key and screen (issue 61: an
unknown function, dtype or an impossible bucket used to be stored, listed and exported as
certified, and a config this profile's static checks refuse was served unscreened).

A seat can be keyed when its dtypes are ones nbx-tune knows, its flags decode and its
bucket lies inside one bucket of the profile's ladders (where a launch's key lands). It can be
screened when its screened shapes are shapes of this seat, the kernel can make their inputs
and fp64 oracle (tried once per kernel, dtypes and flags, at the smallest screened shape
under PROBE_BYTES), and the config passes the profile's static checks there.
"""

from __future__ import annotations

import json

from nbx_tune.kernels.spec import (DTYPE_SIZES, Problem, bucket_of, decode_bucket, decode_flags, encode_bucket,
                                   encode_dtypes)
from nbx_tune.kernels.runtime.table_schema import MAX_DIM
from nbx_tune.tuner.certify.screen import make_case

PROBE_BYTES = 4 << 20  # a larger smallest shape is keyed and checked, its oracle not tried (import time)


class SeatChecker:
    """One per import: the oracle probe's verdicts are kept per (kernel, dtypes, flags)."""

    def __init__(self, profile):
        self.profile = profile
        self.probed: dict = {}

    def issue(self, spec, e: dict, config) -> str | None:
        """"field: why" when entry `e` of kernel `spec` (its config `config` declared) is not
        a seat this build can key and screen here; None when it is."""
        dtypes = e["dtypes"].split(",")
        for d in dtypes:
            if d not in DTYPE_SIZES:
                return f"dtypes: {d!r} is not a dtype nbx-tune knows"
        try:
            flags = decode_flags(e["flags"])
            if any(len(f) != 2 or not f[0] for f in flags):
                raise ValueError
        except ValueError:
            return f"flags: {e['flags']!r} is not name=value pairs"
        try:
            bucket = decode_bucket(spec.key, e["bucket"])
        except (KeyError, ValueError):
            return f"bucket: {e['bucket']!r} is not a bucket of kernel {spec.name}'s key"
        if encode_bucket(spec.key, bucket) != e["bucket"] or not self._made_by_ladders(spec, bucket):
            return f"bucket: {e['bucket']!r} is not inside one bucket of profile {self.profile.name}'s ladders"
        problems = []
        for k in ("screened_min", "screened_max"):
            if e[k] is None:
                continue
            p = e[k]
            p = Problem.from_json(p if isinstance(p, str) else json.dumps(p))
            if (p.kernel, encode_dtypes(p.dtypes), p.flags) != (spec.name, e["dtypes"], flags) \
                    or not self._made_by_ladders(spec, bucket, p.dims):
                return f"{k}: a shape of another seat than this entry's"
            refused = spec.static_refusal(self.profile, config, p)
            if refused:
                return f"config: refused here at its {k} shape: {refused[0]}: {refused[1]}"
            problems.append(p)
        if problems:
            bad = self._probe(spec, min(problems, key=lambda q: q.order()))
            if bad:
                return f"flags: kernel {spec.name} cannot screen this seat ({bad})"
        return None

    def _made_by_ladders(self, spec, bucket, dims=None) -> bool:
        """Without `dims`: the bucket lies inside one bucket of the profile's ladders (a
        launch's key lands there; 1..10^40 spans many, or none). With `dims`: they lie in it."""
        if dims is not None:
            return len(dims) == len(bucket) and all(lo <= d <= hi for d, (lo, hi) in zip(dims, bucket))
        if not all(0 <= lo <= hi <= MAX_DIM for lo, hi in bucket):
            return False
        try:
            return bucket_of(self.profile, spec.key, [lo for lo, _ in bucket]) == \
                bucket_of(self.profile, spec.key, [hi for _, hi in bucket])
        except (ValueError, KeyError, OverflowError):
            return False

    def _probe(self, spec, p: Problem) -> str | None:
        key = (p.kernel, p.dtypes, p.flags)
        if key not in self.probed:
            self.probed[key] = _oracle_issue(spec, p)
        return self.probed[key]


def _oracle_issue(spec, p: Problem) -> str | None:
    """Why the kernel cannot make inputs and an fp64 answer at `p`, or None."""
    try:
        if spec.operand_bytes(p) > PROBE_BYTES:
            return None
        make_case(spec, p, "cpu", 0, with_oracle=True)
    except Exception as e:  # a plugin's bug or an unknown flag: the seat is refused, the import says why
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return None
