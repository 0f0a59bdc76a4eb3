"""Eager routing: when serve() runs torch at a seat because torch finishes sooner on the host.

Under a CUDA graph only the device's time counts (the replay launches nothing from Python):
there a seat goes to torch where its baseline says torch's kernel is faster
(kernels/runtime/torch_rule.py). Eager, each call also costs the host its launch: Python,
the dispatcher, serve()'s route, the driver's enqueue. The host enqueues while the GPU
drains the queue, so a run of calls costs about the larger of the two sums; for one call
that is

    eager time = max(host, device)

Where host > device the GPU idles between launches and the host decides (a decode step's
hundreds of 5-20 us kernels); where device > host the queue hides the host (a prefill's
GEMMs). An op goes to torch eager where

    max(host_torch, device_torch) * (1 + MARGIN) < max(host_served, device_served)

with MARGIN torch_rule's (within it the two are one measurement's spread apart). The model
over-charges a host-heavy call next to a device-heavy one whose queue already hides its
host time; that error sends nothing to torch that does not lose on both sides' larger cost,
so it keeps a kernel at worst where torch would have tied.

Device times are the seat's torch baseline (`nbx_ms`, `torch_ms`: both timed in graph
replays, device time alone); a seat with none that holds here has no eager rule (the
kernel runs, as under a graph). Host times are per aten op (serve()'s route, whatever the
shape: a replay costs the same at any size), measured by serve() itself once per process
(`HostClock`): when a seat of an op first asks for them, the op's next calls outside a
graph capture alternate between the kernel and torch, each timed around the same code in
serve()'s override (torch's side through the very raise and fall-through it would take),
SAMPLES a side, and the least of each is kept (the first calls record their replays and
the host is shared: the least is the steady state). No call synchronizes. Until measured,
and under capture, the device rule decides. Short kernels only: a seat whose kernel runs
longer than HOST_CEILING_MS never loses on host time, and is checked only where the device
rule defers (its replay skips a check that could not change it).

The rule is here and nowhere else (kernels/runtime/certified.py asks it at each served
seat; kernels/serving/serve.py keeps the clocks and times the calls).
"""

from __future__ import annotations

from nbx_tune.kernels.runtime import torch_rule

SAMPLES = 8  # timed calls a side: the first record their replays; the least of the rest counts
# A kernel this long hides any Python launch path (the slowest served call's host time is a
# few tens of microseconds): its seat is decided by device time alone.
HOST_CEILING_MS = 0.1

# The reasons serve_stats() counts calls under.
REASON = "torch is faster eager (host time)"
SAMPLING = "timing torch's host cost (an op's first calls eager)"

KERNEL, TORCH = "kernel", "torch"


class HostClock:
    """One aten op's host cost per call under serve(), each side's least timed call (ms).
    Shared by threads without a lock: a call of another thread while one is timed may take
    the timed side, which costs a sample's accuracy, never a result (both sides compute it)."""

    __slots__ = ("served_ms", "torch_ms", "ready", "wanted", "force", "hit")

    def __init__(self):
        self.served_ms: list = []  # timed calls that ran the kernel
        self.torch_ms: list = []  # timed calls that ran torch through the fall-through
        self.ready = False  # both sides timed SAMPLES times
        self.wanted = False  # a seat asked for host times: serve() times the op's next calls
        self.force = None  # KERNEL or TORCH: the side the call being timed must take
        self.hit = False  # the call being timed reached a seat's check (it took `force`)

    def turn(self) -> str:
        """The side the next timed call takes: the one with fewer samples."""
        return TORCH if len(self.torch_ms) < len(self.served_ms) else KERNEL

    def add(self, side: str, ms: float) -> None:
        (self.torch_ms if side == TORCH else self.served_ms).append(ms)
        if min(len(self.torch_ms), len(self.served_ms)) >= SAMPLES:
            self.ready, self.wanted = True, False

    def host_ms(self) -> tuple[float, float]:
        """(served, torch): the least timed call of each side."""
        return min(self.served_ms), min(self.torch_ms)

    def inject(self, served_ms: float, torch_ms: float) -> None:
        """Set both sides' host times (tests, and a process that knows them)."""
        self.served_ms, self.torch_ms = [served_ms], [torch_ms]
        self.ready, self.wanted, self.force = True, False, None


def eager_defers(host_served: float, device_served: float, host_torch: float, device_torch: float) -> bool:
    """Whether torch finishes the call sooner eager, by the model above (all in ms)."""
    return max(host_torch, device_torch) * (1.0 + torch_rule.MARGIN) < max(host_served, device_served)


def checked(nbx_ms: float, torch_ms: float) -> bool:
    """Whether a seat with this baseline needs asking at each call: where either rule could
    send it to torch."""
    return nbx_ms < HOST_CEILING_MS or torch_rule.defers(nbx_ms, torch_ms)


_capturing = None


def capturing() -> bool:
    """A CUDA graph is being captured on the current stream (never on a build without CUDA,
    where torch's own test raises)."""
    global _capturing
    if _capturing is None:
        import torch

        _capturing = torch._C._cuda_isCurrentStreamCapturing if torch.cuda.is_available() else (lambda: False)
    return _capturing()


def seat_check(nbx_ms: float, torch_ms: float, serving, refuse):
    """A seat's check at each served call and each replay of one (certified.config_for
    installs it): calls `refuse(why)` (which raises) where `torch_runs` sends the call to
    torch. `serving.busy` is the op's HostClock under serve(). Once the op's host times are
    measured the seat's two verdicts are fixed: a replay then costs a dict lookup, and the
    capture test only where eager and graph disagree."""
    known = {}  # HostClock -> (eager verdict, graph verdict)

    def check():
        clock = serving.busy
        if not clock:
            return
        both = known.get(clock)
        if both is None:
            why = torch_runs(clock, nbx_ms, torch_ms)
            if clock.__class__ is HostClock and clock.ready:
                known[clock] = verdicts(clock, nbx_ms, torch_ms)
        else:
            why = both[0] if both[0] == both[1] or not capturing() else both[1]
        if why is not None:
            refuse(why)

    return check


def verdicts(clock: HostClock, nbx_ms: float, torch_ms: float) -> tuple[str | None, str | None]:
    """(eager, under capture): why torch runs the seat's call, or None, by a measured clock."""
    device = torch_rule.REASON if torch_rule.defers(nbx_ms, torch_ms) else None
    served_host, torch_host = clock.host_ms()
    eager = eager_defers(served_host, nbx_ms, torch_host, torch_ms)
    return (device if eager == (device is not None) else REASON if eager else None), device


def torch_runs(clock, nbx_ms: float, torch_ms: float) -> str | None:
    """Why a served call at a seat with this baseline runs torch, or None: the kernel runs.
    `clock` is the op's HostClock under serve()'s override (anything else: the device rule)."""
    device = torch_rule.defers(nbx_ms, torch_ms)
    if clock.__class__ is not HostClock:
        return torch_rule.REASON if device else None
    force = clock.force
    if force is not None:  # a timed call: the side it measures
        clock.hit = True
        return SAMPLING if force == TORCH else None
    if not clock.ready:
        clock.wanted = True
        return torch_rule.REASON if device else None
    eager, graph = verdicts(clock, nbx_ms, torch_ms)
    return graph if eager == graph or capturing() else eager
