"""Study: what a call of an op of the library's own costs on the host, by how it is defined.

An op whose body is a clone, called 20000 times, under no_grad and inference_mode:
torch's clone itself, `torch.library.custom_op` with and without a registered backward,
and a plain `torch.library.Library("...", "DEF")` op with a CompositeExplicitAutograd body.
The difference is the dispatcher's path to the Python body: custom_op puts a Python autograd
layer in front of it. Microseconds per call.

    python3 lab/serve_eager_profile/op_definition_cost.py
"""

import time

import torch
from torch import Tensor


@torch.library.custom_op("nbx_study::with_backward", mutates_args=())
def with_backward(x: Tensor) -> Tensor:
    return x.clone()


with_backward.register_autograd(lambda ctx, g: g)


@torch.library.custom_op("nbx_study::no_backward", mutates_args=())
def no_backward(x: Tensor) -> Tensor:
    return x.clone()


LIB = torch.library.Library("nbx_study_def", "DEF")
LIB.define("plain(Tensor x) -> Tensor")
LIB.impl("plain", lambda x: x.clone(), "CompositeExplicitAutograd")


def per_call_us(f, ctx, x, n=20000):
    with ctx():
        for _ in range(1000):
            f(x)
        t0 = time.perf_counter()
        for _ in range(n):
            f(x)
        return (time.perf_counter() - t0) / n * 1e6


def main():
    x = torch.randn(4)
    ops = {"clone": lambda t: t.clone(), "custom_op + backward": torch.ops.nbx_study.with_backward,
           "custom_op": torch.ops.nbx_study.no_backward, "Library DEF": torch.ops.nbx_study_def.plain}
    print(f"{'op':<22}{'no_grad':>10}{'inference':>11}   (us per call, torch {torch.__version__})")
    for name, f in ops.items():
        print(f"{name:<22}{per_call_us(f, torch.no_grad, x):>10.2f}{per_call_us(f, torch.inference_mode, x):>11.2f}")


if __name__ == "__main__":
    main()
