"""Test-only kernels with planted faults: configs that leave output unwritten, compute a
wrong answer, fail to compile, or need more shared memory than any device has. A tuner
that ranked on speed alone would happily certify some of them."""

from collections import Counter

import triton
import triton.language as tl

from nbx_tune.kernels.spec import Config, KernelSpec, KeyDim, NotServable, Problem, seat_flags

LAUNCHES = Counter()  # config key -> launches, to prove a pruned config never ran


@triton.jit
def _double(x_ptr, y_ptr, n, BLOCK: tl.constexpr, SKIP_TAIL: tl.constexpr, WRONG: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    limit = n - 7 if SKIP_TAIL else n  # SKIP_TAIL: the last 7 elements are never written
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    y = 2.0 * x
    if WRONG:  # a wrong answer at one element in 97
        y = tl.where(offs % 97 == 5, y + 0.5, y)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=offs < limit)


def launch_double(x, y, config):
    n = x.numel()
    _double[(triton.cdiv(n, config["BLOCK"]),)](x, y, n, **config.kwargs)


def cfg(block, skip=0, wrong=0):
    return Config.make(BLOCK=block, SKIP_TAIL=skip, WRONG=wrong, num_warps=4, num_stages=1)


GOOD = (cfg(32), cfg(256))
UNWRITTEN = cfg(64, skip=1)
WRONG = cfg(128, wrong=1)
NO_COMPILE = cfg(48)  # tl.arange needs a power of two
HUGE = cfg(8192)  # its shared-memory estimate is over every budget


class DoubleSpec(KernelSpec):
    name = "test_double"
    ops = ("test.double",)
    key = (KeyDim("n", "elements"),)
    dtypes = ("float16", "float32")
    # A subclass's planted faults: its configs are these between the two good ones.
    faults: tuple = ()

    def __init__(self, configs=None):
        if configs is None:
            configs = (GOOD[0], *self.faults, GOOD[1]) if self.faults else (*GOOD, UNWRITTEN, WRONG, NO_COMPILE, HUGE)
        self._configs = tuple(configs)

    def configs(self):
        return self._configs

    def default_preference(self):
        return GOOD

    def smem_bytes(self, config, problem):
        return 1 << 30 if config["BLOCK"] >= 8192 else 0

    def source_parts(self):
        return (_double, launch_double)

    def problem_from_row(self, row):
        if len(row.shapes) != 1 or row.dtypes[0] not in self.dtypes:
            return NotServable("one float16/float32 tensor")
        n = 1
        for d in row.shapes[0]:
            n *= d
        if n == 0:
            return NotServable("empty")
        return Problem(self.name, (row.dtypes[0],), seat_flags(), (n,))

    def input_shapes(self, problem):
        return {"x": ((problem.dims[0],), problem.dtypes[0])}

    def make_inputs(self, problem, rng):
        return {"x": (rng.standard_normal(problem.dims[0]) * 3, problem.dtypes[0])}

    def oracle(self, problem, inputs):
        return {"y": 2.0 * inputs["x"]}

    def output_specs(self, problem):
        return {"y": ((problem.dims[0],), problem.dtypes[0])}

    def launch(self, config, problem, inputs, outputs):
        LAUNCHES[config.key()] += 1
        launch_double(inputs["x"], outputs["y"], config)


SPEC = DoubleSpec()


# ----------------------------------------------------------------------------- process faults
# Only ever run in worker processes (tuner/execution/isolation.py): they kill or hang the process that
# launches them. Every launch is logged to $NBX_TEST_LAUNCH_LOG so a test can see what ran.

CRASH = cfg(16)  # dies by SIGSEGV, as a GPU fault takes a process down
HANG = cfg(512)  # never returns


class FaultySpec(DoubleSpec):
    name = "test_faulty"
    ops = ("test.faulty",)
    faults = (CRASH, HANG)

    def launch(self, config, problem, inputs, outputs):
        import os
        import signal
        import time

        log = os.environ.get("NBX_TEST_LAUNCH_LOG")
        if log:
            with open(log, "a") as f:
                f.write(f"{os.getpid()} {config['BLOCK']}\n")
        if config == CRASH:
            os.kill(os.getpid(), signal.SIGSEGV)
        if config == HANG:
            time.sleep(3600)
        super().launch(config, problem, inputs, outputs)


