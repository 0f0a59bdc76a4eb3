"""The recorder: rows against what known torch.nn modules launch, and trace_command failures."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import nbx_tune
from nbx_tune.errors import NbxError, TraceError
from nbx_tune.tuner.trace.recorder import Recorder, _program, record, trace_command
from nbx_tune.kernels.trace import read_trace

PYTHON = sys.executable


class DecoderLayer(nn.Module):
    """Pre-norm decoder layer: fused qkv, causal SDPA, bias-free out projection, GELU MLP."""

    def __init__(self, d=32, heads=4, ff=72):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d, bias=False)
        self.up, self.down = nn.Linear(d, ff), nn.Linear(ff, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (u.view(b, t, self.heads, d // self.heads).transpose(1, 2) for u in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(a.transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class ConvBlock(nn.Module):
    """Conv2d + BatchNorm2d + ReLU, plus a strided 1x1 shortcut added back."""

    def __init__(self, cin=3, cout=8):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, stride=2, padding=1)
        self.bn = nn.BatchNorm2d(cout)
        self.shortcut = nn.Conv2d(cin, cout, 1, stride=2, bias=False)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x))) + self.shortcut(x)


def row_map(rows):
    """{(op, dtypes, shapes, params text): count}."""
    return {(r.op, r.dtypes, r.shapes, r.params.text()): r.count for r in rows}


def record_model(device="cpu", grad_mode=torch.no_grad, repeats=1):
    torch.manual_seed(0)
    with torch.device(device):
        dec, conv = DecoderLayer().eval(), ConvBlock().eval()
        x, image = torch.randn(2, 10, 32), torch.randn(1, 3, 16, 16)
    with grad_mode(), Recorder() as rec:
        for _ in range(repeats):
            dec(x)
            conv(image)
    return rec


# ----------------------------------------------------------------------------- rows


def test_linear_layers_give_the_matmul_shapes_they_compute():
    lin, lin_nobias = nn.Linear(16, 24), nn.Linear(16, 40, bias=False)
    x2, x3 = torch.randn(3, 16), torch.randn(2, 5, 16)
    with torch.no_grad(), Recorder() as rec:
        lin(x2)
        lin_nobias(x3)
    assert row_map(rec.rows) == {
        # The weight is read as W.t(): stored transposed, which decides matmul's seat.
        ("aten.addmm", ("float32",) * 3, ((24,), (3, 16), (16, 24)), "layout=nt"): 1,
        # A 3-D input is flattened to (10, 16) by a view, which is not recorded.
        ("aten.mm", ("float32",) * 2, ((10, 16), (16, 40)), "layout=nt"): 1,
    }


def test_a_product_of_row_major_matrices_writes_no_layout_and_a_transposed_one_does():
    a, b = torch.randn(6, 5), torch.randn(5, 7)
    with torch.no_grad(), Recorder() as rec:
        a @ b
        a.t().contiguous().t() @ b
        torch.bmm(a[None], b.t().contiguous().t()[None])
    products = [r for r in rec.rows if r.op in ("aten.mm", "aten.bmm")]  # the copies aside
    assert [dict(r.params).get("layout") for r in products] == [None, "tn", "nt"]


def test_identical_launches_merge_and_repeats_multiply_counts():
    twins = [nn.Linear(16, 24), nn.Linear(16, 24)]
    x = torch.randn(4, 16)
    with torch.no_grad(), Recorder() as rec:
        for lin in twins:
            lin(x)
    assert [(r.op, r.count) for r in rec.rows] == [("aten.addmm", 2)]

    once, thrice = record_model(repeats=1), record_model(repeats=3)
    assert len(once.rows) > 10
    assert row_map(thrice.rows) == {k: 3 * c for k, c in row_map(once.rows).items()}
    assert thrice.launches == 3 * once.launches


def test_decoder_layer_rows():
    rows = row_map(record_model().rows)
    f32 = "float32"
    assert rows[("aten.native_layer_norm", (f32,) * 3, ((2, 10, 32), (32,), (32,)),
                 "normalized_shape=32,eps=1e-05")] == 2
    assert rows[("aten.addmm", (f32,) * 3, ((96,), (20, 32), (32, 96)), "layout=nt")] == 1
    assert rows[("aten.scaled_dot_product_attention", (f32,) * 3, ((2, 4, 10, 8),) * 3,
                 "attn_mask=None,is_causal=True")] == 1
    assert rows[("aten.mm", (f32,) * 2, ((20, 32), (32, 32)), "layout=nt")] == 1
    assert rows[("aten.addmm", (f32,) * 3, ((72,), (20, 32), (32, 72)), "layout=nt")] == 1
    assert rows[("aten.gelu", (f32,), ((2, 10, 72),), "")] == 1
    assert rows[("aten.addmm", (f32,) * 3, ((32,), (20, 72), (72, 32)), "layout=nt")] == 1
    assert rows[("aten.add.Tensor", (f32,) * 2, ((2, 10, 32),) * 2, "")] == 2
    # SDPA's output in (batch, seq, heads, dim) order: the reshape after it copies nothing.
    assert not any(op == "aten.clone" for op, *_ in rows)


def test_sdpa_inside_a_python_level_function_is_recorded_whole():
    mha, x = nn.MultiheadAttention(32, 4, batch_first=True), torch.randn(2, 10, 32)
    with Recorder() as rec:  # grad mode: autograd would pick the CPU backend before dispatch
        mha(x, x, x, need_weights=False)
    ops = [r.op for r in rec.rows]
    assert ops.count("aten.scaled_dot_product_attention") == 1
    assert not any("_scaled_dot_product_" in op for op in ops)
    sdpa = next(r for r in rec.rows if r.op == "aten.scaled_dot_product_attention")
    assert sdpa.shapes == ((2, 4, 10, 8),) * 3


def test_conv_block_rows():
    rows = row_map(record_model().rows)
    f32 = "float32"
    conv = "dilation=1x1,transposed=False,output_padding=0x0,groups=1"
    assert rows[("aten.convolution", (f32,) * 3, ((1, 3, 16, 16), (8, 3, 3, 3), (8,)),
                 f"stride=2x2,padding=1x1,{conv}")] == 1
    assert rows[("aten.convolution", (f32,) * 2, ((1, 3, 16, 16), (8, 3, 1, 1)),
                 f"bias=None,stride=2x2,padding=0x0,{conv}")] == 1
    # Recorded whole: CUDA would run cudnn_batch_norm inside it, the CPU native_batch_norm.
    assert rows[("aten.batch_norm", (f32,) * 5, ((1, 8, 8, 8),) + ((8,),) * 4,
                 "training=False,momentum=0.1,eps=1e-05")] == 1
    assert rows[("aten.relu", (f32,), ((1, 8, 8, 8),), "")] == 1
    assert rows[("aten.add.Tensor", (f32,) * 2, ((1, 8, 8, 8),) * 2, "")] == 1


def test_views_and_metadata_ops_are_not_recorded():
    x = torch.randn(4, 6)
    with Recorder() as views:
        x.view(2, 12).transpose(0, 1).permute(1, 0).unsqueeze(0).expand(3, 2, 12)
        x.split(3, dim=1)
        x.detach().contiguous().unsqueeze_(0)  # already contiguous: no copy
        x.reshape(24).size()
    assert views.rows == ()
    with Recorder() as copy:  # a transposed tensor made contiguous is a real copy
        x.t().contiguous()
    # memory_format=contiguous_format is passed, and never written; that the copy reads its
    # input strided is (the copy kernel's seat flag: kernels/copy.py layout_params).
    assert row_map(copy.rows) == {("aten.clone", ("float32",), ((6, 4),), "layout=strided,strides=1x6"): 1}
    with Recorder() as flat:  # a contiguous clone and a cast: the flat copy, nothing said
        x.clone()
        x.to(torch.float16)
    assert row_map(flat.rows) == {("aten.clone", ("float32",), ((4, 6),), ""): 1,
                                  ("aten._to_copy", ("float32",), ((4, 6),), "dtype=float16"): 1}


@pytest.mark.parametrize("device,grad_mode", [
    ("cpu", torch.inference_mode), ("cpu", torch.enable_grad),
    ("meta", torch.inference_mode), ("meta", torch.no_grad),
])
def test_same_rows_on_meta_and_in_every_grad_mode(device, grad_mode):
    assert record_model(device, grad_mode).rows == record_model("cpu", torch.no_grad).rows


def test_param_encoding():
    x = torch.randn(2, 3)
    with torch.no_grad(), Recorder() as rec:
        x * 0.5                                       # wrapped number: a 0-d float64 tensor
        torch.pow(x, 3)                               # Scalar argument: a param
        torch.sum(x, dim=(), dtype=torch.float64)     # empty list, dtype by name
        x.mean(dim=[0, 1], keepdim=True)              # int list, bool
        F.leaky_relu(x, 0.25)                         # float by repr
        F.gelu(x, approximate="tanh")                 # string
        torch.cat([x, x, x[:1]], dim=0)               # tensor list in order
        x[:, torch.tensor([0, 2])]                    # optional tensors, one None
        torch.zeros(2, 3, device="meta", dtype=torch.float16)  # no device, dtype kept
    assert [(r.op, r.dtypes, r.shapes, r.params.text()) for r in rec.rows] == [
        ("aten.mul.Tensor", ("float32", "float64"), ((2, 3), ()), ""),
        ("aten.pow.Tensor_Scalar", ("float32",), ((2, 3),), "exponent=3"),
        ("aten.sum.dim_IntList", ("float32",), ((2, 3),), "dim=(),dtype=float64"),
        ("aten.mean.dim", ("float32",), ((2, 3),), "dim=0x1,keepdim=True"),
        ("aten.leaky_relu", ("float32",), ((2, 3),), "negative_slope=0.25"),
        ("aten.gelu", ("float32",), ((2, 3),), "approximate=tanh"),
        ("aten.cat", ("float32",) * 3, ((2, 3), (2, 3), (1, 3)), ""),
        ("aten.index.Tensor", ("float32", "int64"), ((2, 3), (2,)), "indices=NonexTensor"),
        ("aten.zeros", (), (), "size=2x3,dtype=float16"),
    ]
    assert rec.rows[2].params.ints("dim") == ()


def test_a_param_holding_a_comma_is_refused():
    with pytest.raises(TraceError, match=r"aten\.gelu: parameter approximate='a,b' contains a comma"):
        with Recorder():
            F.gelu(torch.randn(2), approximate="a,b")


# ----------------------------------------------------------------------------- files


def test_record_writes_a_file_that_round_trips(tmp_path):
    out = tmp_path / "trace.tsv"
    torch.manual_seed(0)
    dec = DecoderLayer()
    with torch.inference_mode(), nbx_tune.record(out, comments=["decoder"]) as rec:
        dec(torch.randn(2, 10, 32))
    trace = read_trace(out)
    assert trace.rows == rec.rows
    assert trace.launches == rec.launches
    assert out.read_text().splitlines()[:2] == ["# nbx-tune trace v1", "# decoder"]
    assert [p.name for p in tmp_path.iterdir()] == ["trace.tsv"]


def test_record_writes_nothing_when_the_body_raises(tmp_path):
    lin, x = nn.Linear(4, 4), torch.randn(1, 4)
    with pytest.raises(ValueError, match="boom"):
        with record(tmp_path / "trace.tsv") as rec:
            lin(x)
            raise ValueError("boom")
    assert rec.launches == 1
    assert list(tmp_path.iterdir()) == []


def test_record_refuses_an_unwritable_path_before_the_body_runs(tmp_path):
    ran = []
    for out in (tmp_path / "missing" / "t.tsv", tmp_path):
        with pytest.raises(TraceError, match="cannot write"):
            with record(out):
                ran.append(out)
    assert ran == []
    assert list(tmp_path.iterdir()) == []


def test_record_fails_cleanly_when_the_directory_goes_away(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    with pytest.raises(TraceError, match="cannot write"):
        with record(folder / "t.tsv"):
            torch.randn(3) + 1
            folder.rmdir()
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- commands


def script(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def one_line_failure(argv, out):
    with pytest.raises(TraceError) as info:
        trace_command(out, argv)
    assert isinstance(info.value, NbxError)
    assert "\n" not in str(info.value)
    return str(info.value)


@pytest.mark.slow
def test_trace_command_records_the_program(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    script(tmp_path, "model.py", """
        import sys
        import torch
        lin = torch.nn.Linear(8, int(sys.argv[1]))
        with torch.inference_mode():
            for _ in range(3):
                lin(torch.randn(2, 8))
    """)
    summary = trace_command(tmp_path / "t.tsv", [PYTHON, "-u", "model.py", "5"])
    trace = read_trace(tmp_path / "t.tsv")
    assert row_map(trace.rows)[("aten.addmm", ("float32",) * 3, ((5,), (2, 8), (8, 5)), "layout=nt")] == 3
    assert (summary.rows, summary.launches) == (len(trace.rows), trace.launches)
    assert f"# command: {PYTHON} -u model.py 5" in (tmp_path / "t.tsv").read_text()
    # The fusions comment docs/trace-format.md promises, as `nbx_tune.record` writes it (it was lost).
    assert "\n# fusions: " in (tmp_path / "t.tsv").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.py", "t.tsv"]


def test_trace_command_when_the_script_raises(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    script(tmp_path, "bad.py", """
        import torch
        torch.ones(3) + 1
        raise ValueError("bad shape\\nmore detail")
    """)
    message = one_line_failure([PYTHON, "bad.py"], tmp_path / "t.tsv")
    assert message == "trace: bad.py raised ValueError: bad shape; no trace written"
    assert [p.name for p in tmp_path.iterdir()] == ["bad.py"]


def test_trace_command_when_the_program_exits_non_zero(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    script(tmp_path, "quit.py", "import sys\nsys.exit(3)\n")
    message = one_line_failure([PYTHON, "quit.py"], tmp_path / "t.tsv")
    assert message == "trace: quit.py exited with status 3; no trace written"
    assert [p.name for p in tmp_path.iterdir()] == ["quit.py"]


@pytest.mark.parametrize("argv,expected", [
    ([], "no command to run"),
    (["no-such-command-nbx"], "command no-such-command-nbx not found"),
    (["ls", "-l"], "ls is not a Python interpreter"),
    ([PYTHON, "-u"], "was given no script"),
    ([PYTHON, "missing.py"], "script missing.py not found"),
])
def test_trace_command_refuses_a_malformed_command(tmp_path, monkeypatch, argv, expected):
    monkeypatch.chdir(tmp_path)
    assert expected in one_line_failure(argv, tmp_path / "t.tsv")
    assert list(tmp_path.iterdir()) == []


def test_trace_command_checks_the_output_before_running(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    script(tmp_path, "touch.py", "open('ran', 'w').close()\n")
    for out in (tmp_path / "missing" / "t.tsv", tmp_path / "touch.py" / "t.tsv", tmp_path):
        assert "cannot write" in one_line_failure([PYTHON, "touch.py"], out)
    assert [p.name for p in tmp_path.iterdir()] == ["touch.py"]


def test_python_options_stay_with_the_interpreter():
    prog = _program([PYTHON, "-u", "-W", "ignore", "-m", "pkg.mod", "--flag", "x"])
    assert (prog.options, prog.target, prog.args, prog.label) == (
        ["-u", "-W", "ignore"], ["-m", "pkg.mod"], ["--flag", "x"], "pkg.mod")


# ----------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_a_recorded_model_goes_through_a_census(tmp_path):
    """Record a transformer layer and a conv block, then certify what the trace needs."""
    from nbx_tune.tuner import commands as api

    out = tmp_path / "model.tsv"
    torch.manual_seed(0)
    dec, conv = DecoderLayer().eval(), ConvBlock().eval()
    x, image = torch.randn(1, 7, 32), torch.randn(1, 3, 9, 9)
    with torch.inference_mode(), record(out):
        dec(x)
        conv(image)
    rep = api.census(str(out), f"sqlite:///{tmp_path / 'nbx.db'}", isolate=False)
    kernels = {s.kernel for s in rep.seats}
    assert {"matmul", "attention", "layer_norm", "conv", "elementwise_unary", "elementwise_binary",
            "batch_norm"} <= kernels
    assert all(s.status == "certified" for s in rep.seats), [(s.label, s.why) for s in rep.seats]
    assert not rep.uncovered and not rep.not_servable  # every launch of the model has a kernel
    assert rep.launches == sum(r.count for r in read_trace(out).rows)
