"""`nbx-tune run -- python my_model.py`: a whole program with its aten ops on the certified
kernels (`nbx_tune.serve()` around all of it), and what was served printed at exit.

`run_command` starts the program in a child process under the interpreter it names, as
`nbx-tune trace` does (`python [options] -m nbx_tune.tuner.trace.serve_main [--stats-json F] --
SCRIPT ARGS...`); the child runs it as `__main__` inside serve(), and prints the per-op
stats to stderr when it ends, however it ends. The exit status is the program's; a program
killed by a signal exits 128 + the signal, as a shell says it (139 for SIGSEGV, 137 for
SIGKILL), and the parent prints the stats of the child's last snapshot (written every
SNAPSHOT_S: a signal leaves the child no time to write them) and what happened.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from nbx_tune.errors import NbxError

SNAPSHOT_S = 0.5  # how often the child writes the stats it has so far
USAGE = "nbx-tune run [--stats-json FILE] -- python SCRIPT.py ARGS... (or python -m MODULE ARGS...)"


def run_command(argv: list[str], stats_json: Path | None = None) -> int:
    """Run `python SCRIPT ARGS...` under serve(); return its exit status."""
    from nbx_tune.tuner.trace.recorder import _program

    try:
        prog = _program(list(argv))
    except NbxError as e:  # the recorder's parser speaks of `trace`: this is `run`
        raise type(e)(str(e).replace("trace:", "run:", 1).replace(
            "nbx-tune trace -o trace.tsv --", "nbx-tune run --")) from None
    with tempfile.TemporaryDirectory() as d:
        path = Path(stats_json) if stats_json else Path(d) / "stats.json"
        cmd = [prog.python, *prog.options, "-m", "nbx_tune.tuner.trace.serve_main", "--stats-json", str(path),
               "--", *prog.target, *prog.args]
        rc = subprocess.run(cmd).returncode
        return rc if rc >= 0 else killed_by(-rc, path)


def killed_by(sig: int, snapshot: Path) -> int:
    """Say that the program was killed by signal `sig`, print the stats of its last snapshot,
    and return the shell's status for it (128 + the signal)."""
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    why = {"SIGSEGV": "a segmentation fault (a crash in native code, a GPU fault)",
           "SIGKILL": "killed from outside (the out-of-memory killer? kill -9?)",
           "SIGABRT": "aborted (a failed assertion in native code)"}.get(name, "killed by a signal")
    try:
        data = json.loads(snapshot.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = None
    print(f"\nnbx-tune run: the program died of {name} (signal {sig}): {why}; exit status {128 + sig}, "
          "as a shell gives", file=sys.stderr)
    if data is None:
        print("nbx-tune run: it died before its first stats snapshot", file=sys.stderr)
    else:
        from nbx_tune.kernels.serving.serve import format_stats

        print(f"nbx-tune run: launches per op so far (its last snapshot, at most {SNAPSHOT_S} s old):",
              file=sys.stderr)
        print(format_stats(data), file=sys.stderr)
    return 128 + sig


def _write_json(path: Path, data) -> None:
    """Whole or not at all: a reader (the parent, after a signal) never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _snapshots(serving, path: Path, stop: threading.Event) -> None:
    while not stop.wait(SNAPSHOT_S):
        try:
            _write_json(path, serving.stats())
        except OSError:
            return


def main(argv: list[str] | None = None) -> None:
    from nbx_tune.profiles import use_interpreter_without_gpu

    argv = sys.argv[1:] if argv is None else argv
    stats_json = None
    if argv[:1] == ["--stats-json"] and len(argv) > 1:
        stats_json, argv = Path(argv[1]), argv[2:]
    if argv[:1] != ["--"] or len(argv) < 2:
        raise SystemExit(f"usage: {USAGE}")
    # Before serving imports anything of triton: the rule of every entry point.
    use_interpreter_without_gpu(lambda m: print(f"nbx-tune run: {m}", file=sys.stderr))
    from nbx_tune.kernels.serving import serve as serving
    from nbx_tune.tuner.trace.recorder_main import _run

    stop = threading.Event()
    snap = threading.Thread(target=_snapshots, args=(serving, stats_json, stop), daemon=True)
    if stats_json is not None:
        snap.start()
    try:
        with serving.serve():
            _run(argv[1:])
    finally:
        stop.set()
        if snap.is_alive():
            snap.join()
        data = serving.stats()
        print(f"\nnbx-tune run: launches per op ({serving.dispatch_key()}):", file=sys.stderr)
        print(serving.format_stats(data), file=sys.stderr)
        print("(ops no kernel covers run on torch unseen: `nbx-tune trace` and `census --dry-run` "
              "list them)", file=sys.stderr)
        if stats_json is not None:
            _write_json(stats_json, data)


if __name__ == "__main__":
    main()
