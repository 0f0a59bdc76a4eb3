"""One-off: carry certificates made on a Python whose `ast.dump` differs from this one's.

The first syntax-tree hash used `ast.dump`, whose text differs between Python versions
(3.12 writes an empty `type_params` that 3.11 has no field for), so a table certified on the
H200 (Python 3.12) read as stale on a 3.11 host. kernels/spec.code_hash now writes the tree
in a form that is the same on every Python. An entry is re-keyed only where its stored hash
equals the old `ast.dump` hash of the code as it is now, computed by the Python it was made
on, so the certificate was made under exactly this code. Run from the repo root:

    TRITON_INTERPRET=1 PYTHONPATH=<dir holding a link nbx_tune -> repo> \
        python lab/ast_source_hash/rekey_across_pythons.py PYTHON3.12 kernels/tables/*.json
"""

import inspect
import json
import subprocess
import sys

from nbx_tune.kernels import spec
from nbx_tune.kernels.runtime import registry, table_format

# The old rule: the docstrings dropped as code_hash drops them, then `ast.dump`'s text.
OLD_RULE = "import ast, hashlib, json, sys\n" + inspect.getsource(spec.without_docstrings) + r'''
out = {}
for kernel, sources in json.load(sys.stdin).items():
    h = hashlib.sha256()
    for src in sources:
        tree = without_docstrings(ast.parse(src))
        h.update(ast.dump(tree, annotate_fields=False, include_attributes=False).encode())
    out[kernel] = h.hexdigest()[:16]
json.dump(out, sys.stdout)
'''

python, paths = sys.argv[1], sys.argv[2:]
specs = registry.all_specs()
sources = {k: [spec.part_source(p) for p in s.source_parts()] for k, s in specs.items()}
old = json.loads(subprocess.run([python, "-c", OLD_RULE], input=json.dumps(sources), text=True,
                                capture_output=True, check=True).stdout)
for path in paths:
    doc = json.load(open(path))
    moved = kept = 0
    for e in doc["entries"]:
        prov = e["provenance"]
        if e["kernel"] in specs and prov["kernel_source_hash"] == old[e["kernel"]]:
            prov["kernel_source_hash"] = specs[e["kernel"]].source_hash
            moved += 1
        else:
            kept += 1
    with open(path, "w") as f:
        f.write(table_format.dumps(doc["profile"], doc["architecture"], doc["profile_hash"], doc["entries"]))
    print(f"{path}: {moved} entries re-keyed to the code hash, {kept} left as they were")
