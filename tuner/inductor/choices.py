"""Certify Inductor's max-autotune GEMM choices for a trace's GEMM seats (on a GPU).

For each distinct GEMM of the trace (op, dtype, dims, layout): compile it alone under
max-autotune with a recording choice handler that lists Inductor's own Triton template
configs for it (and compiles only the first, timing nothing); then each listed config alone
through the lookup table: its output screened against the fp64 oracle at the profile's
tolerance for the dtype, the survivors timed (`gpu_time`, the tuner's timer) beside aten's
kernel. The fastest survivor becomes the entry (kernels/serving/inductor_table.py); every
refusal is kept with its reason, as the census keeps a seat's.

    python -m nbx_tune.bench.inductor_choices --trace T.tsv -o choices.json   # the command

What the CPU can test is the part without Inductor's GPU templates: the problems of a trace
(`gemm_problems`), the judgement (`judge`) and the entry (`entry`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone

import numpy as np

from nbx_tune.kernels.runtime.registry import spec_for_op
from nbx_tune.kernels.trace import read_trace

GEMM_OPS = ("aten.mm", "aten.addmm", "aten.bmm")


@dataclass(frozen=True)
class Gemm:
    op: str  # mm, addmm, bmm: Inductor's op name in its lookup key
    dtype: str
    dims: tuple  # (B, M, N, K)
    layout: str  # nn, nt, tn, tt: which operands are stored transposed


def gemm_problems(path) -> list[Gemm]:
    """The distinct GEMMs of a trace, most launched first."""
    found: dict[Gemm, int] = {}
    for row in read_trace(path).rows:
        if row.base_op not in GEMM_OPS:
            continue
        problem = spec_for_op(row.op).problem_from_row(row)
        if not hasattr(problem, "dims"):  # not servable: no seat to choose for
            continue
        g = Gemm(row.base_op.split(".")[1], problem.dtypes[0], tuple(problem.dims), problem.get("layout", "nn"))
        found[g] = found.get(g, 0) + row.count
    return sorted(found, key=lambda g: -found[g])


def operands(g: Gemm, device, seed: int = 0):
    """Seeded inputs of `g` as a model stores them (a `t` operand is a transposed view)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    B, M, N, K = g.dims
    dt = getattr(torch, g.dtype)

    def make(rows, cols, transposed):
        shape = (cols, rows) if transposed else (rows, cols)
        t = torch.randn(*((B,) if g.op == "bmm" else ()), *shape, generator=gen).to(device, dt)
        return t.transpose(-1, -2) if transposed else t

    a, b = make(M, K, g.layout[0] == "t"), make(K, N, g.layout[1] == "t")
    if g.op == "addmm":
        return (torch.randn(N, generator=gen).to(device, dt), a, b)
    return (a, b)


def oracle(g: Gemm, args) -> np.ndarray:
    from nbx_tune.oracles import matmul as ref

    host = [np.asarray(t.detach().double().cpu().numpy()) for t in args]
    return ref.addmm(*host) if g.op == "addmm" else (ref.bmm if g.op == "bmm" else ref.mm)(*host)


def judge(out: np.ndarray, ref: np.ndarray, rtol: float) -> tuple[float, str | None]:
    """(the relative error, the refusal reason or None): the screen's rule, max|out - ref| / max|ref|."""
    if not np.all(np.isfinite(out)):
        return float("inf"), "non-finite output"
    scale = float(np.max(np.abs(ref))) or 1.0
    err = float(np.max(np.abs(out - ref))) / scale
    return err, (f"inaccurate: error {err:.3g} > {rtol:.3g}" if err > rtol else None)


@dataclass
class Measured:
    config: dict
    err: float = float("nan")
    ms: float | None = None
    refusal: str | None = None


@dataclass
class Choice:
    gemm: Gemm
    key: str  # Inductor's device-agnostic lookup key
    measured: list = field(default_factory=list)  # [Measured]
    aten_ms: float | None = None


