"""The kernel source hash names the code, not its text (kernels/spec.code_hash)."""

import textwrap

from nbx_tune.kernels.spec import code_hash


def _fn(src: str):
    ns: dict = {}
    exec(compile(textwrap.dedent(src), "<k>", "exec"), ns)
    f = ns["k"]
    f.__source__ = textwrap.dedent(src)
    return f


def _hash_of(src: str, monkeypatch) -> str:
    import inspect
    f = _fn(src)
    monkeypatch.setattr(inspect, "getsource", lambda obj: obj.__source__)
    return code_hash([f])


BASE = """
def k(x, BLOCK: int):
    '''Doubles x.'''
    y = x * 2  # the doubling
    return y + BLOCK
"""


def test_comments_docstrings_and_layout_do_not_count(monkeypatch):
    tidied = '''
def k(x,
      BLOCK: int):
    """Another docstring, longer,
    over two lines."""
    # why: a comment moved
    y = x*2
    return (y
            + BLOCK)
'''
    assert _hash_of(BASE, monkeypatch) == _hash_of(tidied, monkeypatch)


def test_any_change_to_the_code_counts(monkeypatch):
    base = _hash_of(BASE, monkeypatch)
    for changed in (BASE.replace("x * 2", "x * 3"), BASE.replace("y + BLOCK", "BLOCK + y"),
                    BASE.replace("BLOCK: int", "BLOCK: float"), BASE.replace("'''Doubles x.'''", "x = x")):
        assert _hash_of(changed, monkeypatch) != base


def test_shipped_kernels_hash_without_error():
    from nbx_tune.kernels.runtime import registry
    hashes = {name: spec.source_hash for name, spec in registry.all_specs().items()}
    assert all(len(h) == 16 for h in hashes.values())


def test_every_helper_a_kernels_hashed_code_calls_is_hashed_too():
    # A launcher's helper (a head dim's block, a stride layout) decides what is launched: left
    # out of the hash, a change to it would serve certificates made for other code.
    import ast
    import inspect
    import types

    from nbx_tune.kernels.runtime.registry import all_specs

    for name, spec in all_specs().items():
        fns = [getattr(p, "fn", p) for p in spec.source_parts()]
        hashed = set(fns)
        for f in fns:
            mod = inspect.getmodule(f)
            for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(f)))):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                    g = getattr(mod, node.func.id, None)
                    g = getattr(g, "fn", g)
                    if isinstance(g, types.FunctionType) and g.__module__ == mod.__name__:
                        assert g in hashed, f"{name}: {f.__name__} calls {g.__name__}, which is not a source part"