FAULTY = FaultySpec()
SPECS = (SPEC, FAULTY)


# A candidate that leaves the (simulated) GPU context poisoned: it fails with a CUDA error,
# and so does every later launch in the same process, as after an illegal memory access.
POISON = cfg(1024)
_POISONED = []


class PoisonSpec(DoubleSpec):
    name = "test_poison"
    ops = ("test.poison",)
    faults = (POISON,)

    def launch(self, config, problem, inputs, outputs):
        if config == POISON:
            _POISONED.append(True)
        if _POISONED:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        super().launch(config, problem, inputs, outputs)


POISONING = PoisonSpec()


class UnpreparableSpec(FaultySpec):
    """Making its inputs kills the process: at n = 13 always, and at any n once
    $NBX_TEST_PREPARE_LOG is not empty (so every preparation after the first dies). Its
    CRASH candidate kills the worker as FaultySpec's does."""

    name = "test_unpreparable"
    ops = ("test.unpreparable",)
    faults = (CRASH,)

    def make_inputs(self, problem, rng):
        import os
        import signal

        log = os.environ.get("NBX_TEST_PREPARE_LOG")
        earlier = bool(log and os.path.exists(log) and os.path.getsize(log))
        if log:
            with open(log, "a") as f:
                f.write(f"{os.getpid()}\n")
        if problem.dims[0] == 13 or earlier:
            os.kill(os.getpid(), signal.SIGSEGV)
        return super().make_inputs(problem, rng)


UNPREPARABLE = UnpreparableSpec()
SPECS = (SPEC, FAULTY, POISONING, UNPREPARABLE)


# Killed from outside, as the out-of-memory killer or a stray `kill -9` does (SIGKILL):
# preparing the seat while $NBX_TEST_KILL_PREPARE names an existing file, and the candidate
# KILLED_ONCE once for each time $NBX_TEST_KILL_ONCE names an existing file (which it removes).
KILLED_ONCE = cfg(128)


class KilledSpec(DoubleSpec):
    name = "test_killed"
    ops = ("test.killed",)
    faults = (KILLED_ONCE,)

    def make_inputs(self, problem, rng):
        import os
        import signal

        marker = os.environ.get("NBX_TEST_KILL_PREPARE")
        if marker and os.path.exists(marker):
            os.kill(os.getpid(), signal.SIGKILL)
        return super().make_inputs(problem, rng)

    def launch(self, config, problem, inputs, outputs):
        import os
        import signal

        marker = os.environ.get("NBX_TEST_KILL_ONCE")
        if config == KILLED_ONCE and marker and os.path.exists(marker):
            os.unlink(marker)
            os.kill(os.getpid(), signal.SIGKILL)
        super().launch(config, problem, inputs, outputs)


KILLED = KilledSpec()
SPECS = (SPEC, FAULTY, POISONING, UNPREPARABLE, KILLED)


class BadOracleSpec(DoubleSpec):
    """A plugin whose fp64 oracle raises: the seat's own error, not the GPU's."""

    name = "test_bad_oracle"
    ops = ("test.bad_oracle",)

    def oracle(self, problem, inputs):
        raise ValueError("oracle bug")


BAD_ORACLE = BadOracleSpec()
SPECS = (SPEC, FAULTY, POISONING, UNPREPARABLE, KILLED, BAD_ORACLE)


# ----------------------------------------------------------------------------- subtle faults
# A GEMM whose faulty configs pass the tolerance at the shapes a naive screen picks: a mask
# that is wrong only where N leaves a partial tile, a round-to-nearest fp16 accumulator
# (within fp16's tolerance, many times the error of a correct config), and a split-K whose
# atomics make two launches on the same inputs differ (on a GPU; the interpreter runs
# programs one at a time, so there the launcher nudges every second launch by one ulp).