def record(choice: Choice, provenance: dict) -> dict:
    """The certification as the database keeps it (tuner/store/inductor.py): the table entry of
    the fastest config that passed the screen, `config` None where none did; every refusal kept."""
    ok = sorted((m for m in choice.measured if m.refusal is None and m.ms is not None), key=lambda m: m.ms)
    win = ok[0] if ok else None
    g = choice.gemm
    return {"key": choice.key, "op": g.op, "config": dict(win.config) if win else None,
            "gemm": {"dtype": g.dtype, "dims": list(g.dims), "layout": g.layout},
            "provenance": {**provenance, "max_rel_err": win.err if win else None, "ms": win.ms if win else None,
                           "aten_ms": choice.aten_ms, "runner_up_ms": ok[1].ms if len(ok) > 1 else None,
                           "candidates": len(choice.measured),
                           "refusals": [{"config": m.config, "reason": m.refusal}
                                        for m in choice.measured if m.refusal is not None],
                           "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}}


def entry(choice: Choice, provenance: dict) -> dict | None:
    """The table entry of the fastest config that passed the screen, or None where none did."""
    r = record(choice, provenance)
    return r if r["config"] is not None else None


# ----------------------------------------------------------------------------- on the GPU


def _fn(g: Gemm):
    import torch

    return {"mm": torch.mm, "bmm": torch.bmm, "addmm": torch.addmm}[g.op]


def _plain(params: dict) -> dict:
    """A template's parameters as JSON keeps them (derived options Inductor recomputes are dropped)."""
    return {k: v for k, v in params.items() if isinstance(v, (bool, int, float, str))}


def enumerate_configs(g: Gemm, args) -> tuple[str | None, list[dict]]:
    """(Inductor's lookup key for `g`, its Triton template configs), by one compile under
    max-autotune with a handler that records the choices and keeps only the first."""
    import torch
    import torch._inductor.config as ic
    from torch._inductor.choices import InductorChoices
    from torch._inductor.lookup_table import LookupTableChoices
    from torch._inductor.virtualized import V

    seen: dict = {"key": None, "configs": []}

    class Recording(InductorChoices):
        def _finalize_template_configs(self, template_choices, kernel_inputs, templates, op_name, kwarg_overrides=None):
            got = super()._finalize_template_configs(template_choices, kernel_inputs, templates, op_name,
                                                     kwarg_overrides)
            if op_name == g.op and seen["key"] is None:
                seen["key"] = "+".join([LookupTableChoices._generate_kernel_inputs_key(kernel_inputs), op_name])
                for ktc in got:
                    uid = getattr(ktc.template, "uid", "")
                    if uid.startswith("triton::"):
                        seen["configs"].append({"template_id": uid, **_plain(ktc.params.to_kwargs()),
                                                "template_hash": getattr(ktc.template, "src_hash", None)})
            # one choice, so nothing is timed: aten's where there is one (no template compiles)
            return [k for k in got if not getattr(k.template, "uid", "").startswith("triton::")][:1] or got[:1]

    torch._dynamo.reset()
    V.set_choices_handler(Recording())
    try:
        with ic.patch(max_autotune=True, max_autotune_gemm_backends="ATEN,TRITON", fx_graph_cache=False):
            torch.compile(_fn(g), dynamic=False)(*args)
    finally:
        V.set_choices_handler(InductorChoices())
    for c in seen["configs"]:
        if c.get("template_hash") is None:
            c.pop("template_hash", None)
    return seen["key"], seen["configs"]


def certify(g: Gemm, rtol: float, warmup_ms: float = 25, rep_ms: float = 100) -> Choice | None:
    """Screen and time each of Inductor's configs for `g` alone (compiled through the lookup table)."""
    import torch
    import torch._inductor.config as ic

    from nbx_tune.kernels.serving import inductor_table
    from nbx_tune.tuner.timing.benchmarkers import gpu_time

    args = operands(g, "cuda")
    key, configs = enumerate_configs(g, args)
    if key is None:
        return None
    ref = oracle(g, args)
    choice = Choice(g, key)
    fn = _fn(g)
    choice.aten_ms = gpu_time(lambda: fn(*args), warmup_ms, rep_ms)[0]
    for cfg in configs:
        m = Measured(cfg)
        choice.measured.append(m)
        torch._dynamo.reset()
        try:
            with inductor_table.choices({key: [cfg]}), \
                    ic.patch(max_autotune=True, max_autotune_gemm_backends="TRITON", fx_graph_cache=False):
                compiled = torch.compile(fn, dynamic=False)
                out = compiled(*args)
                torch.cuda.synchronize()
        except Exception as e:  # a config Inductor cannot compile or launch: refused, never fatal
            m.refusal = f"compile or launch: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
            continue
        m.err, m.refusal = judge(out.double().cpu().numpy(), ref, rtol)
        if m.refusal is None:
            m.ms = gpu_time(lambda: compiled(*args), warmup_ms, rep_ms)[0]
    return choice


@dataclass
class Certified:
    """One GEMM of a run: what the store recorded (None where nothing was), or why not."""

    gemm: Gemm
    record: dict | None = None
    written: object = None  # tuner.store.inductor.Written
    error: str | None = None
    seconds: float = 0.0


def certify_traces(traces, store, profile, device, limit: int = 0, budget_s: float | None = None,
                   on_gemm=None) -> list[Certified]:
    """Certify the traces' GEMMs (most launched first, at most `limit`; none started past
    `budget_s`) on this GPU, each written through the store as it finishes, with its refusals:
    a run stopped midway keeps what it finished. `on_gemm(Certified)` after each."""
    import time

    import torch
    import triton

    from nbx_tune.tuner.store import inductor as db

    gemms = list(dict.fromkeys(g for t in traces for g in gemm_problems(t)))  # a bad trace fails first
    if limit:
        gemms = gemms[:limit]
    prov = {"torch_version": torch.__version__, "triton_version": triton.__version__,
            "device_name": device.name, "driver": device.driver}
    out, t0 = [], time.monotonic()
    for g in gemms:
        c = Certified(g)
        if budget_s is not None and time.monotonic() - t0 > budget_s:
            c.error = "not started: past the budget"
        else:
            t1 = time.monotonic()
            try:
                choice = certify(g, profile.screen_rtol[g.dtype])
            except Exception as e:  # Inductor's API moved, a GEMM it cannot compile: a row, not a crash
                choice, c.error = None, f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
            if choice is None and c.error is None:
                c.error = "Inductor made no template choice for it"
            if choice is not None:
                c.record = record(choice, prov)
                c.written = db.write(store, profile.name, [c.record], where=f"certification of {g}")[0]
            c.seconds = time.monotonic() - t1
        out.append(c)
        if on_gemm is not None:
            on_gemm(c)
    return out
