"""Ladder math: which bucket a launch dimension falls in.

A ladder is a list of rows `{up_to, step}` (`up_to: None` is unbounded). A value v falls in
the first row with v <= up_to; its bucket top is the smallest multiple of that row's step
that is >= v, and its bottom is just above the larger of (top - step) and the previous row's
up_to. Every value in [bottom, top] lands in the same bucket, and buckets never overlap.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass


@dataclass(frozen=True)
class LadderRow:
    up_to: int | None
    step: int


@dataclass(frozen=True)
class Ladder:
    name: str
    rows: tuple[LadderRow, ...]

    def __post_init__(self):
        # Bounded tops for bisect; the unbounded row (if any) is the tail.
        object.__setattr__(self, "_uppers", [r.up_to for r in self.rows if r.up_to is not None])

    def bucket(self, value: int) -> tuple[int, int]:
        """(bottom, top) of the bucket holding `value`; both ends are in the bucket."""
        if value < 1:
            raise ValueError(f"ladder {self.name!r}: a launch dimension must be >= 1, got {value}")
        uppers = self._uppers
        i = bisect_left(uppers, value)
        if i == len(uppers) and (not self.rows or self.rows[-1].up_to is not None):
            raise ValueError(
                f"ladder {self.name!r}: {value} is above its last row's up_to {uppers[-1]}"
            )
        step = self.rows[i].step
        top = -(-value // step) * step
        prev = uppers[i - 1] if i > 0 else 0
        return max(top - step, prev) + 1, top

    def buckets_between(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """Every bucket that intersects [lo, hi], in order."""
        out = []
        v = lo
        while v <= hi:
            b = self.bucket(v)
            out.append(b)
            v = b[1] + 1
        return out


def format_range(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}..{hi}"


def parse_range(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition("..")
    return (int(lo), int(hi)) if sep else (int(lo), int(lo))
