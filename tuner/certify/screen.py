"""The screen: run a candidate on fresh seeded random inputs with its outputs poisoned,
and compare with the fp64 oracle.

    err = max|out - ref| / max|ref|  must be <= the profile's autotune_screen_rtol[dtype]

Integer and boolean outputs must be bit-identical. NaN or Inf where the oracle is finite
fails (non_finite), and so does any element still holding the poison (unwritten_output):
the poison is a NaN with a payload no arithmetic produces, so "never written" and "wrote a
NaN" are told apart by bits, not guessed. Asked to repeat, the screen launches the config a
second time on the same inputs: outputs that differ bit for bit fail (nondeterministic)
unless the kernel declares run-to-run variation allowed.

The oracle is computed on the host in numpy (fp64), once per case, its large matrix
products on the candidate's GPU where there is one (`device_product`); its values are moved to
the candidate's device once as well, and each candidate is judged there by a few fp64
reductions. Copying every candidate's output to the host and judging it in numpy made the
screen most of a GEMM census's time; fp64 subtraction, abs and max are exact-rounded on
either side, so the error is the same number.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from nbx_tune.kernels.helpers import DTYPES
from nbx_tune.kernels.spec import KernelSpec, Problem
from nbx_tune.oracles import products

TORCH_DTYPES = DTYPES

# (integer view dtype, poison bits). Float poisons are NaNs with payloads that hardware
# never generates (canonical NaNs are 0x7E00 / 0x7FC0 / 0x7FC00000 ...).
POISON = {
    torch.float16: (torch.int16, 0x7D5A),
    torch.bfloat16: (torch.int16, 0x7FA5),
    torch.float32: (torch.int32, 0x7FA5A5A5),
    torch.float64: (torch.int64, 0x7FF5A5A5A5A5A5A5),
    torch.int8: (torch.int8, -0x5B),
    torch.uint8: (torch.uint8, 0xA5),
    torch.int16: (torch.int16, -0x5A5B),
    torch.int32: (torch.int32, -0x5A5A5A5B),
    torch.int64: (torch.int64, -0x5A5A5A5A5A5A5A5B),
    torch.bool: (torch.uint8, 0xA5),  # not a valid bool byte
}


@dataclass
class Case:
    """One problem's inputs (on the device, pristine) and its oracle, made once per seat."""

    problem: Problem
    inputs: dict  # name -> torch tensor on the device
    ref: dict | None  # name -> fp64 numpy array; None when only timed
    on_device: dict = field(default_factory=dict)  # (name, dtype, device) -> Reference, made on first use
    twins: dict = field(default_factory=dict)  # name -> the same fp64 values already on the device

    def reference(self, name: str, like: torch.Tensor) -> "Reference":
        key = (name, like.dtype, like.device)
        if key not in self.on_device:
            self.on_device[key] = Reference.of(self.ref[name], like, self.twins.get(name))
        return self.on_device[key]


@dataclass
class Reference:
    """One output's oracle on the device of the output it judges."""

    values: torch.Tensor  # float64 for float outputs, else the output's own dtype
    finite: torch.Tensor | None  # where the oracle is finite; None when it is everywhere
    scale: float  # max |ref| over the finite elements
    holds_poison: bool = False  # an integer oracle that itself contains the poison bits

    @classmethod
    def of(cls, ref: np.ndarray, like: torch.Tensor, twin: torch.Tensor | None = None) -> "Reference":
        """`twin`: ref's values in float64 where they already are on some device (a GPU
        product downloaded for the oracle), used instead of uploading ref again."""
        if like.dtype == torch.bool or not like.is_floating_point():
            bits = POISON[like.dtype][1]
            values = torch.from_numpy(np.ascontiguousarray(ref)).to(like.dtype).to(like.device)
            return cls(values, None, 0.0, bool(np.any(ref == bits)))
        if twin is not None and twin.device == like.device:
            values = twin
        else:
            host = np.ascontiguousarray(ref, dtype=np.float64)
            values = torch.from_numpy(host if host.flags.writeable else host.copy()).to(like.device)
        finite = torch.isfinite(values)
        everywhere = bool(finite.all())
        kept = values if everywhere else values[finite]
        scale = float(kept.abs().max()) if kept.numel() else 0.0
        return cls(values, None if everywhere else finite, scale)


@dataclass
class ScreenResult:
    problem: Problem
    err: float | None
    rtol: float
    reason: str | None = None  # refusal reason when the candidate fails
    detail: str = ""
    unit: float = 0.0  # the output dtype's machine epsilon (0 for integers): the precision gate's floor
    repeat: str | None = None  # "bitwise" or "varies (allowed)" where launched twice

    @property
    def ok(self) -> bool:
        return self.reason is None


