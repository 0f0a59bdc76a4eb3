"""Every element-wise / copy / cat row of a bench/torch_compare.py JSON log: ratio, bytes
moved per call and achieved GB/s on each side, sorted by element count.

    python lab/elementwise_rows/rows_from_log.py lab/history/gpu_runs/2026-12-04h/5-torch_compare.json
"""

import glob
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
from nbx_tune.bench.torch_compare import row_text, served  # noqa: E402

from nbx_tune.kernels.trace import read_trace  # noqa: E402

FAMILIES = ("elementwise_unary", "elementwise_binary", "copy", "cat")


def main(path: str, min_elements: int = 100_000) -> None:
    rows = {row_text(r): r for p in glob.glob(str(ROOT / "examples/traces/*.tsv")) for r in read_trace(p).rows}
    out = []
    for trace, t in json.loads(Path(path).read_text())["traces"].items():
        for r in t["rows"]:
            row = rows.get(r["row"])
            if r.get("kernel") not in FAMILIES or row is None or "nbx" not in r:
                continue
            spec, problem = served(row)
            b = spec.operand_bytes(problem)
            nb, tg = r["nbx"]["graph"], r["torch"]["graph"]
            out.append((problem.dims[0], tg / nb, trace[:22], r["row"][:64], b / 1e6, b / nb / 1e6, b / tg / 1e6,
                        r["config"].replace(",num_stages=1", "")))
    for n, ratio, trace, text, mb, gn, gt, cfg in sorted(out):
        if n >= min_elements:
            print(f"{ratio:.2f} {trace:22s} {text:64s} n={n:9d} {mb:6.1f} MB  nbx {gn:5.0f}  torch {gt:5.0f} GB/s  {cfg}")


if __name__ == "__main__":
    main(*sys.argv[1:2])
