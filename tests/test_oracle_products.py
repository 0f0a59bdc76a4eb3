"""The oracles' matrix products (oracles/products.py): a faster product handed in is used
for large products only where Freivalds' test says it is the product, else numpy's."""

import numpy as np
import pytest

from nbx_tune.oracles import conv as conv_oracle, matmul as mm_oracle, products
from nbx_tune.tuner.certify import screen


@pytest.fixture(autouse=True)
def small_threshold(monkeypatch):
    monkeypatch.setattr(products, "LARGE_FLOPS", 1000)
    monkeypatch.setattr(products, "MIN_INTENSITY", 1)
    monkeypatch.setattr(products, "CHUNK_ROWS", 7)  # several blocks at these K


def operands(*shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, s) for s in shapes]


class Spy:
    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, a, b):
        self.calls += 1
        self.last = self.fn(a, b)
        return self.last


@pytest.mark.parametrize("sa,sb", [((37, 61), (61, 29)), ((3, 17, 40), (40, 23)), ((2, 19, 33), (2, 33, 5)),
                                   ((45, 2), (2, 9))])
def test_a_correct_product_is_taken(sa, sb):
    a, b = operands(sa, sb)
    # Summed in another order than numpy's (columns reversed): the same product to fp64 rounding.
    spy = Spy(lambda a, b: np.matmul(a[..., ::-1], b[..., ::-1, :]))
    with products.faster(spy):
        out = products.matmul(a, b)
    assert spy.calls == 1 and out is spy.last
    np.testing.assert_allclose(out, np.matmul(a, b), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("where", [(0, 0), (18, 14), (36, 28)])
def test_one_wrong_element_anywhere_is_refused(where):
    a, b = operands((37, 61), (61, 29), seed=1)

    def wrong(a, b):
        out = np.matmul(a, b)
        out[where] += 1e-6 * np.abs(out).max()  # far below a screen's tolerance, still wrong
        return out

    with products.faster(wrong):
        out = products.matmul(a, b)
    assert np.array_equal(out, np.matmul(a, b))


@pytest.mark.parametrize("bad", [
    lambda a, b: np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(np.float64),  # fp32 sums
    lambda a, b: None,  # could not run (out of memory)
    lambda a, b: np.matmul(a, b)[:-1],  # wrong shape
    lambda a, b: np.matmul(a, b) * np.nan,
])
def test_a_product_that_is_not_fp64_or_does_not_run_falls_back_to_numpy(bad):
    a, b = operands((64, 300), (300, 48), seed=2)
    with products.faster(bad):
        out = products.matmul(a, b)
    assert np.array_equal(out, np.matmul(a, b))


def test_skinny_products_are_numpys(monkeypatch):
    # A decode step's GEMM: few flops per operand element, where moving and checking the
    # operands costs more than numpy's product.
    monkeypatch.setattr(products, "MIN_INTENSITY", 16)
    spy = Spy(np.matmul)
    skinny = operands((2, 300), (300, 400))  # 2 * 2 * 300 * 400 flops over 120600 elements: 4
    with products.faster(spy):
        out = products.matmul(*skinny)
    assert spy.calls == 0 and np.array_equal(out, np.matmul(*skinny))
    with products.faster(spy):
        products.matmul(*operands((37, 61), (61, 29)))  # 32 flops an element
    assert spy.calls == 1


def test_small_products_and_no_handed_product_are_numpys(monkeypatch):
    a, b = operands((5, 6), (6, 7))
    spy = Spy(np.matmul)
    with products.faster(spy):
        products.matmul(a, b)  # 420 flops, under the threshold
    assert spy.calls == 0
    monkeypatch.setattr(products, "LARGE_FLOPS", 1)
    assert np.array_equal(products.matmul(a, b), np.matmul(a, b))  # nothing handed in
    with products.faster(spy):
        pass
    assert products._fast is None  # the block restores what was before


def test_the_matmul_and_conv_oracles_take_their_products_from_here():
    a, b, bias = operands((33, 40), (40, 21), (21,), seed=3)
    spy = Spy(np.matmul)
    with products.faster(spy):
        mm_oracle.mm(a, b), mm_oracle.addmm(bias, a, b, 0.5, 2.0)
        x, w = operands((2, 8, 9, 9), (6, 8, 3, 3), seed=4)
        conv_oracle.conv2d(x, w, padding=1)
    assert spy.calls == 2 + 9  # one product per conv filter tap


def test_the_screen_hands_in_a_product_only_on_a_gpu():
    assert screen.device_product("cpu") is None
    assert callable(screen.device_product("cuda"))


def test_an_operand_viewing_a_resident_input_is_read_from_its_device_copy():
    """The screen's GPU product reads a case's rounded inputs where they already are (in
    their own dtype) instead of uploading their float64 widening: every view of the
    widened array maps to the same values; anything else is uploaded."""
    import torch

    rng = np.random.default_rng(5)
    arr = rng.standard_normal((3, 7, 5)).astype(np.float32).astype(np.float64)  # exact in float32
    dev = torch.from_numpy(arr).to(torch.float32)
    resident = [(arr, dev)]
    views = [arr, arr.transpose(0, 2, 1), arr[1:, 2:6, ::2], arr[2], arr[:, 3, :].T]
    for x in views:
        got = screen._view_of(x, arr, dev)
        assert got is not None and got.dtype == torch.float32
        assert np.array_equal(screen.on_device(x, resident, "cpu").numpy(), x)
    assert screen.on_device(arr, resident, "cpu").dtype == torch.float64
    for x in (arr.copy(), arr[::-1], rng.standard_normal((3, 7, 5)), arr.astype(np.float32)):
        assert screen._view_of(x, arr, dev) is None
        assert np.array_equal(screen.on_device(x, resident, "cpu").numpy(), x)
    assert screen._view_of(arr, arr, dev.reshape(7, 3, 5)) is None  # not the same layout


def test_a_gpu_product_that_is_the_oracles_output_is_judged_against_its_copy_on_the_device(monkeypatch):
    """The downloaded product an oracle returns as it is (a matmul with alpha 1) keeps its
    device copy as the reference; one the oracle changed (alpha 0.5), or numpy's after a
    failed check, is uploaded. Either way the screen's verdict is the same. (A CPU stand-in
    for the GPU: the same code path with torch CPU tensors.)"""
    import torch

    from nbx_tune.kernels.matmul import SPEC
    from nbx_tune.kernels.spec import Problem

    wrong = []

    def fake_device_product(device, resident=(), downloaded=None):
        def product(a, b):
            out = torch.matmul(torch.from_numpy(a), torch.from_numpy(b))
            if wrong:
                out[0, 0, 0] += 1.0
            host = out.numpy().copy()
            host.flags.writeable = False
            downloaded[:] = [(host, out)]
            return host
        return product

    monkeypatch.setattr(screen, "device_product", fake_device_product)
    flags = (("aligned", "0"), ("bias", "0"))

    def case(alpha):
        p = Problem("matmul", ("float32",), flags, (1, 37, 45, 29), (("alpha", alpha),))
        return screen.make_case(SPEC, p, "cpu", 11, True)

    like = torch.empty(1, 37, 45)
    c = case(1.0)
    assert set(c.twins) == {"c"} and not c.ref["c"].flags.writeable
    ref = c.reference("c", like)
    assert ref.values is c.twins["c"] and np.array_equal(ref.values.numpy(), c.ref["c"])
    out = torch.from_numpy(c.ref["c"].astype(np.float32))
    ok = screen.compare("c", out, ref, 1e-6, c.problem)
    assert ok.ok and ok.err == screen.compare("c", out, c.ref["c"], 1e-6, c.problem).err
    bad = out.clone()
    bad[0, 5, 5] += 1.0
    assert screen.compare("c", bad, ref, 1e-6, c.problem).reason == "wrong_answer"
    assert case(0.5).twins == {}  # the oracle scaled the product: a new array, uploaded
    wrong.append(True)
    c = case(1.0)  # the product fails Freivalds' test: numpy's is the oracle, no twin
    assert c.twins == {} and c.ref["c"].flags.writeable


def test_the_checks_row_blocks_on_threads_give_what_one_thread_gives(monkeypatch):
    a, b = operands((3, 45, 61), (61, 29), seed=4)  # several blocks of CHUNK_ROWS each way
    monkeypatch.setattr(products, "MAX_THREADS", 1)
    one = products._expected(a, b)
    monkeypatch.setattr(products, "MAX_THREADS", 8)
    monkeypatch.setattr(products, "cores", lambda: 4)
    many = products._expected(a, b)
    x = products._check_vectors(29)
    assert all(np.array_equal(p, q) for p, q in zip(one, many))
    np.testing.assert_allclose(one[0], a @ (b @ x), rtol=1e-12)
    np.testing.assert_allclose(one[1], np.abs(a) @ (np.abs(b) @ np.abs(x)), rtol=1e-12)
