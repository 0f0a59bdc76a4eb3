"""Masks recognised as a pattern the kernel computes instead of reading: causal, a sliding
window, per-sequence key ranges (padding), and any AND of them.

A mask is recognised only when it equals the pattern exactly, checked on its own device: each
query row's kept keys must form one interval [lo, hi) (the row's kept count equals last - first
+ 1), and those intervals must be the pattern's, row for row. A model builds one mask per
forward and hands it to every layer, so the check runs once per mask tensor (remembered by
identity, version and storage) and the layers after the first launch with no mask read.
An inference tensor (made under torch.inference_mode) has no version counter: one written in
place after its check, between two attention calls, is not seen (torch's autograd cannot see
it either); transformers' masks are built anew each forward and never written after.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Pattern:
    """Row i of batch b sees keys [ranges[b, 0], ranges[b, 1]) (all keys where ranges is None),
    j <= i + offset where causal, and j > i + offset - window where window > 0."""

    causal: bool
    offset: int
    window: int
    ranges: torch.Tensor | None  # int32 (B or 1, 2) on the mask's device


_SEEN: dict[int, tuple] = {}  # id(mask) -> (weakref, version, data_ptr, shape, stride, Pattern | None)
_SEEN_LIMIT = 64


def recognise(mask: torch.Tensor, Lq: int, Lk: int) -> Pattern | None:
    """The pattern `mask` (bool, or additive with only 0 and -inf or the dtype's lowest value)
    equals, or None. The mask
    broadcasts to (B, H, Lq, Lk); one broadcast over the heads is needed to be a pattern."""
    key = (-1 if mask.is_inference() else mask._version, mask.data_ptr(), tuple(mask.shape), tuple(mask.stride()))
    hit = _SEEN.get(id(mask))
    if hit is not None and hit[0]() is mask and hit[1:5] == key:
        return hit[5]
    found = _recognise(mask, Lq, Lk)
    if len(_SEEN) >= _SEEN_LIMIT:
        _SEEN.clear()
    _SEEN[id(mask)] = (weakref.ref(mask), *key, found)
    return found


def _recognise(mask, Lq, Lk):
    m = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape)) if mask.dim() < 4 else mask
    if m.dim() != 4 or m.shape[1] != 1 or m.shape[2] != Lq or m.shape[3] != Lk or Lq == 0 or Lk == 0:
        return None
    if m.dtype == torch.bool:
        keep = m[:, 0]
        plain = None
    else:
        # 0 keeps a key, -inf drops it; so does the dtype's lowest value (older transformers'
        # masks) in a row that keeps a key: exp(lowest + score - max) is 0 there. A row of
        # lowest values alone is torch's uniform average, not an empty row: such a mask is read.
        keep = m[:, 0] == 0
        lowest = m[:, 0] == torch.finfo(m.dtype).min
        plain = (keep | lowest | (m[:, 0] == float("-inf"))).all()  # any other bias must be read
    cnt = keep.sum(-1)  # (Bm, Lq)
    k8 = keep.to(torch.uint8)
    first = k8.argmax(-1)  # the first True (argmax returns the first maximum)
    last = (Lk - 1) - k8.flip(-1).argmax(-1)
    some = cnt > 0
    intervals = ((cnt == last - first + 1) | ~some).all()
    lo = torch.where(some, first, 0)
    hi = torch.where(some, last + 1, 0)
    Bm = keep.shape[0]
    offset = Lk - Lq
    i = torch.arange(Lq, device=m.device)[None, :] + offset  # each row's position
    big = torch.full_like(lo, Lk + 1)
    ks = torch.where(some, lo, big).amin(-1, keepdim=True).clamp_max(Lk)  # (Bm, 1)
    ke = torch.where(some, hi, torch.zeros_like(hi)).amax(-1, keepdim=True)
    # The window: the widest causal reach of a row, i + 1 - lo (rows it clips reach exactly that).
    window = torch.where(some, i + 1 - lo, torch.zeros_like(lo)).amax()

    def fits(causal, win):
        hp = torch.minimum(i + 1, ke) if causal else ke.expand(Bm, Lq)
        lp = torch.maximum(i - win + 1, ks) if win is not None else ks.expand(Bm, Lq)
        lp = lp.clamp_min(0)
        empty = lp >= hp
        return torch.where(some, (lp == lo) & (hp == hi) & ~empty, empty).all()

    checks = [intervals, fits(True, None), fits(True, window), fits(False, None),
              ((ks == 0) & (ke == Lk)).all(), window]
    if plain is not None:
        checks.append(plain & (some | ~lowest.any(-1)).all())
    got = torch.stack([c.to(torch.int64) for c in checks]).tolist()  # the one host sync
    if not got[0] or (plain is not None and not got[6]):
        return None
    ranges = None if got[4] else torch.cat([ks, ke], 1).to(torch.int32).contiguous()
    if got[1]:
        return Pattern(True, offset, 0, ranges)
    if got[2] and got[5] > 0:
        return Pattern(True, offset, int(got[5]), ranges)
    if got[3]:
        return Pattern(False, offset, 0, ranges)
    return None
