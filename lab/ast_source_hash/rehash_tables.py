"""One-off: carry shipped certificates across the change of the kernel source hash from the
source text to its syntax tree (kernels/spec.code_hash).

An entry is re-keyed only where its stored hash equals the *text* hash of the code as it is
now, so the certificate was made under exactly this code; the new hash names the same code.
Anything else is left as it is (stale, to be re-certified). Run from the repo root:

    TRITON_INTERPRET=1 PYTHONPATH=<dir holding a link nbx_tune -> repo> \
        python lab/ast_source_hash/rehash_tables.py kernels/tables/*.json
"""

import hashlib
import inspect
import json
import sys

from nbx_tune.kernels import registry, table_format


def text_hash(spec) -> str:  # the rule before code_hash, reproduced to recognize old entries
    h = hashlib.sha256()
    for part in spec.source_parts():
        h.update(inspect.getsource(getattr(part, "fn", part)).encode())
    return h.hexdigest()[:16]


for path in sys.argv[1:]:
    doc = json.load(open(path))
    specs = registry.all_specs()
    moved = kept = 0
    for e in doc["entries"]:
        spec = specs.get(e["kernel"])
        prov = e["provenance"]
        if spec is not None and prov["kernel_source_hash"] == text_hash(spec):
            prov["kernel_source_hash"] = spec.source_hash
            moved += 1
        else:
            kept += 1
    with open(path, "w") as f:
        f.write(table_format.dumps(doc["profile"], doc["architecture"], doc["profile_hash"], doc["entries"]))
    print(f"{path}: {moved} entries re-keyed to the code hash, {kept} left as they were")
