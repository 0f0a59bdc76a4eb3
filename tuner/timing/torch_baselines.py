"""Torch baselines (`nbx-tune baseline`): every certified seat a trace uses, its certified
config against torch's own op at the trace's rows, and the record serve() reads.

Per row both sides run on operands of the row's shapes, rotating through several copies
(about 96 MB in all, at most 4) so a weight matrix is not served from the L2 on the next
call, as in a model, and each call allocates its output, as torch's op does. Both are timed
as a model under CUDA graphs runs them: a graph of GRAPH_CALLS calls replayed, the two
sides in alternating rounds (tuner/timing.side_by_side). nbx side: the seat's current
certificate in the database, launched through the spec as the census timed it. torch side:
the row's aten op (torch.ops.aten.*) with its recorded params. A seat's times are the
launch-weighted means over its rows in the traces given. Where torch is faster, serve()
runs torch at that seat (the rule: kernels/runtime/torch_rule.py). On the interpreter (no GPU) the
sides are timed by wall clock: the record is made, and means nothing for speed.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field

from nbx_tune.kernels.runtime import torch_rule as rule

ROTATE_BYTES = 96 << 20
MAX_SETS = 4
GRAPH_CALLS = 24  # calls captured per graph: the replay's own launch is shared by them
ROUNDS = 4


# ----------------------------------------------------------------------------- torch side

def _param(text: str, typ: str):
    """A recorded param's text as the value the schema type takes (recorder.py's format)."""
    import torch

    if text == "None":
        return None
    if text in ("True", "False"):
        return text == "True"
    if text == "()":
        return []
    if "List" in typ or "[]" in typ:
        return [int(p) for p in text.split("x")]
    dt = getattr(torch, text, None)
    if isinstance(dt, torch.dtype):
        return dt
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def tensor(shape, dtype: str, device: str):
    """Operand values: uniform in [-1, 1]; booleans true; integers zero (in range of any index)."""
    import torch

    dt = getattr(torch, dtype)
    if dt.is_floating_point:
        return torch.empty(shape, dtype=dt, device=device).uniform_(-1, 1)
    if dt == torch.bool:
        return torch.ones(shape, dtype=dt, device=device)
    return torch.zeros(shape, dtype=dt, device=device)


_WRAPPED = {"float64": 0.5, "int64": 1, "bool": True}


def n_sets(nbytes: int, device: str) -> int:
    if device == "cpu":
        return 1
    return max(1, min(MAX_SETS, -(-ROTATE_BYTES // max(nbytes, 1))))


def torch_call(row, device: str):
    """(fn(i), bytes of one operand set): torch's aten op of the row on fresh tensors, from
    its schema: tensor arguments take the row's tensors in order (a list argument takes all
    that the later tensor arguments leave), params parse by the schema's types. A 0-d
    float64/int64/bool tensor is a wrapped Python number (recorder.py) and is passed as one."""
    import torch

    ns, name, *ov = row.op.split(".")
    op = getattr(getattr(getattr(torch.ops, ns), name), ov[0] if ov else "default")
    tensors = [(s, d) for s, d in zip(row.shapes, row.dtypes)]
    args = op._schema.arguments
    later_single = [sum(1 for b in args[i + 1:] if str(b.type) in ("Tensor", "Optional[Tensor]")
                        and b.name not in row.params) for i in range(len(args))]
    plan, ti = [], 0
    for i, a in enumerate(args):
        typ = str(a.type)
        if a.name in row.params:
            plan.append((a.name, "value", _param(row.params[a.name], typ)))
        elif typ in ("Tensor", "Optional[Tensor]"):
            plan.append((a.name, "tensor", tensors[ti]))
            ti += 1
        elif typ in ("List[Tensor]", "List[Optional[Tensor]]"):
            n = len(tensors) - ti - later_single[i]
            plan.append((a.name, "list", tensors[ti:ti + n]))
            ti += n
        elif a.name == "device":  # never recorded (recorder.py): where this run computes
            plan.append((a.name, "value", torch.device(device)))
        elif a.name == "cudnn_enabled":  # never recorded, and required by aten.batch_norm
            plan.append((a.name, "value", True))
    if ti != len(tensors):
        raise ValueError(f"{row.op}: placed {ti} of {len(tensors)} tensors from its schema")

    def make(spec):
        shape, dt = spec
        if shape == () and dt in _WRAPPED:
            return _WRAPPED[dt]
        return tensor(shape, dt, device)

    # A matmul row's `layout` (nt: b stored transposed, a linear layer's W.t()): its two
    # matrix operands, the schema's last two tensors, made as the model holds them.
    layout = row.params.get("layout", "nn") if name in ("mm", "addmm", "bmm", "baddbmm") else "nn"
    matrices = [n for n, kind, _ in plan if kind == "tensor"][-2:]

    def make_as_held(name_, spec):
        if name_ not in matrices or layout[matrices.index(name_)] != "t":
            return make(spec)
        shape, dt = spec
        return tensor((*shape[:-2], shape[-1], shape[-2]), dt, device).transpose(-1, -2)

    def one_set():
        kw = {}
        for name_, kind, v in plan:
            kw[name_] = v if kind == "value" else make_as_held(name_, v) if kind == "tensor" else [make(s) for s in v]
        return kw

    nbytes = sum(math.prod(s) * getattr(torch, d).itemsize for s, d in tensors if not (s == () and d in _WRAPPED))
    sets = [one_set() for _ in range(n_sets(nbytes, device))]
    return (lambda i: op(**sets[i % len(sets)])), nbytes


# ----------------------------------------------------------------------------- nbx side

def operand_sets(spec, problem, device: str) -> tuple[list, list]:
    """(input sets, output specs): the problem's operands (uniform values; integers zero),
    as many copies as rotate through ROTATE_BYTES, and [(name, shape, torch dtype)] of what
    each call allocates."""
    import torch

    try:
        shapes = spec.input_shapes(problem)
    except NotImplementedError:
        shapes = None
    nbytes = spec.operand_bytes(problem) if shapes is not None else 0
    out_specs = [(n, s, getattr(torch, dt)) for n, (s, dt) in spec.output_specs(problem).items()]
    sets = []
    for _ in range(n_sets(nbytes, device)):
        if shapes is not None:
            sets.append({n: tensor(s, dt, device) for n, (s, dt) in shapes.items()})
        else:
            import numpy as np

            sets.append({n: torch.from_numpy(np.ascontiguousarray(v)).to(getattr(torch, dt)).to(device)
                         for n, (v, dt) in spec.make_inputs(problem, np.random.default_rng(0)).items()})
    return sets, out_specs


def spec_call(spec, problem, config, device: str):
    """fn(i): the spec's launch of `config` on operand_sets, each call allocating its
    outputs (as torch's op does: one output per operand set would leave the L2 each call
    while torch's stays)."""
    import torch

    sets, out_specs = operand_sets(spec, problem, device)

    def call(i):
        return spec.launch(config, problem, sets[i % len(sets)],
                           {n: torch.empty(s, dtype=d, device=device) for n, s, d in out_specs})

    return call


def served(row):
    """(spec, problem) when a kernel serves the row, else None."""
    from nbx_tune.kernels.runtime.registry import get_spec, spec_for_op
    from nbx_tune.kernels.spec import NotServable

    spec = spec_for_op(row.op)
    if spec is None:
        return None
    problem = spec.problem_from_row(row)
    if isinstance(problem, NotServable):
        return None
    return (spec if problem.kernel == spec.name else get_spec(problem.kernel)), problem


# ----------------------------------------------------------------------------- timing

def cuda_timer(fn, rep_ms: float) -> float:
    """ms per call of fn (which may be a graph replay of several calls: the caller divides):
    CUDA events around a loop sized to rep_ms, after one call to size it."""
    import torch

    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn()
    e.record()
    e.synchronize()
    n = max(2, min(2000, int(rep_ms / max(s.elapsed_time(e), 1e-3))))
    s.record()
    for _ in range(n):
        fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / n


def cpu_timer(fn, rep_ms: float) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def capture(f, calls: int = GRAPH_CALLS):
    """A CUDA graph of f(0) .. f(calls - 1), after three calls outside it (compile, warm-up)."""
    import torch

    for i in range(3):
        f(i)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        for i in range(calls):
            f(i)
    torch.cuda.synchronize()
    return g


def graph_times(fns: dict, rep_ms: float, calls: int = GRAPH_CALLS, device: str = "cuda") -> dict:
    """ms per call of each fn(i) under CUDA-graph replay, in alternating rounds (on the CPU,
    the calls one after another, wall clock)."""
    from nbx_tune.tuner.timing.benchmarkers import side_by_side

    if device == "cpu":
        loops = {s: (lambda f=f: [f(i) for i in range(calls)]) for s, f in fns.items()}
        return {s: v / calls for s, v in side_by_side(loops, rep_ms, rounds=2, timer=cpu_timer).items()}
    graphs = {s: capture(f, calls) for s, f in fns.items()}
    t = side_by_side({s: g.replay for s, g in graphs.items()}, rep_ms, rounds=ROUNDS, timer=cuda_timer)
    return {s: v / calls for s, v in t.items()}


def method(device: str) -> str:
    return (f"graph replay x{GRAPH_CALLS}, {ROUNDS} alternating rounds" if device != "cpu"
            else "wall clock (interpreter)")


# ----------------------------------------------------------------------------- driver

@dataclass
class SeatBaseline:
    label: str
    kernel: str
    seat_id: int | None = None
    config: str | None = None
    rows: list = field(default_factory=list)  # {"row", "count", "nbx_ms", "torch_ms"}
    nbx_ms: float | None = None
    torch_ms: float | None = None
    recorded: bool = False
    why: str | None = None  # why no baseline was recorded

    @property
    def launches(self) -> int:
        return sum(r["count"] for r in self.rows)

    @property
    def ratio(self) -> float | None:
        """torch / nbx-tune: below 1, the kernel is slower."""
        return self.torch_ms / self.nbx_ms if self.nbx_ms and self.torch_ms else None

    @property
    def defers(self) -> bool:
        return bool(self.nbx_ms and self.torch_ms) and rule.defers(self.nbx_ms, self.torch_ms)

    def to_dict(self) -> dict:
        return {"seat": self.label, "seat_id": self.seat_id, "config": self.config, "launches": self.launches,
                "nbx_ms": self.nbx_ms, "torch_ms": self.torch_ms, "torch_over_nbx": self.ratio,
                "serve_runs": "torch" if self.defers else "kernel" if self.nbx_ms else None,
                "recorded": self.recorded, "why_not_recorded": self.why, "rows": self.rows}


@dataclass
class BaselineReport:
    device_name: str
    torch_version: str
    method: str
    seats: list = field(default_factory=list)
    untimed: int = 0  # seats left when the budget ran out
    seconds: float = 0.0

    def to_dict(self) -> dict:
        timed = [s for s in self.seats if s.nbx_ms]
        return {"device_name": self.device_name, "torch_version": self.torch_version, "method": self.method,
                "margin": rule.MARGIN,
                "seats": [s.to_dict() for s in self.seats], "timed": len(timed),
                "recorded": sum(s.recorded for s in self.seats),
                "deferred_to_torch": sum(s.defers for s in timed), "untimed": self.untimed,
                "seconds": round(self.seconds, 2)}


def row_text(row) -> str:
    from nbx_tune.kernels.rows import format_shape

    p = row.params.text()
    return f"{row.op} {','.join(row.dtypes)} {';'.join(format_shape(s) for s in row.shapes)}" + (f" {p}" if p else "")


def plan(rows, profile) -> dict:
    """seat key (kernel, dtypes, flags, bucket texts) -> [(row, spec, problem, count)],
    identical rows merged (their counts summed)."""
    from nbx_tune.kernels.spec import bucket_of, encode_bucket, encode_dtypes, encode_flags

    seats: dict = {}
    for row in rows:
        hit = served(row)
        if hit is None:
            continue
        spec, problem = hit
        bucket = bucket_of(profile, spec.key, problem.dims)
        key = (spec.name, encode_dtypes(problem.dtypes), encode_flags(problem.flags), encode_bucket(spec.key, bucket))
        found = seats.setdefault(key, {})
        text = row_text(row)
        prev = found.get(text)
        found[text] = (row, spec, problem, (prev[3] if prev else 0) + row.count)
    return {k: list(v.values()) for k, v in seats.items()}


def measure(rows, store, profile, device_info, on_seat=None, budget_s: float | None = None,
            rep_ms: float = 40.0) -> BaselineReport:
    """Time every certified seat the rows use against torch, and record a baseline per seat
    against its current certificate; a seat with no current certificate in the database,
    or a stale one, is not timed and says why. `on_seat(index, total, label)` before each."""
    import torch

    from nbx_tune.kernels.spec import label_of
    from nbx_tune.kernels.runtime.validity import config_index, declared_config
    from nbx_tune.tuner.certify.provenance import FIELDS, stale_reason
    from nbx_tune.tuner.store.models import utcnow

    device = "cpu" if device_info.target == "interpreter" else "cuda"
    report = BaselineReport(device_info.name, torch.__version__, method(device))
    t0 = time.perf_counter()
    current = store.current_certificates(profile.name)
    seats = plan(rows, profile)
    for n, (key, members) in enumerate(sorted(seats.items(), key=lambda kv: -sum(m[3] for m in kv[1]))):
        label = label_of(*key)
        sb = SeatBaseline(label, key[0])
        report.seats.append(sb)
        if on_seat:
            on_seat(n, len(seats), label)
        if budget_s is not None and time.perf_counter() - t0 > budget_s:
            sb.why = "not timed: the budget was spent"
            report.untimed += 1
            continue
        found = current.get(key)
        if found is None:
            sb.why = "no certificate in the database (`nbx-tune census`, or `nbx-tune import` a table that has it)"
            continue
        sb.seat_id, cert, tuning = found
        spec = members[0][1]
        stale = stale_reason({k: getattr(tuning, k) for k in FIELDS}, spec, profile)
        if stale:
            sb.why = f"its certificate is stale here: {stale}"
            continue
        sb.config = cert.config
        config = declared_config(config_index(spec), cert.config)
        total = {"nbx": 0.0, "torch": 0.0}
        try:
            for row, spec_, problem, count in members:
                fns = {"nbx": spec_call(spec_, problem, config, device), "torch": torch_call(row, device)[0]}
                t = graph_times(fns, rep_ms, device=device)
                sb.rows.append({"row": row_text(row), "count": count, "nbx_ms": t["nbx"], "torch_ms": t["torch"]})
                for side in total:
                    total[side] += count * t[side]
        except Exception as e:  # a side that cannot run this row: the seat gets no baseline
            sb.why = f"could not be timed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
            sb.rows = []
            continue
        sb.nbx_ms, sb.torch_ms = total["nbx"] / sb.launches, total["torch"] / sb.launches
        got = store.add_baseline(sb.seat_id, cert.config, {
            "device_name": report.device_name, "torch_version": report.torch_version, "nbx_ms": sb.nbx_ms,
            "torch_ms": sb.torch_ms, "method": report.method, "rows": json.dumps(sb.rows, sort_keys=True),
            "measured_at": utcnow()})
        sb.recorded = got is not None
        if not sb.recorded:
            sb.why = "a newer certificate replaced the one timed"
    report.seconds = time.perf_counter() - t0
    return report
