"""serve()'s lean per-op path (kernels/serving/serve.py) keeps serve()'s behaviour: torch's kernel
is called with the keyset the dispatcher would have handed it, each thread knows whether it
is inside a served function, replays under serve() count certified and default launches and
are never served after the certified configs change, and replays take Triton's launch hooks
into account when the hooks are chains (kernels/runtime/launch.py)."""

from __future__ import annotations

import threading
import warnings
from types import SimpleNamespace

import pytest
import torch
from nbx_tune.testing.fake_compiled import FakeTriton, lean_launcher

import nbx_tune
from nbx_tune.kernels.runtime import certified, launch
from nbx_tune.kernels import silu
from nbx_tune.kernels.serving import serve as serving
from nbx_tune.kernels.runtime.registry import get_spec
from nbx_tune.kernels.spec import bucket_of, seat_flags


@pytest.fixture(autouse=True)
def fresh_stats():
    serving.reset_stats()
    launch.forget()
    yield
    launch.forget()
    assert not serving.active()


@pytest.fixture
def fake(monkeypatch):
    f = FakeTriton()
    monkeypatch.setattr(launch, "through_triton", f)
    return f


def _served(op: str) -> tuple[int, int, int]:
    s = serving.stats().get(op, {})
    return s.get("certified", 0), s.get("default", 0), s.get("torch", 0)


# ----------------------------------------------------------------------------- the keyset


def test_the_dispatcher_hands_a_backend_kernel_its_key_alone():
    """serve() registers its kernels without the keyset and calls torch's kernel with the
    backend key's keyset: what the dispatcher passes there in every mode a model runs in."""
    key = serving.dispatch_key()
    seen = []

    def probe(keyset, *args, **kwargs):
        seen.append(keyset)
        return torch.empty_like(args[0])

    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lib.impl("neg", probe, key, with_keyset=True)
    try:
        x, g = torch.randn(4), torch.randn(4, requires_grad=True)
        torch.neg(x)
        torch.neg(g).sum()  # autograd above the backend: redispatched
        torch.neg(x[1:3].t())
        with torch.no_grad():
            torch.neg(g)
        with torch.inference_mode():
            torch.neg(g)
            torch.neg(torch.randn(4))  # an inference tensor
    finally:
        lib._destroy()
    assert len(seen) == 6
    want = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key))
    assert all(ks == want for ks in seen), seen


@pytest.mark.parametrize("mode", ["plain", "no_grad", "inference_mode"])
def test_fall_through_in_every_mode_is_torchs_result(mode):
    ctx = {"plain": torch.enable_grad, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}[mode]
    d = torch.randn(5, dtype=torch.float64)
    with ctx(), nbx_tune.serve():
        y = d * 3 + d  # float64: no kernel serves it
    assert torch.equal(y, d * 3 + d)
    assert _served("aten.mul.Tensor")[2] == 1 and _served("aten.add.Tensor")[2] == 1


def test_a_fall_through_with_grad_records_torchs_backward():
    d = torch.randn(5, dtype=torch.float64, requires_grad=True)
    with nbx_tune.serve():
        (d * d).sum().backward()
    torch.testing.assert_close(d.grad, 2 * d.detach())
    assert _served("aten.mul.Tensor")[2] >= 1


# ----------------------------------------------------------------------------- threads


def test_another_threads_ops_are_served_while_a_kernel_runs(monkeypatch):
    """Inside a served function this thread's torch calls go to torch; another thread's are
    still served (a fresh thread starts outside any kernel)."""
    routes = dict(serving.routes())
    x = torch.randn(6)
    got = {}

    def mul_with_a_thread(a, b):
        t = threading.Thread(target=lambda: got.setdefault("other", torch.relu(x)))
        t.start()
        t.join()
        got["own"] = torch.relu(x)  # this thread, inside a kernel: torch's relu, not counted
        return torch.mul(a, b)

    overload, _, kernel = routes["aten.mul.Tensor"]
    routes["aten.mul.Tensor"] = (overload, mul_with_a_thread, kernel)
    monkeypatch.setattr(serving, "_routes", routes)
    with nbx_tune.serve():
        y = x * x
    torch.testing.assert_close(y, x * x)
    assert torch.equal(got["own"], torch.relu(x)) and torch.equal(got["other"], torch.relu(x))
    assert sum(_served("aten.relu")) == 1 and _served("aten.relu")[2] == 0  # the other thread's
    assert sum(_served("aten.mul.Tensor")[:2]) == 1


# ----------------------------------------------------------------------------- replays


