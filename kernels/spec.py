"""What every kernel family declares: its config space, launch key, oracle and trace ops.

A `KernelSpec` is the contract between a Triton kernel and the tuner. The tuner never
looks inside a kernel: it asks the spec which trace rows it serves (`problem_from_row`),
what a candidate costs in shared memory (`smem_bytes`), how to build seeded inputs and the
fp64 reference (`make_inputs`, `oracle`), and how to launch one config (`launch`).
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import textwrap
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable, Mapping, Sequence

import numpy as np


# ----------------------------------------------------------------------------- configs

@dataclass(frozen=True)
class Config:
    """One point of a config space: constexpr meta-parameters plus launch options."""

    meta: tuple[tuple[str, int], ...]
    num_warps: int = 4
    num_stages: int = 2

    @classmethod
    def make(cls, num_warps: int = 4, num_stages: int = 2, **meta: int) -> "Config":
        return cls(tuple(meta.items()), num_warps, num_stages)

    def __getitem__(self, name: str) -> int:
        for k, v in self.meta:
            if k == name:
                return v
        raise KeyError(name)

    @cached_property
    def kwargs(self) -> dict[str, int]:
        """Keyword arguments for `kernel[grid](..., **config.kwargs)`; built once per config
        because it is on every launch's path (unpack it, never mutate it)."""
        return {**dict(self.meta), "num_warps": self.num_warps, "num_stages": self.num_stages}

    def key(self) -> str:
        return ",".join(f"{k}={v}" for k, v in (*self.meta, ("num_warps", self.num_warps),
                                                  ("num_stages", self.num_stages)))

    def __str__(self) -> str:
        return self.key()

    @classmethod
    def parse(cls, text: str) -> "Config":
        items = dict(p.split("=", 1) for p in text.split(",") if p)
        warps = int(items.pop("num_warps", 4))
        stages = int(items.pop("num_stages", 2))
        return cls(tuple((k, int(v)) for k, v in items.items()), warps, stages)

    def project(self, launch_options: Sequence[str]) -> tuple:
        """What distinguishes this config on a device whose code depends on `launch_options`."""
        opts = tuple(getattr(self, o) for o in launch_options if hasattr(self, o))
        return (self.meta, opts)


# ----------------------------------------------------------------------------- launches

@dataclass(frozen=True)
class KeyDim:
    """A named runtime dimension of the launch key and the ladder that buckets it."""

    name: str
    ladder: str = "default"


def _freeze(value):
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


