"""`nbx-tune run -- python my_model.py`: a whole program with its aten ops on the certified
kernels (`nbx_tune.serve()` around all of it), and what was served printed at exit.

`run_command` starts the program in a child process under the interpreter it names, as
`nbx-tune trace` does (`python [options] -m nbx_tune.tuner.trace.serve_main [--stats-json F] --
SCRIPT ARGS...`); the child runs it as `__main__` inside serve(), and prints the per-op
stats to stderr when it ends, however it ends. The exit status is the program's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from nbx_tune.errors import NbxError

USAGE = "nbx-tune run [--stats-json FILE] -- python SCRIPT.py ARGS... (or python -m MODULE ARGS...)"


def run_command(argv: list[str], stats_json: Path | None = None) -> int:
    """Run `python SCRIPT ARGS...` under serve(); return its exit status."""
    from nbx_tune.tuner.trace.recorder import _program

    try:
        prog = _program(list(argv))
    except NbxError as e:  # the recorder's parser speaks of `trace`: this is `run`
        raise type(e)(str(e).replace("trace:", "run:", 1).replace(
            "nbx-tune trace -o trace.tsv --", "nbx-tune run --")) from None
    extra = ["--stats-json", str(stats_json)] if stats_json else []
    cmd = [prog.python, *prog.options, "-m", "nbx_tune.tuner.trace.serve_main", *extra, "--",
           *prog.target, *prog.args]
    return subprocess.run(cmd).returncode


def main(argv: list[str] | None = None) -> None:
    from nbx_tune.kernels.serving import serve as serving
    from nbx_tune.tuner.trace.recorder_main import _run

    argv = sys.argv[1:] if argv is None else argv
    stats_json = None
    if argv[:1] == ["--stats-json"] and len(argv) > 1:
        stats_json, argv = Path(argv[1]), argv[2:]
    if argv[:1] != ["--"] or len(argv) < 2:
        raise SystemExit(f"usage: {USAGE}")
    try:
        with serving.serve():
            _run(argv[1:])
    finally:
        data = serving.stats()
        print(f"\nnbx-tune run: launches per op ({serving.dispatch_key()}):", file=sys.stderr)
        print(serving.format_stats(data), file=sys.stderr)
        print("(ops no kernel covers run on torch unseen: `nbx-tune trace` and `census --dry-run` "
              "list them)", file=sys.stderr)
        if stats_json is not None:
            stats_json.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
