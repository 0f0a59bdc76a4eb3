"""What the launch-time read serves on this device: the shipped and named tables' entries,
and the ones it refuses as stale (another compile target, Triton, kernel source...) or as
configs outside a kernel's declared space. Then the same table doctored two ways, side by
side: its entries moved to another compile target (never served) and to a sibling device
of this target (served).

    python3 bench/served_tables.py          # writes $OUT/served_tables.json (or bench_out/)
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from pathlib import Path


from nbx_tune.testing.bench import environment, out_dir  # noqa: E402


def served(paths) -> tuple[int, Counter]:
    from nbx_tune.kernels.runtime import certified

    os.environ["NBX_TUNE_TABLE"] = os.pathsep.join(str(p) for p in paths)
    certified.reload()
    st = certified.state()
    return len(st.entries), Counter(why.split(" (")[0] for _, _, why in st.stale)


def doctored(doc: dict, edit, where: Path) -> Path:
    from nbx_tune.kernels.runtime import table_format

    entries = [dict(e, provenance=dict(e["provenance"])) for e in doc["entries"]]
    for e in entries:
        edit(e["provenance"])
    where.write_text(table_format.dumps(doc["profile"], doc["architecture"], doc["profile_hash"], entries))
    return where


if __name__ == "__main__":
    from nbx_tune.tuner.commands import ensure_device

    ensure_device(print)
    from nbx_tune.kernels.runtime import certified, table_format
    from nbx_tune.profiles import current_profile, current_target

    profile, target = current_profile(), current_target()
    os.environ["NBX_TUNE_DB"] = f"sqlite:///{tempfile.gettempdir()}/nbx-served-tables-absent.db"
    shipped = certified.TABLE_DIR / f"{profile.name}.json"
    rows = []
    if shipped.exists():
        doc = table_format.read(shipped)
        with tempfile.TemporaryDirectory() as tmp:
            other = "cuda:80" if target != "cuda:80" else "cuda:90"
            for name, path in (("shipped", shipped),
                               (f"moved to {other}", doctored(doc, lambda p: p.update(device_target=other),
                                                              Path(tmp) / "other.json")),
                               ("sibling device, same target", doctored(
                                   doc, lambda p: p.update(device_name="a sibling GPU", driver="0"),
                                   Path(tmp) / "sibling.json"))):
                n, stale = served([path])
                rows.append({"table": name, "entries": len(doc["entries"]), "served": n, "stale": dict(stale)})
    res = {"env": environment(), "profile": profile.name, "device_target": target, "tables": rows}
    print(f"profile {profile.name}, device target {target}")
    print(f"{'table':<32}{'entries':>8}{'served':>8}  stale (why)")
    for r in rows:
        print(f"{r['table']:<32}{r['entries']:>8}{r['served']:>8}  {r['stale'] or '-'}")
    if not rows:
        print(f"no table ships for profile {profile.name}")
    (out_dir() / "served_tables.json").write_text(json.dumps(res, indent=1))
