"""Trace format v1: parsing, the errors that name file/line/column, and the writer."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nbx_tune.errors import TraceError
from nbx_tune.kernels.trace import HEADER, KNOWN_DTYPES, make_row, parse_trace_text, read_trace, write_trace

HEAD = "# nbx-tune trace v1\nop\tdtypes\tshapes\tparams\tcount\n"


def test_parses_rows_params_and_merges_duplicates():
    t = parse_trace_text(HEAD + "aten.mm\tbfloat16,bfloat16\t512x4096;4096x11008\t\t32\n"
                         "aten.convolution\tfloat32,float32\t8x3x224x224;64x3x7x7\tstride=2x2,padding=3x3,bias=None\t1\n"
                         "# a comment\n\n"
                         "aten.sum.dim_IntList\tfloat16\t()\tdim=()\t2\n"
                         "aten.mm\tbfloat16,bfloat16\t512x4096;4096x11008\t\t8\n", "t.tsv")
    assert len(t.rows) == 3 and t.launches == 43
    mm, conv, s = t.rows
    assert mm.op == "aten.mm" and mm.count == 40 and mm.shapes == ((512, 4096), (4096, 11008))
    assert conv.params.ints("stride") == (2, 2) and conv.params.str("bias") is None
    assert conv.params.ints("groups", (1,)) == (1,)
    assert s.shapes == ((),) and s.params.ints("dim") == () and s.base_op == "aten.sum"


@pytest.mark.parametrize("line,where", [
    ("aten.mm\tfloat16\t4x4\t\t1\textra", "line 3: expected 5 tab-separated columns"),
    ("mm\tfloat16\t4x4\t\t1", "line 3: column 1 (op)"),
    ("aten.mm\tfloat17\t4x4\t\t1", "line 3: column 2 (dtypes): unknown dtype 'float17'"),
    ("aten.mm\tfloat16\t4xa\t\t1", "line 3: column 3 (shapes): dim 'a'"),
    ("aten.mm\tfloat16\t4x-1\t\t1", "line 3: column 3 (shapes): dim '-1'"),
    ("aten.mm\tfloat16,float16\t4x4\t\t1", "line 3: column 3 (shapes): 1 shapes for 2 dtypes"),
    ("aten.mm\tfloat16\t4x4\tstride\t1", "line 3: column 4 (params): 'stride' is not name=value"),
    ("aten.mm\tfloat16\t4x4\ta=1,a=2\t1", "line 3: column 4 (params): parameter 'a' given twice"),
    ("aten.mm\tfloat16\t4x4\t\t0", "line 3: column 5 (count): count '0' is not a positive integer"),
    ("aten.mm\tfloat16\t4x4\t\t-3", "line 3: column 5 (count)"),
    ("aten.mm\tfloat16\t4x4\t\tmany", "line 3: column 5 (count)"),
])
def test_malformed_lines_name_file_line_and_column(line, where):
    with pytest.raises(TraceError) as e:
        parse_trace_text(HEAD + line + "\n", "model.tsv")
    assert str(e.value).startswith("model.tsv:") and where in str(e.value)
    assert "\n" not in str(e.value)


def test_missing_or_wrong_header(tmp_path):
    with pytest.raises(TraceError, match="line 1: no header"):
        parse_trace_text("# only comments\n", "a.tsv")
    with pytest.raises(TraceError, match="a.tsv: line 2: expected the header"):
        parse_trace_text("# x\nop\tdtype\tshapes\tparams\tcount\n", "a.tsv")
    p = tmp_path / "latin.tsv"
    p.write_bytes((HEAD + "aten.mm\tfloat16\t4x4\tname=caf\xe9\t1\n").encode("latin-1"))
    with pytest.raises(TraceError, match="latin.tsv: line 3: not UTF-8"):
        read_trace(p)
    with pytest.raises(TraceError, match="cannot read"):
        read_trace(tmp_path / "absent.tsv")


def test_writer_is_atomic_and_refuses_what_the_parser_would(tmp_path):
    out = tmp_path / "t.tsv"
    rows = [make_row("aten.mm", ["float16"] * 2, [(3, 4), (4, 5)], count=2)]
    write_trace(out, rows, comments=["recorded by a test"])
    assert read_trace(out).rows == tuple(rows)
    with pytest.raises(TraceError):
        write_trace(out, [make_row("aten.mm", ["float16"], [(3, 4)], count=0)])
    assert read_trace(out).rows == tuple(rows)  # the old file is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.tsv"]  # no temporary left over
    with pytest.raises(TraceError, match="cannot write"):
        write_trace(tmp_path / "no" / "such" / "dir.tsv", rows)


names = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True)
ops = st.builds(lambda a, b, c: f"{a}.{b}" + (f".{c}" if c else ""), names, names, st.one_of(st.none(), names))
shapes = st.lists(st.integers(0, 5000), max_size=4).map(tuple)
values = st.one_of(st.integers(-5, 10**6).map(str), st.sampled_from(["True", "False", "None", "tanh", "()"]),
                   st.lists(st.integers(0, 9), min_size=1, max_size=3).map(lambda v: "x".join(map(str, v))))


@st.composite
def rows(draw):
    n = draw(st.integers(0, 4))
    dtypes = draw(st.lists(st.sampled_from(sorted(KNOWN_DTYPES)), min_size=n, max_size=n))
    params = draw(st.dictionaries(names, values, max_size=3))
    return make_row(draw(ops), dtypes, [draw(shapes) for _ in range(n)], params, draw(st.integers(1, 10**9)))


@settings(max_examples=200, deadline=None)
@given(st.lists(rows(), max_size=6))
def test_property_write_then_read_round_trips(tmp_path_factory, trace_rows):
    out = tmp_path_factory.mktemp("rt") / "t.tsv"
    write_trace(out, trace_rows)
    merged = {}
    for r in trace_rows:
        k = r.key()
        merged[k] = merged[k] + r.count if k in merged else r.count
    got = read_trace(out)
    assert {r.key(): r.count for r in got.rows} == merged


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from("aten.mfloat16x0123456789;,=\t#\n ()-"), max_size=120))
def test_property_parser_never_crashes_on_garbage(text):
    try:
        t = parse_trace_text(HEAD + text, "fuzz.tsv")
    except TraceError as e:
        assert str(e).startswith("fuzz.tsv:") and "\n" not in str(e)
    else:
        for r in t.rows:
            assert r.count > 0 and len(r.dtypes) == len(r.shapes)


def test_header_constant_matches_design():
    assert HEADER == ("op", "dtypes", "shapes", "params", "count")
