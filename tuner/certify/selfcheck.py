"""Kernel self-check: every example row of a kernel against its fp64 oracle, through the
same screen the tuner uses (two launches that must agree bit for bit), under several configs. The tests run it on the interpreter;
proofs/gpu_check.py runs it on a GPU, where bfloat16 is proven."""

from __future__ import annotations

from dataclasses import dataclass

from nbx_tune.kernels.spec import Config, KernelSpec, NotServable
from nbx_tune.tuner.certify import screen as screening
from nbx_tune.tuner.certify.tune import static_prune


@dataclass
class Check:
    op: str
    shapes: tuple
    dtype: str
    config: Config
    err: float | None
    rtol: float
    reason: str | None  # None: passed
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.reason is None


def configs_to_check(spec: KernelSpec, profile, problem, limit: int) -> list[Config]:
    """The default config plus an even spread of the configs this profile would launch."""
    keep, _ = static_prune(spec, profile, problem)
    picked = [spec.default_config(profile, problem)]
    if keep and limit > 1:
        step = max(1, len(keep) // (limit - 1))
        picked += [c for c in keep[::step] if c not in picked][: limit - 1]
    return picked


def check_row(spec: KernelSpec, profile, device: str, row, configs_per_row: int = 3) -> list[Check]:
    """One example row against its oracle under a spread of configs (none if the profile
    cannot screen its dtype). The oracle is computed once for all the configs."""
    problem = spec.problem_from_row(row)
    if isinstance(problem, NotServable):
        raise AssertionError(f"{spec.name}: example row {row.op} {row.shapes} not servable: {problem.reason}")
    if any(dt in profile.screen_unsupported for dt in problem.dtypes):
        return []
    dtype = problem.dtypes[0]
    rtol = screening.output_rtols(spec, problem, profile)
    case = screening.make_case(spec, problem, device, screening.seed_for("selfcheck", problem), True)
    out = []
    for config in configs_to_check(spec, profile, problem, configs_per_row):
        try:
            r = screening.screen(spec, config, case, rtol, device, repeat=True,
                                 variation_allowed=spec.run_to_run_variation)
            out.append(Check(row.op, row.shapes, dtype, config, r.err, r.rtol, r.reason, r.detail))
        except Exception as e:  # a failure to launch is a failed check, with its text
            out.append(Check(row.op, row.shapes, dtype, config, None, min(rtol.values()), "launch_error",
                             f"{type(e).__name__}: {e}"))
    return out


def check_kernel(spec: KernelSpec, profile, device: str, scale: str = "small",
                 configs_per_row: int = 3, deadline: float | None = None) -> list[Check]:
    """deadline (time.monotonic()): rows not started by then are left out, so a caller
    with a time budget reports partial coverage rather than none."""
    import time

    out = []
    for row in spec.example_rows(scale):
        if deadline is not None and time.monotonic() > deadline:
            break
        out += check_row(spec, profile, device, row, configs_per_row)
    return out