def seed_for(label: str, problem: Problem) -> int:
    return int.from_bytes(hashlib.sha256(f"{label}|{problem.to_json()}".encode()).digest()[:8], "little")


# Draws of at least PARALLEL_MIN values are made in blocks of BLOCK, each from a generator
# seeded by (seed, draw, block), on threads: sampling the inputs of a seat's largest shapes
# one value at a time (an embedding table of 233M values, a decode attention's KV cache)
# took most of a re-certification's time. Fixed blocks make the values the same on any
# number of threads; smaller draws are the seeded generator's own.
PARALLEL_MIN = 1 << 22
BLOCK = 1 << 20
IN_PLACE = ("random", "standard_normal")  # the generator's methods that fill an `out` array


class Sampler:
    """What `KernelSpec.make_inputs` is handed: a seeded numpy Generator whose large
    draws of i.i.d. values (standard_normal, random, uniform, integers, choice with scalar
    parameters) are made in parallel blocks; every other call is the generator's own."""

    def __init__(self, seed: int, threads: int | None = None):
        self._seed, self._rng, self._draws = seed, np.random.default_rng(seed), 0
        self.threads = threads or max(1, min(16, products.cores()))
        self.blocks = 0  # blocks drawn so far (the tests read it)

    def __getattr__(self, name):
        return getattr(self._rng, name)

    def _draw(self, method: str, size, *args, **kw):
        n = int(np.prod(size)) if size is not None else 0
        if n < PARALLEL_MIN:
            return getattr(self._rng, method)(*args, size=size, **kw)
        self._draws += 1
        draw, starts = self._draws, range(0, n, BLOCK)

        def block(i, into=None):
            gen = np.random.default_rng([self._seed, draw, i])
            if into is not None:  # the same values, written in place: no block to copy
                return getattr(gen, method)(*args, out=into, **kw)
            return getattr(gen, method)(*args, size=min(BLOCK, n - starts[i]), **kw)

        first = block(0)
        out = np.empty(n, dtype=first.dtype)
        out[:BLOCK] = first
        in_place = method in IN_PLACE

        def fill(i):
            if in_place:
                block(i, out[starts[i]:starts[i] + BLOCK])
            else:
                out[starts[i]:starts[i] + BLOCK] = block(i)

        with ThreadPoolExecutor(self.threads) as pool:  # numpy draws without the GIL
            list(pool.map(fill, range(1, len(starts))))
        self.blocks += len(starts)
        return out.reshape(size)

    def standard_normal(self, size=None, dtype=np.float64, out=None):
        if out is not None:
            return self._rng.standard_normal(size, dtype, out)
        return self._draw("standard_normal", size, dtype=dtype)

    def random(self, size=None, dtype=np.float64, out=None):
        if out is not None:
            return self._rng.random(size, dtype, out)
        return self._draw("random", size, dtype=dtype)

    def uniform(self, low=0.0, high=1.0, size=None):
        if np.ndim(low) or np.ndim(high):
            return self._rng.uniform(low, high, size)
        return self._draw("uniform", size, low, high)

    def integers(self, low, high=None, size=None, dtype=np.int64, endpoint=False):
        if np.ndim(low) or np.ndim(high):
            return self._rng.integers(low, high, size, dtype, endpoint)
        return self._draw("integers", size, low, high, dtype=dtype, endpoint=endpoint)

    def choice(self, a, size=None, replace=True, p=None, axis=0, shuffle=True):
        if not replace or p is not None or np.ndim(a) > 1:
            return self._rng.choice(a, size, replace, p, axis, shuffle)
        return self._draw("choice", size, a)


def make_case(spec: KernelSpec, problem: Problem, device: str, seed: int, with_oracle: bool,
              phases: dict | None = None) -> Case:
    """One problem's inputs and oracle; `phases`, where given, gathers the seconds of each
    step (draw, round, widen, move, oracle) for the cost benches."""
    clock = _Clock(phases)
    with clock("draw"):
        values = spec.make_inputs(problem, Sampler(seed))
    inputs, rounded = {}, {}
    for slot, (name, (v, dt)) in enumerate(values.items()):
        with clock("round"):
            t = torch.from_numpy(np.ascontiguousarray(v)).to(TORCH_DTYPES[dt])
        # The oracle sees exactly the values the kernel sees, after rounding to dt.
        if with_oracle:
            with clock("widen"):
                rounded[name] = _widened(t, slot) if t.is_floating_point() else t.numpy()
        with clock("move"):
            inputs[name] = t.to(device)
    ref, twins = None, {}
    if with_oracle:
        resident = [(rounded[n], inputs[n]) for n in rounded if inputs[n].is_floating_point()]
        downloaded = []
        with clock("oracle"), products.faster(device_product(device, resident, downloaded)):
            ref = spec.oracle(problem, rounded)
        ref = {k: _unshared(v) for k, v in ref.items()}
        # An output that is a GPU product itself, as downloaded (it passed the product's
        # check: a product that failed it is numpy's, another array), is judged against the
        # copy still on the GPU: uploading it again cost as much as the download.
        twins = {k: dev for k, v in ref.items() for host, dev in downloaded if v is host}
    return Case(problem, inputs, ref, twins=twins)


