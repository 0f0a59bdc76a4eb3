"""What serve() runs of tiny models of many transformers families (testing/model_zoo.py):
per family, the launches of one padded-batch forward served on a certified config, on a
default config (a seat no census certified), handed to torch by serve() (with why), and
the launches of ops no kernel is routed for (read from a trace of the same forward), with
the top ops that did not run on a kernel, and the logits' error against torch's.

    python3 bench/model_zoo_coverage.py                  # CPU interpreter (fp32), every family
    python3 bench/model_zoo_coverage.py --census         # first a census of the forwards' traces
    python3 bench/model_zoo_coverage.py --families llama,mistral --json
    python3 bench/model_zoo_coverage.py --dtype bfloat16 # a GPU: the model on cuda

--census records each family's forward, runs one census of all the traces (in this
process, into NBX_TUNE_DB, else a temporary database) and serves from what it certified:
then a `default` launch is a seat the census did not certify. Writes model_zoo_coverage.json
under $OUT (else bench_out/).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

if __name__ == "__main__":
    try:
        import torch as _t

        _gpu = _t.cuda.is_available()
    except ImportError:
        _gpu = False
    if not _gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import logging  # noqa: E402
from collections import Counter  # noqa: E402

import torch  # noqa: E402

from nbx_tune.testing import model_zoo  # noqa: E402
from nbx_tune.testing.bench import environment, save, table  # noqa: E402


def top_fallthrough(res: model_zoo.Result, k: int = 3) -> str:
    """The ops that most often ran on torch: served ops handed back (with the first reason)
    and ops no kernel is routed for."""
    ops = Counter()
    why = {}
    for op, reasons in res.fell_through().items():
        ops[op] += sum(reasons.values())
        why[op] = max(reasons, key=reasons.get)
    ops.update(res.unrouted)
    # aten._local_scalar_dense is a tensor's .item(): a read by the host, no kernel's to run
    return "; ".join(f"{op.removeprefix('aten.')} x{n} ({why[op].split(': ', 1)[-1][:28] if op in why else 'host read' if 'scalar_dense' in op else 'no route'})"
                     for op, n in ops.most_common(k))


def census_of(families, device: str, dtype) -> str:
    """Record each family's forward, census the traces in one go; the database's URL."""
    from nbx_tune.kernels.runtime import certified
    from nbx_tune.testing.bench import combined_trace
    from nbx_tune.tuner import commands as api

    work = tempfile.mkdtemp(prefix="zoo_")
    db = os.environ.get("NBX_TUNE_DB") or f"sqlite:///{work}/zoo.db"
    os.environ["NBX_TUNE_DB"] = db
    traces = []
    for f in families:
        try:
            model, kwargs = model_zoo.build(f, device=device, dtype=dtype)
        except Exception:  # said by the run that follows
            continue
        path = f"{work}/{f}.tsv"
        model_zoo.record(model, kwargs, path)
        traces.append(path)
    combined_trace(traces, f"{work}/all.tsv")
    api.census(f"{work}/all.tsv", db, isolate=False)
    certified.reload()
    return db


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default=",".join(model_zoo.FAMILIES), help="comma-separated (default: all)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    ap.add_argument("--census", action="store_true", help="census the forwards' traces first")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON too")
    args = ap.parse_args(argv)
    logging.getLogger("nbx_tune").setLevel(logging.ERROR)  # one warning per default seat otherwise
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, args.dtype)
    families = [f for f in args.families.split(",") if f]
    unknown = [f for f in families if f not in model_zoo.FAMILIES]
    if unknown:
        print(f"model_zoo_coverage: unknown families {', '.join(unknown)} (known: {', '.join(model_zoo.FAMILIES)})",
              file=sys.stderr)
        return 2
    db = census_of(families, device, dtype) if args.census else None
    results = [model_zoo.run(f, device=device, dtype=dtype) for f in families]
    env = environment()
    rows, data = [], []
    for r in results:
        t = r.totals()
        rows.append([r.family, t.get("certified", 0), t.get("default", 0), t.get("torch", 0), t.get("unrouted", 0),
                     f"{r.rel_err:.1e}", r.error[:60] or top_fallthrough(r)])
        data.append(r.to_dict())
    print(f"{env['date']} {env['gpu']} torch {env['torch']} Triton {env['triton']} {args.dtype} on {device}"
          f"{' (interpreter)' if os.environ.get('TRITON_INTERPRET') == '1' else ''}"
          f"{', after a census' if db else ', no census (every launch on a default config)'}")
    print(table(rows, ["family", "certified", "default", "torch", "no route", "logits err", "top on torch"]))
    tot = Counter()
    for r in results:
        tot.update(r.totals())
    print(f"total: {tot['certified']} certified, {tot['default']} default, {tot['torch']} handed to torch, "
          f"{tot['unrouted']} with no route")
    out = save("model_zoo_coverage.json", {"env": env, "dtype": args.dtype, "census": bool(db), "rows": data})
    if args.json:
        import json

        print(json.dumps(data, indent=1))
    print(f"wrote {out}")
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
