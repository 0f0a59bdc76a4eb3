"""The GEMM rows (kernel matmul) of the example traces: what a census re-tunes after
matmul's timing became a stream, and nothing else.

    python lab/gemm_replay_timing/rows.py OUT.tsv examples/traces/*_bf16*.tsv
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from torch_compare import served  # noqa: E402

from nbx_tune.tuner.trace import read_trace, write_trace  # noqa: E402


def main(out: str, traces: list[str]) -> None:
    rows = []
    for t in traces:
        for r in read_trace(t).rows:
            s = served(r)
            if s is not None and s[0].name == "matmul":
                rows.append(r)
    write_trace(out, rows, comments=[f"the matmul rows of {len(traces)} traces"])
    print(f"{len(rows)} rows -> {out}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