@dataclass(frozen=True)
class Problem:
    """One concrete launch: enough to build its inputs, run its oracle and launch it.

    `dtypes` is the seat's dtype signature, `flags` the code-path switches (bias present,
    causal), `dims` the launch-key values in the spec's key order, `extra` whatever else
    the launch needs (scalars, broadcast shapes), JSON-able.
    """

    kernel: str
    dtypes: tuple[str, ...]
    flags: tuple[tuple[str, str], ...]
    dims: tuple[int, ...]
    extra: tuple[tuple[str, Any], ...] = ()

    def get(self, name: str, default=None):
        for k, v in self.extra:
            if k == name:
                return v
        return default

    @property
    def volume(self) -> int:
        v = 1
        for d in self.dims:
            v *= d
        return v

    def order(self) -> tuple:
        """How shapes of one bucket are ordered: by size, then by dims."""
        return (self.volume, self.dims, self.extra)

    def to_json(self) -> str:
        return json.dumps({"kernel": self.kernel, "dtypes": list(self.dtypes),
                           "flags": dict(self.flags), "dims": list(self.dims),
                           "extra": dict(self.extra)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Problem":
        d = json.loads(text)
        return cls(d["kernel"], tuple(d["dtypes"]), tuple(sorted(d["flags"].items())),
                   tuple(d["dims"]), tuple(sorted((k, _freeze(v)) for k, v in d["extra"].items())))


@dataclass(frozen=True)
class NotServable:
    """A trace row naming an op this kernel serves, with shapes or params it cannot."""

    reason: str


def one_dtype(row, served: Sequence[str]) -> str | NotServable:
    """The one dtype of a row whose tensors must share it, if the kernel serves it."""
    if len(set(row.dtypes)) != 1:
        return NotServable(f"mixed dtypes {','.join(row.dtypes)}: the kernel takes one dtype")
    if row.dtypes[0] not in served:
        return NotServable(f"dtype {row.dtypes[0]} is not served ({', '.join(served)})")
    return row.dtypes[0]


def plain_row(row, op: str, tensors: int, served: Sequence[str]) -> str | NotServable:
    """The one dtype of a row of `op` that has `tensors` tensors and no params (the
    library's own ops, kernels/serving/custom_ops.py), if the kernel serves it."""
    if row.op.removesuffix(".default") != op:
        return NotServable(f"{row.op}: overload not served")
    if len(row.shapes) != tensors:
        return NotServable(f"{op} takes {tensors} tensors, the row has {len(row.shapes)}")
    if row.params:
        return NotServable(f"{op}: unsupported params {', '.join(sorted(row.params))}")
    return one_dtype(row, served)


def float_params(row, *names: str) -> tuple | NotServable:
    """A row's float params `names` (None where absent), or why its params cannot be read."""
    try:
        return tuple(row.params.float(n, None) for n in names)
    except ValueError as e:
        return NotServable(f"unreadable params: {e}")


# ----------------------------------------------------------------------------- the spec

class KernelSpec:
    """Base class of a kernel family's declaration. Subclasses fill in the class attributes
    and override the methods; `kernels/matmul/` is the reference example."""

    name: str = ""
    ops: tuple[str, ...] = ()  # trace ops served: `aten.mm`, `aten.add.Tensor`
    key: tuple[KeyDim, ...] = ()
    dtypes: tuple[str, ...] = ()  # element dtypes the kernel claims
    description: str = ""
    # Outputs may differ in their last bits from launch to launch (float atomics): the
    # screen then allows it, and the certificate says so. Otherwise two launches on the
    # same inputs must agree bit for bit.
    run_to_run_variation: bool = False
    # The config space, and the defaults served before a seat is certified, most preferred
    # first. Declared as data; a spec that computes them overrides `configs()` and
    # `default_preference()` instead, which are what the tuner and the launch read.
    config_space: Sequence[Config] = ()
    default_configs: Sequence[Config] = ()
    # True for a row kernel: its default is the first whose BLOCK holds the row (dims[0]).
    default_holds_row: bool = False
    # Data movement (copies, casts, gathers, fills): the oracle is exact, and the screen
    # compares every output bit for bit (a tolerance of 0) in every dtype.
    exact: bool = False
    # How a candidate is timed (tuner/timing/benchmarkers.py): "launch", each launch alone behind a
    # flushed L2; "stream", launches back to back from CUDA graphs on warm and rotating
    # operand sets, as a model runs under graphs. Part of the source hash: a change re-tunes the seats.
    timing: str = "launch"

    # -- declared by each family
    def configs(self) -> Sequence[Config]:
        if not self.config_space:
            raise NotImplementedError(f"{type(self).__name__} declares no config_space")
        return self.config_space

    def default_config(self, profile, problem: Problem) -> Config:
        """The config served when a seat has no certificate: the first declared default
        that passes the profile's static prune (with `default_holds_row`, the first of
        those whose BLOCK holds the row, else the last of them); else the last default."""
        defaults = self.default_preference()
        admitted = [c for c in defaults if not self.static_refusal(profile, c, problem)]
        if not admitted:
            return defaults[-1]
        if self.default_holds_row:
            return next((c for c in admitted if c["BLOCK"] >= problem.dims[0]), admitted[-1])
        return admitted[0]

    def default_preference(self) -> Sequence[Config]:
        if not self.default_configs:
            raise NotImplementedError(f"{type(self).__name__} declares no default_configs")
        return self.default_configs

    def smem_bytes(self, config: Config, problem: Problem) -> int:
        return 0

    def problem_from_row(self, row) -> Problem | NotServable:
        raise NotImplementedError

    def make_inputs(self, problem: Problem, rng: np.random.Generator) -> dict[str, tuple[np.ndarray, str]]:
        """Seeded random inputs: name -> (values, dtype name). Values are floating (float64,
        or float32 where the dtype has no more bits, which is cheaper to sample at GEMM
        sizes: `uniform_inputs`) or an integer array for integer dtypes; the
        screen casts them to the dtype, and the oracle sees exactly the rounded values the
        kernel sees."""
        raise NotImplementedError

    def oracle(self, problem: Problem, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The fp64 reference outputs (calls `nbx_tune.oracles`), by output name."""
        raise NotImplementedError

    def output_specs(self, problem: Problem) -> dict[str, tuple[tuple[int, ...], str]]:
        """Output name -> (shape, dtype name)."""
        raise NotImplementedError

    def launch(self, config: Config, problem: Problem, inputs: Mapping[str, Any],
               outputs: Mapping[str, Any]) -> None:
        """Launch `config` writing into `outputs` (torch tensors, poisoned by the screen)."""
        raise NotImplementedError

    def example_rows(self, scale: str) -> list:
        """Trace rows (`nbx_tune.kernels.rows.make_row`) that exercise the kernel in every
        dtype it claims, at deliberately odd shapes: scale "small" runs in seconds on the
        interpreter, "gpu" sits around real sizes. The self-check runs them against the
        oracle (tests on the interpreter, proofs/gpu_check.py on a GPU)."""
        return []

    def serve_ops(self) -> Mapping[str, Callable]:
        """How `nbx_tune.serve()` runs this family: aten op (`aten.mm`, `aten.add.Tensor`;
        the default overload may be written without `.default`) -> a function taking the
        op's arguments as the dispatcher passes them (positional ones by position, kwarg-only
        ones by schema name when not defaulted; a Python number stays a number) and
        returning what the op returns, through the family's public ops, so the launch uses
        the same seat a trace row of that op maps to. It raises `KernelError` before
        launching anything when it does not serve the arguments; serve() then runs torch and
        counts the reason. Ops beyond `ops` may appear where a composite reaches the same
        seats (`aten.layer_norm` for `aten.native_layer_norm`)."""
        return {}

    def source_parts(self) -> Sequence[Callable]:
        """The code whose change makes certificates stale: the jitted kernel(s) and the
        launcher. Comments elsewhere in the module do not count."""
        raise NotImplementedError

    # -- derived
    def seat_dims(self, problem: Problem) -> dict[str, int]:
        return dict(zip((d.name for d in self.key), problem.dims))

    def operand_bytes(self, problem: Problem) -> int:
        """Bytes of inputs and outputs at their dtypes: what the screen's budget counts."""
        total = 0
        for shape, dt in (*self.input_shapes(problem).values(), *self.output_specs(problem).values()):
            n = 1
            for d in shape:
                n *= d
            total += n * dtype_size(dt)
        return total

    def input_shapes(self, problem: Problem) -> dict[str, tuple[tuple[int, ...], str]]:
        raise NotImplementedError

    def resized(self, problem: Problem, dims: tuple[int, ...]) -> Problem | None:
        """`problem` moved to the values of `dims` it can take (the screen's tile-edge shapes;
        a dim the family cannot move keeps its value), or None where they would change the
        seat's flags or the family cannot tell: then the seat is screened at the shapes
        seen only."""
        return None

    def static_refusal(self, profile, config: Config, problem: Problem) -> tuple[str, str] | None:
        """(reason, detail) when the profile rules a config out before any launch."""
        if config.num_stages > profile.max_num_stages:
            return ("stages_over_max",
                    f"num_stages {config.num_stages} > pipelining.max_num_stages {profile.max_num_stages}")
        smem = self.smem_bytes(config, problem)
        budget = profile.memory.max_shared_memory_per_block
        if smem > budget:
            return ("smem_over_budget",
                    f"estimated {smem} bytes of shared memory > max_shared_memory_per_block {budget}")
        return None

    @cached_property
    def source_hash(self) -> str:
        h = code_hash(self.source_parts())
        # "launch" leaves every hash as it was before timing was declared.
        return h if self.timing == "launch" else hashlib.sha256(f"{h} timing={self.timing}".encode()).hexdigest()[:16]

    @cached_property
    def config_space_hash(self) -> str:
        h = hashlib.sha256("\n".join(c.key() for c in self.configs()).encode())
        return h.hexdigest()[:16]


def code_hash(parts: Sequence[Callable]) -> str:
    """A hash of what the parts' code does, not of its text: each part's syntax tree with
    docstrings dropped (comments and formatting never reach the tree), so tidying a kernel
    does not stale its certificates while any change to what it computes does. A
    JITFunction and the interpreter's InterpretedFunction both wrap the function as `.fn`,
    so the hash is the same on either."""
    h = hashlib.sha256()
    for part in parts:
        h.update(_canonical(without_docstrings(ast.parse(part_source(part)))).encode())
    return h.hexdigest()[:16]


def part_source(part: Callable) -> str:
    """A source part's own text (a jitted kernel's through its `.fn`), dedented to parse."""
    return textwrap.dedent(inspect.getsource(getattr(part, "fn", part)))


def without_docstrings(tree: ast.AST) -> ast.AST:
    """`tree` with the docstring of every function, class and module in it dropped (in place).
    Stdlib `ast` only: lab/ast_source_hash runs this same text under another Python."""
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module))
                and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return tree


