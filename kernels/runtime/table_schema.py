"""The field-by-field schema of a certified table's entry beyond its top-level types
(kernels/runtime/table_format.py): numbers finite and in range whatever their JSON size, problems
and screens of the right shape. Each check returns "field: why" or None, so a reader names
the position in one line (an integer of 400 digits used to raise OverflowError).
"""

from __future__ import annotations

import json
import math

MAX_DIM = 2**63 - 1  # what a database column holds
PROBLEM_KEYS = {"kernel": str, "dtypes": list, "flags": dict, "dims": list, "extra": dict}
SCREEN_KEYS = {"problem", "err", "rtol", "repeat"}


def finite_number(v) -> bool:
    """A JSON number (not a bool) that is finite as a float: an integer too large for a
    float (10**400) is not."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


def nonnegative(v) -> bool:
    return finite_number(v) and v >= 0


def problem_issue(p) -> str | None:
    """Why `p` (a problem object, or JSON text of one as older tables wrote it) is not one."""
    if isinstance(p, str):
        try:
            p = json.loads(p)
        except ValueError:
            return "not a problem object (unreadable JSON text)"
    if not isinstance(p, dict):
        return "expected a problem object"
    for k, typ in PROBLEM_KEYS.items():
        if not isinstance(p.get(k), typ):
            return f"{k}: missing or not a {typ.__name__}"
    unknown = sorted(set(p) - set(PROBLEM_KEYS))
    if unknown:
        return f"{unknown[0]}: unknown key"
    if not p["kernel"] or not p["dtypes"] or not all(isinstance(d, str) and d for d in p["dtypes"]):
        return "dtypes: expected a list of dtype names"
    if not all(isinstance(v, str) for v in p["flags"].values()):
        return "flags: expected text values"
    if not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= MAX_DIM for d in p["dims"]):
        return f"dims: expected integers from 0 to {MAX_DIM}"
    return None


def screen_issue(s) -> str | None:
    """Why `s` is not a screen record {"problem", "err", "rtol"[, "repeat"]}."""
    if not isinstance(s, dict) or not {"problem", "err", "rtol"} <= set(s) or set(s) - SCREEN_KEYS:
        return 'expected {"problem", "err", "rtol"[, "repeat"]}'
    bad = problem_issue(s["problem"])
    if bad:
        return f"problem.{bad}"
    for k in ("err", "rtol"):
        if not nonnegative(s[k]):
            return f"{k}: {s[k]!r} is not a finite number >= 0"
    if "repeat" in s and not isinstance(s["repeat"], (str, type(None))):
        return "repeat: expected text"
    return None


def entry_issue(e: dict) -> str | None:
    """The entry's fields beyond their types (which table_format checks first)."""
    for k in ("kernel", "dtypes", "config"):
        if not e[k]:
            return f"{k}: empty"
    for k in ("screened_min", "screened_max"):
        if e[k] is not None:
            bad = problem_issue(e[k])
            if bad:
                return f"{k}.{bad}"
    for i, s in enumerate(e["screens"]):
        bad = screen_issue(s)
        if bad:
            return f"screens[{i}].{bad}"
    for k in ("search", "recertified_from", "search_detail"):
        if not isinstance(e["provenance"].get(k), (str, type(None))):
            return f"provenance.{k}: expected text"
    return None
