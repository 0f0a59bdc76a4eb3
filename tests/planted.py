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

    def __init__(self, configs=(*GOOD, UNWRITTEN, WRONG, NO_COMPILE, HUGE)):
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
# Only ever run in worker processes (tuner/isolation.py): they kill or hang the process that
# launches them. Every launch is logged to $NBX_TEST_LAUNCH_LOG so a test can see what ran.

CRASH = cfg(16)  # dies by SIGSEGV, as a GPU fault takes a process down
HANG = cfg(512)  # never returns


class FaultySpec(DoubleSpec):
    name = "test_faulty"
    ops = ("test.faulty",)

    def __init__(self):
        super().__init__((GOOD[0], CRASH, HANG, GOOD[1]))

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

    def __init__(self):
        super().__init__((GOOD[0], POISON, GOOD[1]))

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

    def __init__(self):
        DoubleSpec.__init__(self, (GOOD[0], CRASH, GOOD[1]))

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

    def __init__(self):
        DoubleSpec.__init__(self, (GOOD[0], KILLED_ONCE, GOOD[1]))

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