def _canonical(node) -> str:
    """A syntax tree as text, the same on every Python: `ast.dump` is not (3.12 writes the
    empty `type_params` 3.11 has no field for), so fields that are None or empty are left out."""
    if isinstance(node, ast.AST):
        fields = (f"{k}={_canonical(v)}" for k, v in ast.iter_fields(node) if v is not None and v != [])
        return f"{type(node).__name__}({','.join(fields)})"
    if isinstance(node, list):
        return "[" + ",".join(_canonical(v) for v in node) + "]"
    return repr(node)


DTYPE_SIZES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "uint8": 1,
               "int16": 2, "int32": 4, "int64": 8, "bool": 1}


def uniform_inputs(rng: np.random.Generator, shape, scale: float = 1.0) -> np.ndarray:
    """float32 values uniform in [-scale, scale): the input of a GEMM-sized screen. Zero
    mean like a normal sample, and an order of magnitude cheaper to draw than normal
    float64 samples, which cost seconds of a GEMM census."""
    import torch  # here: this module is imported before torch (tuner/commands.py)

    x = rng.random(shape, dtype=np.float32)
    torch.from_numpy(x).mul_(2 * scale).sub_(scale)  # in place, on torch's threads: numpy's is one
    return x


def wide_range_inputs(rng: np.random.Generator, shape, lo: float, hi: float) -> np.ndarray:
    """float64 normal values scaled by 2^u, u uniform in [lo, hi): magnitudes over the whole
    range of a cast. The scaling is torch's, in place on its threads: numpy's 2.0 ** u took
    3.2 s of a 268M-element KV cache's draw on 16 cores."""
    import torch

    x = rng.standard_normal(shape)
    torch.from_numpy(x).mul_(torch.from_numpy(rng.uniform(lo, hi, shape)).exp2_())
    return x


