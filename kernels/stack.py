"""`aten.stack` (a rotary table built by stacking cos and sin, a model's stacked masks): the
concatenation of the tensors each given a new dim of 1 at `dim`, so the cat family's
kernels and launcher (kernels/copy.py) with their config space, at seats of its own:
a trace's stack rows certify the launches serve() makes for stack."""

from __future__ import annotations

import dataclasses

import torch

from nbx_tune.errors import KernelError
from nbx_tune.kernels.copy import CatSpec, TORCH_DTYPES, launch_cat
from nbx_tune.kernels.rows import make_row
from nbx_tune.kernels.runtime import launch
from nbx_tune.kernels.runtime.certified import config_for
from nbx_tune.kernels.spec import NotServable, seat_flags

_NAMES = {v: k for k, v in TORCH_DTYPES.items()}


def _unsqueezed(shape, dim: int) -> tuple[tuple[int, ...], int] | str:
    """(shape with a 1 at dim, dim in [0, rank]) or why not."""
    rank = len(shape) + 1
    if not -rank <= dim < rank:
        return f"dim {dim} out of range for stacking rank {rank - 1}"
    dim %= rank
    return (*shape[:dim], 1, *shape[dim:]), dim


class StackSpec(CatSpec):
    name = "stack"
    ops = ("aten.stack",)
    description = "torch.stack: a cat of the tensors with a new dim"

    def problem_from_row(self, row):
        if row.op.removesuffix(".default") != "aten.stack":
            return NotServable(f"{row.op}: overload not served")
        if not row.shapes or len(set(map(tuple, row.shapes))) != 1:
            return NotServable("aten.stack: tensors of one shape are served (torch raises otherwise)")
        got = _unsqueezed(tuple(row.shapes[0]), row.params.int("dim", 0))
        if isinstance(got, str):
            return NotServable(got)
        shape, dim = got
        problem = super().problem_from_row(make_row("aten.cat", row.dtypes, [shape] * len(row.shapes),
                                                    {"dim": str(dim)}))
        return problem if isinstance(problem, NotServable) else dataclasses.replace(problem, kernel=self.name)

    def serve_ops(self):
        return {"aten.stack": stack}

    def example_rows(self, scale):
        if scale == "small":
            cases = (([(3, 7, 5)] * 2, "-1"), ([(13,)] * 3, "0"), ([(2, 9)] * 2, "1"))
            dts = ("float16", "float32", "int64")
        else:
            cases = (([(1, 512, 64)] * 2, "-1"), ([(4096,)] * 8, "0"), ([(32, 1023, 128)] * 2, "1"))
            dts = (*TORCH_DTYPES,)
        return [make_row("aten.stack", [dt] * len(shapes), shapes, {"dim": dim})
                for dt in dts if dt != "bool" for shapes, dim in cases]


SPEC = StackSpec()
SPECS = (SPEC,)


def stack(tensors, dim: int = 0) -> torch.Tensor:
    """aten.stack: tensors of one shape and dtype joined along a new dim."""
    tensors = tuple(tensors)
    if not tensors or not all(isinstance(t, torch.Tensor) for t in tensors):
        raise KernelError("stack: no tensors, or an operand that is not one")
    if len({t.dtype for t in tensors}) != 1 or _NAMES.get(tensors[0].dtype) is None:
        raise KernelError("stack: mixed or unserved dtypes (torch promotes or refuses)")
    if len({tuple(t.shape) for t in tensors}) != 1 or len({t.device for t in tensors}) != 1:
        raise KernelError("stack: tensors of other shapes or devices (torch raises)")
    got = _unsqueezed(tuple(tensors[0].shape), dim)
    if isinstance(got, str):
        raise KernelError(f"stack: {got} (torch raises)")
    shape, dim = got
    out_shape = (*shape[:dim], len(tensors), *shape[dim + 1:])
    out = launch.empty(out_shape, tensors[0].dtype, tensors[0].device)
    if out.numel() == 0:
        return out
    config = config_for(SPEC, (_NAMES[out.dtype],), seat_flags(), (out.numel(),))
    try:
        launch_cat([t.unsqueeze(dim) for t in tensors], out, dim, config)
    except ValueError as e:
        raise KernelError(f"stack: {e}") from None
    return out
