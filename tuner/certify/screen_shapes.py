"""Where a seat is screened: every candidate at the largest and the smallest shapes a census
saw in the bucket; the contenders for its certificate also at every other shape seen and at
shapes that break tile edges (the bucket's bottom and top on the ladder); each within the
profile's byte budget."""

from __future__ import annotations

from dataclasses import dataclass

from nbx_tune.kernels.spec import KernelSpec, Problem, bucket_of


@dataclass
class ScreenShapes:
    """Where a seat is screened: `base` (every candidate), `confirm` (the contenders for
    the certificate: the other shapes seen, and tile-edge shapes), and the seen shapes
    skipped for the byte budget with their bytes."""

    base: tuple[Problem, ...]
    confirm: tuple[Problem, ...]
    skipped: tuple[tuple[Problem, int], ...]
    largest: Problem


def edge_problems(spec: KernelSpec, profile, problem: Problem) -> list[Problem]:
    """Shapes that break tile edges in `problem`'s bucket: its bottom and its top on the
    ladder. A bucket's bottom is one past a step, so it leaves a remainder against every
    block size above 1; values rounded to 2..16 are tried where the seat's flags ask for
    alignment. Families that cannot say which dims keep the seat's flags give none
    (`KernelSpec.resized`)."""
    bucket = bucket_of(profile, spec.key, problem.dims)
    out = []
    for end in (0, 1):
        for align in (1, 2, 4, 8, 16):
            dims = tuple(_aligned_in(lo, hi, align, end) for lo, hi in bucket)
            p = spec.resized(problem, dims) if None not in dims else None
            if p is not None and p != problem and bucket_of(profile, spec.key, p.dims) == bucket:
                out.append(p)
                break
    return out


def _aligned_in(lo: int, hi: int, align: int, end: int) -> int | None:
    v = -(-lo // align) * align if end == 0 else hi // align * align
    return v if lo <= v <= hi else (lo if lo == hi else None)


def screen_shapes(spec: KernelSpec, profile, problems: list[Problem]) -> ScreenShapes:
    """Every candidate at the largest and smallest shapes seen; the contenders at every
    other shape seen and at the tile edges; each within the byte budget (a seen shape over
    it is reported; an edge shape over it is dropped)."""
    ordered = sorted(set(problems), key=Problem.order)
    largest = ordered[-1]
    fits = lambda p: spec.operand_bytes(p) <= profile.screen_max_bytes  # noqa: E731
    skipped = tuple((p, spec.operand_bytes(p)) for p in ordered if not fits(p))
    seen = [p for p in ordered if fits(p)]
    base = tuple(dict.fromkeys(p for p in (largest, ordered[0]) if fits(p)))
    extra = edge_problems(spec, profile, largest)
    confirm = tuple(p for p in dict.fromkeys((*seen, *extra)) if p not in base and fits(p))
    return ScreenShapes(base, confirm, skipped, largest)