def test_partial_routes_serve_what_the_public_ops_serve():
    x, y = torch.randn(3, 7) + 4, torch.randn(7) + 4  # positive: rsqrt and div well away from 0
    calls = [(lambda: torch.neg(x), "aten.neg"), (lambda: torch.rsqrt(x), "aten.rsqrt"),
             (lambda: x * y, "aten.mul.Tensor"), (lambda: x / y, "aten.div.Tensor"),
             (lambda: torch.maximum(x, y), "aten.maximum"), (lambda: x.mul_(1.0), "aten.mul_.Tensor")]
    for call, op in calls:
        want = call()
        with nbx_tune.serve():
            got = call()
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        assert sum(_served(op)[:2]) == 1 and _served(op)[2] == 0, (op, serving.stats())


def _certify_relu(st, n):
    spec = get_spec("elementwise_unary")
    seat = ("elementwise_unary", ("float32",), seat_flags(fn="relu"), bucket_of(st.profile, spec.key, (n,)))
    st.entries[seat] = (spec.default_preference()[0], "test")


def test_replays_under_serve_count_each_launch_and_a_new_certificate_is_served(fake, monkeypatch):
    """Every replay of an uncertified seat counts default; after the certified configs are
    read again (a census in this process) no replay of before is served: the call is
    recorded afresh and counts certified."""
    x = torch.randn(3, 5)
    with nbx_tune.serve():
        for _ in range(3):
            torch.relu(x)
    assert fake.log == ["triton", "direct", "direct"]
    assert _served("aten.relu") == (0, 3, 0)

    load = certified._load

    def with_certificate():
        st = load()
        _certify_relu(st, 15)
        return st

    monkeypatch.setattr(certified, "_load", with_certificate)
    certified.reload()
    fake.clear()
    serving.reset_stats()
    with nbx_tune.serve():
        ys = [torch.relu(x) for _ in range(2)]
    assert fake.log == ["triton", "direct"]
    assert _served("aten.relu") == (2, 0, 0)
    assert all(torch.equal(y, torch.relu(x)) for y in ys)


def test_a_changed_dtype_or_stride_under_serve_is_not_served_anothers_replay(fake):
    x = torch.randn(4, 6)
    with nbx_tune.serve():
        a = [torch.relu(x) for _ in range(2)]
        b = [torch.relu(x.t()) for _ in range(2)]  # strided: its own record
        c = [torch.relu(x.half()) for _ in range(2)]  # float16: its own record
    assert fake.log.count("triton") >= 3
    for got, want in ((a, torch.relu(x)), (b, torch.relu(x.t())), (c, torch.relu(x.half()))):
        assert all(torch.equal(g, want) for g in got)
    assert sum(_served("aten.relu")) == 6 and _served("aten.relu")[2] == 0


# ----------------------------------------------------------------------------- launch hooks


def test_a_replay_checks_tritons_hook_chains_inline_on_every_call(fake, monkeypatch):
    """With chains of launch hooks (Triton 3.4 and later) a replay tests them inline: the
    compiled launcher while they are empty and are the knobs' own; CompiledKernel[grid] (which
    calls hooks) once one holds a hook or a knob is set to another."""
    HookChain = getattr(pytest.importorskip("triton.knobs"), "HookChain", None)
    if HookChain is None:
        pytest.skip("this Triton has no launch-hook chains")

    knobs = SimpleNamespace(launch_enter_hook=HookChain(), launch_exit_hook=HookChain(reversed=True))

    def with_chains(compiled):
        run, fn, meta, _, stream, device = lean_launcher(compiled)
        return run, fn, meta, knobs, stream, device

    monkeypatch.setattr(launch, "_lean_launcher", with_chains)
    x = torch.randn(37, 16)
    want = silu(x)
    assert "_no_hooks" not in next(iter(launch.REMEMBERED.values())).source
    fake.clear()

    def path():
        fake.clear()
        assert torch.equal(silu(x), want)
        return "lean" if "lean" in fake.log else "full"

    assert path() == "lean"
    hook = lambda *a: None  # noqa: E731
    knobs.launch_enter_hook.add(hook)
    assert path() == "full"
    knobs.launch_enter_hook.remove(hook)
    assert path() == "lean"
    knobs.launch_exit_hook = HookChain()  # another chain: the replay's is no longer the knob's
    assert path() == "full"
    knobs.launch_exit_hook = None  # an older Triton's "no hook"
    assert path() == "full"


def test_a_public_op_is_resolved_once():
    """`nbx_tune.kernels.mm` is looked up lazily the first time, then is the package's own
    attribute (no import machinery per call), and is the family's function."""
    import nbx_tune.kernels as K
    from nbx_tune.kernels import matmul, softmax as softmax_op

    assert K.mm is matmul.mm and K.__dict__["mm"] is matmul.mm
    assert callable(K.softmax) and K.softmax is softmax_op  # the op, never the module of that name