@triton.jit
def _gemm(a_ptr, b_ptr, c_ptr, M, N, K, nudge, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
          MASK_BUG: tl.constexpr, ACC16: tl.constexpr, SPLIT_K: tl.constexpr):
    # The K slice is the fastest-varying program id, so a tile's slices run side by side
    # and their atomics race (slices launched one after another would add in one order).
    pk, pm, pn = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    # MASK_BUG: columns are masked against N rounded down to whole tiles.
    n_lim = (N // BN) * BN if MASK_BUG else N
    if ACC16:
        acc = tl.zeros((BM, BN), dtype=tl.float16)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(pk * BK, K, BK * SPLIT_K):
        kk = k0 + rk
        a = tl.load(a_ptr + rm[:, None] * K + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + kk[:, None] * N + rn[None, :], mask=(kk[:, None] < K) & (rn[None, :] < n_lim), other=0.0)
        if ACC16:
            acc = acc + tl.dot(a, b, out_dtype=tl.float16)
        else:
            acc += tl.dot(a, b, input_precision="ieee")
    acc = acc.to(tl.float32)
    acc = tl.where((rm[:, None] == 0) & (rn[None, :] == 0), acc * (1.0 + nudge), acc)
    ptrs = c_ptr + rm[:, None] * N + rn[None, :]
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    if SPLIT_K > 1:
        tl.atomic_add(ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


def launch_gemm(a, b, c, config, nudge=0.0):
    M, K = a.shape
    N = b.shape[1]
    if config["SPLIT_K"] > 1:
        c.zero_()
    grid = (config["SPLIT_K"], triton.cdiv(M, config["BM"]), triton.cdiv(N, config["BN"]))
    _gemm[grid](a, b, c, M, N, K, nudge, **config.kwargs)


def gcfg(bm, bn, bk, mask_bug=0, acc16=0, split_k=1):
    return Config.make(BM=bm, BN=bn, BK=bk, MASK_BUG=mask_bug, ACC16=acc16, SPLIT_K=split_k,
                       num_warps=4, num_stages=1)


GEMM_GOOD = (gcfg(16, 16, 32), gcfg(32, 32, 16))
MASK_BUG = gcfg(16, 32, 32, mask_bug=1)
ACC16 = gcfg(16, 16, 16, acc16=1)
SPLIT_K = gcfg(16, 16, 32, split_k=4)


class GemmSpec(KernelSpec):
    """Its faulty configs are marked fastest by the tests' benchmarker, so only the
    screen stands between them and a certificate."""

    name = "test_gemm"
    ops = ("test.gemm",)
    key = (KeyDim("M"), KeyDim("N"), KeyDim("K"))
    dtypes = ("float16", "float32")

    def __init__(self, configs=(*GEMM_GOOD, MASK_BUG, ACC16, SPLIT_K), edges=True):
        self._configs, self.edges = tuple(configs), edges

    def configs(self):
        return self._configs

    def default_preference(self):
        return GEMM_GOOD

    def source_parts(self):
        return (_gemm, launch_gemm)

    def problem_from_row(self, row):
        (M, K), (_, N) = row.shapes
        return Problem(self.name, (row.dtypes[0],), seat_flags(), (M, N, K))

    def resized(self, problem, dims):
        import dataclasses

        return dataclasses.replace(problem, dims=tuple(dims)) if self.edges else None

    def input_shapes(self, problem):
        M, N, K = problem.dims
        return {"a": ((M, K), problem.dtypes[0]), "b": ((K, N), problem.dtypes[0])}

    def make_inputs(self, problem, rng):
        return {n: (rng.uniform(-1, 1, shape), dt) for n, (shape, dt) in self.input_shapes(problem).items()}

    def oracle(self, problem, inputs):
        return {"c": inputs["a"] @ inputs["b"]}

    def output_specs(self, problem):
        M, N, _ = problem.dims
        return {"c": ((M, N), problem.dtypes[0])}

    def launch(self, config, problem, inputs, outputs):
        import os

        LAUNCHES[config.key()] += 1
        nudge = 0.0
        if config["SPLIT_K"] > 1 and os.environ.get("TRITON_INTERPRET") == "1" and LAUNCHES[config.key()] % 2 == 0:
            nudge = 2.0 ** -8
        launch_gemm(inputs["a"], inputs["b"], outputs["c"], config, nudge)


GEMM = GemmSpec()
SPECS = (*SPECS, GEMM)


class SeenShapesGemmSpec(GemmSpec):
    """The same GEMM with no tile-edge shapes: screened at the shapes a census saw only."""

    name = "test_gemm_seen"
    ops = ("test.gemm_seen",)

    def __init__(self):
        super().__init__((GEMM_GOOD[0], MASK_BUG), edges=False)


GEMM_SEEN = SeenShapesGemmSpec()
SPECS = (*SPECS, GEMM_SEEN)