class _Clock:
    def __init__(self, phases: dict | None):
        self.phases = phases

    @contextlib.contextmanager
    def __call__(self, phase: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.phases is not None:
                self.phases[phase] = self.phases.get(phase, 0.0) + time.perf_counter() - t0


# The oracle's float64 copies of the inputs are written into buffers kept from one case to
# the next (one per input slot, up to SCRATCH_KEEP_BYTES in all): a fresh 4 GiB array costs
# its page faults on first touch, seconds on a few cores, more than widening into it.
SCRATCH_KEEP_BYTES = 8 << 30
_scratch: list = []


def _widened(t: torch.Tensor, slot: int) -> np.ndarray:
    n = t.numel()
    while len(_scratch) <= slot:
        _scratch.append(torch.empty(0, dtype=torch.float64))
    if _scratch[slot].numel() < n:
        _scratch[slot] = torch.empty(0, dtype=torch.float64)  # freed before the larger one
        kept = sum(s.numel() for s in _scratch) * 8
        if kept + n * 8 > SCRATCH_KEEP_BYTES:
            return t.to(torch.float64).numpy()
        _scratch[slot] = torch.empty(n, dtype=torch.float64)
    out = _scratch[slot][:n].view(t.shape)
    out.copy_(t)
    return out.numpy()


def _unshared(ref):
    """An oracle output that is a view of a scratch buffer (a copy's oracle returns its
    input) is copied out: the next case writes over the buffer."""
    if isinstance(ref, np.ndarray) and any(np.may_share_memory(ref, s.numpy()) for s in _scratch if s.numel()):
        return ref.copy()
    return ref


def device_product(device: str, resident=(), downloaded: list | None = None):
    """The oracles' large float64 products on a GPU (`oracles/products.py` checks each
    against numpy's), or None on the CPU, where numpy's is the product. `resident`: [(a
    float64 array, the same values on the device in their own dtype)], a case's rounded
    inputs: an operand that is a view of one is read there, not uploaded. `downloaded`,
    where given, holds the last product made: (as returned, on the device)."""
    if not str(device).startswith("cuda"):
        return None

    def product(a: np.ndarray, b: np.ndarray):
        try:
            ta, tb = (on_device(x, resident, device) for x in (a, b))
            out = torch.matmul(ta, tb)
            host = out.cpu().numpy()
            host.flags.writeable = False  # an oracle that returns it has not changed it since
            if downloaded is not None:  # the last one only: an oracle of many (a conv's taps) sums them
                downloaded[:] = [(host, out)]
            return host
        except torch.cuda.OutOfMemoryError:
            return None
    return product


def on_device(x: np.ndarray, resident, device) -> torch.Tensor:
    """x (float64) on `device`: widened there from a resident copy where x is a view of
    its array (a transpose, a slice), else uploaded. Moving the widened operands was most
    of a GEMM case's oracle; a view mapped wrongly would fail the product's check."""
    for arr, dev in resident:
        view = _view_of(x, arr, dev)
        if view is not None:
            return view.to(torch.float64)
    return torch.from_numpy(x if min(x.strides, default=0) >= 0 else np.ascontiguousarray(x)).to(device)


def _view_of(x: np.ndarray, arr: np.ndarray, dev: torch.Tensor) -> torch.Tensor | None:
    """The elements of `dev` that `x` views in `arr` (dev holds arr's values, same shape,
    both contiguous), or None where x is not such a view."""
    if x.dtype != np.float64 or arr.dtype != np.float64 or not arr.flags.c_contiguous \
            or tuple(dev.shape) != arr.shape or not dev.is_contiguous() or not np.may_share_memory(x, arr):
        return None
    offset = x.__array_interface__["data"][0] - arr.__array_interface__["data"][0]
    if offset < 0 or offset % 8 or any(st < 0 or st % 8 for st in x.strides):
        return None
    offset, strides = offset // 8, tuple(st // 8 for st in x.strides)
    last = offset + sum((n - 1) * st for n, st in zip(x.shape, strides))
    if x.size == 0 or last >= arr.size:
        return None
    return dev.as_strided(x.shape, strides, dev.storage_offset() + offset)


def alloc_outputs(spec: KernelSpec, problem: Problem, device: str) -> dict:
    outs = {}
    for name, (shape, dt) in spec.output_specs(problem).items():
        t = torch.empty(shape, dtype=TORCH_DTYPES[dt], device=device)
        view, bits = POISON[t.dtype]
        t.view(view).fill_(bits)
        outs[name] = t
    return outs


def fresh_inputs(case: Case) -> dict:
    # A candidate that scribbles over its inputs must not corrupt the next one's.
    return {k: v.clone() for k, v in case.inputs.items()}


def compare(name: str, out: torch.Tensor, ref, rtol: float, problem: Problem) -> ScreenResult:
    """Judge one output against its oracle (a numpy array, or a Reference already on the
    output's device)."""
    r = ref if isinstance(ref, Reference) else Reference.of(np.asarray(ref), out)
    view, bits = POISON[out.dtype]
    poisoned = int((out.view(view) == bits).sum())
    if out.dtype == torch.bool or not out.is_floating_point():
        if poisoned and not r.holds_poison:
            return ScreenResult(problem, None, rtol, "unwritten_output",
                                f"{name}: {poisoned} of {out.numel()} elements never written")
        bad = int((out != r.values).sum())
        if bad:
            return ScreenResult(problem, None, rtol, "wrong_answer",
                                f"{name}: {bad} of {out.numel()} elements differ (integers must match exactly)")
        return ScreenResult(problem, 0.0, rtol)
    if poisoned:
        return ScreenResult(problem, None, rtol, "unwritten_output",
                            f"{name}: {poisoned} of {out.numel()} elements never written")
    got = out.to(torch.float64)
    finite = r.finite
    bad_here = ~torch.isfinite(got) if finite is None else ~torch.isfinite(got) & finite
    bad = int(bad_here.sum())
    if bad:
        return ScreenResult(problem, None, rtol, "non_finite",
                            f"{name}: {bad} NaN/Inf elements where the oracle is finite")
    diff = (got - r.values).abs()
    if finite is not None:
        # Where the oracle itself is NaN or Inf, the kernel must say the same.
        same = (got == r.values) | (torch.isnan(got) & torch.isnan(r.values))
        mismatch = int((~finite & ~same).sum())
        if mismatch:
            return ScreenResult(problem, None, rtol, "wrong_answer",
                                f"{name}: {mismatch} elements differ where the oracle is NaN/Inf")
        diff = diff[finite]
    worst = float(diff.max()) if diff.numel() else 0.0
    err = worst / r.scale if r.scale > 0 else worst
    unit = float(torch.finfo(out.dtype).eps)
    if not err <= rtol:
        return ScreenResult(problem, err, rtol, "wrong_answer",
                            f"{name}: err {err:.3g} > rtol {rtol:.3g}", unit)
    return ScreenResult(problem, err, rtol, unit=unit)


def output_rtols(spec: KernelSpec, problem: Problem, profile) -> dict[str, float]:
    """Each output is judged at the tolerance of its own dtype (an fp16 softmax's fp32
    statistics at fp32's); an exact kernel's (data movement) at 0: bit for bit."""
    if spec.exact:
        return {name: 0.0 for name in spec.output_specs(problem)}
    return {name: profile.rtol(dt) for name, (_, dt) in spec.output_specs(problem).items()}


def screen(spec: KernelSpec, config, case: Case, rtol, device: str, repeat: bool = False,
           variation_allowed: bool = False) -> ScreenResult:
    """Launch `config` on the case and judge every output (rtol: one number, or one per
    output name); with `repeat`, launch it again on the same inputs and compare the two
    bit for bit. Launch failures propagate."""
    outputs = _run(spec, config, case, device)
    worst = None
    for name, out in outputs.items():
        tol = rtol[name] if isinstance(rtol, dict) else rtol
        r = compare(name, out, case.reference(name, out), tol, case.problem)
        if not r.ok:
            return r
        worst = r if worst is None or (r.err or 0) > (worst.err or 0) else worst
    worst = worst or ScreenResult(case.problem, 0.0, min(rtol.values()) if isinstance(rtol, dict) else rtol)
    if repeat:
        differs = bitwise_differences(outputs, _run(spec, config, case, device))
        if differs and not variation_allowed:
            return ScreenResult(case.problem, worst.err, worst.rtol, "nondeterministic",
                                f"{differs}: two launches on the same inputs differ bit for bit", worst.unit)
        worst.repeat = "varies (allowed)" if differs else "bitwise"
    return worst


def _run(spec: KernelSpec, config, case: Case, device: str) -> dict:
    outputs = alloc_outputs(spec, case.problem, device)
    spec.launch(config, case.problem, fresh_inputs(case), outputs)
    if device != "cpu":
        torch.cuda.synchronize()
    return outputs


def bitwise_differences(first: dict, second: dict) -> str:
    """Where two launches' outputs differ in their bits ("" where they agree everywhere)."""
    for name, a in first.items():
        view = POISON[a.dtype][0]
        n = int((a.view(view) != second[name].view(view)).sum())
        if n:
            return f"{name}: {n} of {a.numel()} elements"
    return ""
