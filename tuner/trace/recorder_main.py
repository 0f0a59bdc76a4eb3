"""Child-process entry of `trace_command`: run one Python program under the recorder.

    python -m nbx_tune.tuner.trace.recorder_main --out ROWS --status STATUS -- \\
        (SCRIPT | -m MODULE | -c CODE) ARGS...

The program runs as `python SCRIPT ARGS...` would run it: as `__main__`, with its own
`sys.argv` and `sys.path[0]`. STATUS is created empty once the recorder is running (so the
parent can tell "could not start" from "failed"); if the program raises, STATUS gets
`Type: message`, and the traceback (the program's frames only) goes to stderr with exit
status 1, as Python would. ROWS is written only when the program returns or calls
`sys.exit(0)`.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from pathlib import Path
from types import TracebackType

from nbx_tune.tuner.trace.recorder import Recorder

_MAX_MESSAGE = 300


def _parse(argv: list[str]) -> tuple[Path, Path, list[str]]:
    if len(argv) < 6 or argv[0] != "--out" or argv[2] != "--status" or argv[4] != "--":
        raise SystemExit("usage: python -m nbx_tune.tuner.trace.recorder_main --out ROWS --status "
                         "STATUS -- (SCRIPT | -m MODULE | -c CODE) ARGS...")
    return Path(argv[1]), Path(argv[3]), argv[5:]


def _run(program: list[str]) -> None:
    """Run the program as the interpreter would have run it."""
    if program[0] == "-m":
        sys.argv = [program[1], *program[2:]]  # run_module puts the module's file in argv[0]
        runpy.run_module(program[1], run_name="__main__", alter_sys=True)
    elif program[0] == "-c":
        sys.argv = ["-c", *program[2:]]
        sys.path[0] = ""
        exec(compile(program[1], "<string>", "exec"), {"__name__": "__main__"})
    else:
        sys.argv = list(program)
        sys.path[0] = os.path.dirname(os.path.abspath(program[0]))
        runpy.run_path(program[0], run_name="__main__")


def _one_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    message = lines[0] if lines else ""
    if len(message) > _MAX_MESSAGE:
        message = message[:_MAX_MESSAGE] + "..."
    return f"{type(e).__name__}: {message}" if message else type(e).__name__


def _program_frames(tb: TracebackType | None) -> TracebackType | None:
    """The traceback from the program's first frame on, without this runner's and runpy's."""
    runner = {__file__, runpy.__file__, "<frozen runpy>"}
    while tb is not None and tb.tb_frame.f_code.co_filename in runner:
        tb = tb.tb_next
    return tb


def main(argv: list[str] | None = None) -> None:
    rows, status, program = _parse(sys.argv[1:] if argv is None else argv)
    status.write_text("", encoding="utf-8")
    rec = Recorder()
    try:
        with rec:
            _run(program)
    except SystemExit as e:
        if e.code not in (None, 0):
            raise
    except BaseException as e:
        status.write_text(_one_line(e), encoding="utf-8")
        if not isinstance(e, Exception):  # KeyboardInterrupt and the like end as usual
            raise
        traceback.print_exception(type(e), e, _program_frames(e.__traceback__))
        sys.exit(1)
    rec.write(rows)


if __name__ == "__main__":
    main()
