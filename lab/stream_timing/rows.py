"""The rows of the example traces whose kernel is timed as a stream (kernels/spec.py
`timing`): what a census must re-tune after the timing change, and nothing else;
`--kernel NAME`: only that kernel's rows (lab/gemm_replay_timing: matmul's).

    python lab/stream_timing/rows.py [--kernel NAME] OUT.tsv examples/traces/*_bf16*.tsv
"""

import sys


from nbx_tune.bench.torch_compare import served  # noqa: E402

from nbx_tune.kernels.trace import read_trace, write_trace  # noqa: E402


def main(out: str, traces: list[str], kernel: str | None = None) -> None:
    rows = []
    for t in traces:
        for r in read_trace(t).rows:
            s = served(r)
            if s is not None and s[0].timing == "stream" and kernel in (None, s[0].name):
                rows.append(r)
    what = f"the {kernel} rows" if kernel else "rows timed as a stream"
    write_trace(out, rows, comments=[f"{what}, of {len(traces)} traces"])
    print(f"{len(rows)} rows -> {out}")


if __name__ == "__main__":
    args = sys.argv[1:]
    name = None
    if args[:1] == ["--kernel"]:
        name, args = args[1], args[2:]
    main(args[0], args[1:], name)