def dtype_size(name: str) -> int:
    return DTYPE_SIZES[name]


def seat_flags(**flags) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, str(v)) for k, v in flags.items()))


# ----------------------------------------------------------------------------- seat keys
# One text encoding of a seat's parts, shared by the store's columns, exported tables and
# the launch-time read.

Bucket = tuple[tuple[int, int], ...]


def encode_dtypes(dtypes: Sequence[str]) -> str:
    return ",".join(dtypes)


def encode_flags(flags: Sequence[tuple[str, str]]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(flags)) or "-"


def decode_flags(text: str) -> tuple[tuple[str, str], ...]:
    if text in ("", "-"):
        return ()
    return tuple(sorted(tuple(p.split("=", 1)) for p in text.split(",")))


def encode_bucket(key: Sequence[KeyDim], bucket: Bucket) -> str:
    return ",".join(f"{d.name}={lo}" if lo == hi else f"{d.name}={lo}..{hi}"
                    for d, (lo, hi) in zip(key, bucket))


def decode_bucket(key: Sequence[KeyDim], text: str) -> Bucket:
    parts = dict(p.split("=", 1) for p in text.split(","))
    out = []
    for d in key:
        lo, sep, hi = parts[d.name].partition("..")
        out.append((int(lo), int(hi) if sep else int(lo)))
    return tuple(out)


def bucket_of(profile, key: Sequence[KeyDim], dims: Sequence[int]) -> Bucket:
    return tuple(profile.ladder(d.ladder).bucket(v) for d, v in zip(key, dims))


def label_of(kernel: str, dtypes: str, flags: str, bucket: str) -> str:
    """The human form of a seat from its encoded parts (the store's columns, a table's
    fields): `matmul|float16|aligned=16,bias=0|B=1,M=497..512,N=4096,K=4096`."""
    return "|".join((kernel, dtypes, flags, bucket))


def split_label(label: str) -> tuple[str, str, str, str] | None:
    """`label_of`'s parts back, or None when `label` is not a seat's label."""
    parts = label.split("|")
    return tuple(parts) if len(parts) == 4 else None


def seat_label(kernel: str, dtypes, flags, key, bucket: Bucket) -> str:
    """`label_of` from a seat's decoded parts."""
    return label_of(kernel, encode_dtypes(dtypes), encode_flags(flags), encode_bucket(key, bucket))
