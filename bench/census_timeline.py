"""Run `nbx-tune census ...` with a timeline on stderr: when each phase of the census
starts and ends, in seconds since the process was launched (NBX_TUNE_LAUNCHED_AT, the
launcher's time.time(); else since this script started). bench/tuning_cost.py --profile
uses it to show where a census's wall time goes, start-up and shut-down included, which a
cProfile of a multi-process census attributes badly.

    NBX_TUNE_LAUNCHED_AT=$(date +%s.%N) python bench/census_timeline.py census --model T --json
"""

from __future__ import annotations

import functools
import os
import sys
import time

T0 = float(os.environ.get("NBX_TUNE_LAUNCHED_AT") or time.time())


def mark(what: str) -> None:
    print(f"[timeline] {time.time() - T0:6.2f} s  {what}", file=sys.stderr, flush=True)


def wrap(owner, name: str, label: str | None = None) -> None:
    fn = getattr(owner, name)

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        mark(f"{label or name} starts")
        try:
            return fn(*args, **kwargs)
        finally:
            mark(f"{label or name} ends")

    setattr(owner, name, timed)


def wrap_heavy() -> None:
    """The phases in modules that import torch and Triton: wrapped once the census has
    looked for the GPU (importing them earlier would decide the interpreter question)."""
    from nbx_tune.tuner.census import census
    from nbx_tune.tuner.fleet import seat_tuner as runner
    from nbx_tune.tuner import store

    wrap(census, "load_plan")
    wrap(store.Store, "__init__", "Store (database, migrations)")
    wrap(store.Store, "record_census")
    wrap(runner.SeatTuner, "run", "tuning all seats")
    wrap(store.Store, "close", "Store close")


def main() -> None:
    mark("python is up")
    from nbx_tune.cli import app as cli

    mark("CLI imported")
    from nbx_tune.tuner import commands as api
    from nbx_tune.tuner.execution import isolation, precompile  # none of them imports torch

    wrap(api, "_early_executor", "worker and compile pool start")
    wrap(api, "ensure_device", "ensure_device (imports torch)")
    found = api.ensure_device

    def ensure_then_wrap(*args, **kwargs):
        out = found(*args, **kwargs)
        wrap_heavy()
        return out

    api.ensure_device = ensure_then_wrap
    wrap(api, "load_plugins")
    wrap(api, "resolve_profile")
    wrap(api, "make_tuner")
    wrap(isolation.Isolated, "start_seat", "start_seat (inputs and oracles in the worker)")
    wrap(isolation.Isolated, "close", "executor close")
    wrap(precompile.Precompiler, "join", "compile pool join")
    import atexit

    # Registered first, run last: the exit handlers are done; then `nbx-tune`'s own exit
    # (cli.main: os._exit, no module teardown).
    atexit.register(mark, "exit handlers done")
    app = cli.app

    def returning(*args, **kwargs):
        try:
            return app(*args, **kwargs)
        finally:
            mark("CLI returned")

    cli.app = returning
    sys.argv = ["nbx-tune", *sys.argv[1:]]
    cli.main()


if __name__ == "__main__":
    main()
