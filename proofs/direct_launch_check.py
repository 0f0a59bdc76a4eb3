"""GPU proof of the direct launch (kernels/runtime/launch.py), every kernel family: a call's replay of
its compiled kernels is bit-identical to its launch through Triton, on the same data and on
new data in the same buffers (and within the fp64 reference's tolerance), and a call that
differs in anything Triton compiles for (dtype, strides, a pointer off 16-byte alignment,
integers equal to 1 or divisible by 16, a broadcast bias, integer alpha/beta) is never
served another call's replay: its first call goes through Triton. All cases run in one
process, every dtype, so each replay is found among all the others.

    python proofs/direct_launch_check.py
    python proofs/direct_launch_check.py --device cpu     # a smoke run under the interpreter
"""

from __future__ import annotations

import math
import sys

from nbx_tune.testing.bench import environment, save, table  # noqa: E402

DEV = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cuda"  # cpu: a smoke run
if DEV == "cpu":
    import os

    os.environ["TRITON_INTERPRET"] = "1"
RTOL = {"float16": 2e-2, "bfloat16": 4e-2, "float32": 1e-4}
WIDE_CASE = "mm 512x4096x11008"


def matmul_cases(torch, buf):
    from nbx_tune.kernels import addmm, baddbmm, bmm, mm

    def ref(op):
        if op in (mm, bmm):
            return lambda a, b: a @ b
        return lambda x, a, b, alpha=1.0, beta=1.0: beta * x + alpha * (a @ b)

    return [(name, op, args, kw, ref(op)) for name, op, args, kw in [
        ("mm 37x23x45", mm, (buf(37, 23), buf(23, 45)), {}),
        ("mm aligned 64x64x64", mm, (buf(64, 64), buf(64, 64)), {}),
        ("mm a off 16B", mm, (buf(64, 64, offset=1), buf(64, 64)), {}),
        ("mm M=1", mm, (buf(1, 256), buf(256, 512)), {}),
        ("mm N=1", mm, (buf(300, 256), buf(256, 1)), {}),
        ("mm K=1", mm, (buf(33, 1), buf(1, 47)), {}),
        ("mm K=16", mm, (buf(33, 16), buf(16, 47)), {}),
        ("mm transposed", mm, (buf(45, 37).t(), buf(64, 45).t()), {}),
        ("addmm bias (N,)", addmm, (buf(45), buf(37, 23), buf(23, 45)), {"alpha": 2, "beta": 1}),
        ("addmm bias (M,N) alpha=1", addmm, (buf(37, 45), buf(37, 23), buf(23, 45)), {"alpha": 1, "beta": 3}),
        ("addmm bias off", addmm, (buf(45, offset=3), buf(37, 23), buf(23, 45)), {"beta": 0.5}),
        ("bmm 3x19x23x31", bmm, (buf(3, 19, 23), buf(3, 23, 31)), {}),
        ("baddbmm bias (B,1,N)", baddbmm, (buf(3, 1, 31), buf(3, 19, 23), buf(3, 23, 31)), {"alpha": 0.25}),
        ("baddbmm bias (N,)", baddbmm, (buf(31), buf(3, 19, 23), buf(3, 23, 31)), {}),
        # Rotary's inv_freq @ positions (float32 in the model): a decode step's and a batch's
        # with inv_freq broadcast over it, staged (aligned=0) by the copy and fill kernels.
        ("bmm rotary decode 1x64x1 @ 1x1x1", bmm, (buf(1, 64, 1), buf(1, 1, 1)), {}),
        ("bmm rotary 3x64x1 broadcast @ 3x1x7", bmm, (buf(1, 64, 1).expand(3, 64, 1), buf(3, 1, 7)), {}),
        ("mm W.t() odd K 37x23x45", mm, (buf(37, 23), buf(45, 23).t()), {}),
        # Rows 8 elements apart (aligned=8 in fp16/bf16, 4 in fp32: hinted, not copied).
        ("mm rows of 8 37x24x40", mm, (buf(37, 24), buf(24, 40)), {}),
        ("baddbmm rows of 8 bias (B,1,N)", baddbmm, (buf(3, 1, 40), buf(3, 19, 24), buf(3, 24, 40)), {}),
        ("addmm bias (N,) aligned", addmm, (buf(48), buf(37, 32), buf(32, 48)), {"alpha": 2, "beta": 1}),
        ("baddbmm bias (B,1,N) aligned", baddbmm, (buf(3, 1, 48), buf(3, 19, 32), buf(3, 32, 48)),
         {"alpha": 0.25}),
        ("mm 512x4096x4096", mm, (buf(512, 4096), buf(4096, 4096)), {}),
        # Llama-2-7B's up projection: the shipped hopper table serves bf16 a tile 192 wide
        # (EXTRA_N) loaded through TMA descriptors, made around each call's operands.
        (WIDE_CASE, mm, (buf(512, 4096), buf(4096, 11008)), {}),
    ]][: -2 if DEV == "cpu" else None]  # the interpreter takes minutes over the big ones


def family_cases(torch, buf):
    """One op of every other family, at odd shapes, and the same call with its strides or a
    pointer's alignment changed (other dtypes come from running every dtype)."""
    import torch.nn.functional as F

    from nbx_tune import kernels as K
    from nbx_tune.kernels.serving import custom_ops
    from nbx_tune.kernels.softmax import softmax

    def t4(*shape):  # the last two dims' strides swapped
        return buf(*shape[:-2], shape[-1], shape[-2]).transpose(-1, -2)

    q, k, v = (1, 4, 37, 64), (1, 2, 45, 64), (1, 2, 45, 64)  # grouped-query heads
    return [
        ("silu 37x45", K.silu, (buf(37, 45),), {}, F.silu),
        ("silu 37x45 off 16B", K.silu, (buf(37, 45, offset=1),), {}, F.silu),
        ("mul 37x45 * 45", K.mul, (buf(37, 45), buf(45)), {}, torch.mul),
        ("mul 37x45 * 45 off 16B", K.mul, (buf(37, 45), buf(45, offset=3)), {}, torch.mul),
        ("mul transposed * 45", K.mul, (t4(37, 45), buf(45)), {}, torch.mul),
        ("mul x * x", K.mul, (buf(37, 45),) * 2, {}, torch.mul),
        ("add 37x45 + 2", K.add, (buf(37, 45), 2), {}, torch.add),
        ("sdpa causal 1x4x37x64, 2 kv heads", K.scaled_dot_product_attention, (buf(*q), buf(*k), buf(*v)),
         {"is_causal": True}, lambda *a, **kw: F.scaled_dot_product_attention(*a, enable_gqa=True, **kw)),
        ("sdpa q transposed", K.scaled_dot_product_attention, (t4(*q), buf(*k), buf(*v)),
         {"is_causal": True}, lambda *a, **kw: F.scaled_dot_product_attention(*a, enable_gqa=True, **kw)),
        ("layer_norm 37x45", K.layer_norm, (buf(37, 45), (45,), buf(45), buf(45)), {}, F.layer_norm),
        ("layer_norm 37x45 off 16B", K.layer_norm, (buf(37, 45, offset=1), (45,), buf(45), buf(45)), {},
         F.layer_norm),
        ("rms_norm 37x48", K.rms_norm, (buf(37, 48), (48,), buf(48)), {}, F.rms_norm),
        ("group_norm 3x8x37", K.group_norm, (buf(3, 8, 37), 4, buf(8), buf(8)), {}, F.group_norm),
        ("softmax 37x45", softmax, (buf(37, 45), -1), {}, torch.softmax),
        ("softmax 37x45 dim 0", softmax, (buf(37, 45), 0), {}, torch.softmax),
        ("sum 37x4099 dim 1", K.sum, (buf(37, 4099), 1), {}, torch.sum),
        ("sum transposed dim 1", K.sum, (t4(37, 4099), 1), {}, torch.sum),
        ("conv2d 2x3x11x13 3x3 pad 1", K.conv2d, (buf(2, 3, 11, 13), buf(8, 3, 3, 3), buf(8)), {"padding": 1},
         F.conv2d),
        ("conv2d x transposed", K.conv2d, (t4(2, 3, 11, 13), buf(8, 3, 3, 3), buf(8)), {"padding": 1}, F.conv2d),
        ("conv2d depthwise 2x8x11x13", K.conv2d, (buf(2, 8, 11, 13), buf(8, 1, 3, 3)), {"groups": 8}, F.conv2d),
        ("_to_copy 37x45 to float32", K._to_copy, (buf(37, 45),), {"dtype": torch.float32},
         lambda x, dtype: x.to(dtype)),
        ("clone 37x45 off 16B", K.clone, (buf(37, 45, offset=1),), {}, torch.clone),
        ("cat 3x5x7, 3x2x7 dim 1", lambda x, y, dim: K.cat([x, y], dim), (buf(3, 5, 7), buf(3, 2, 7)), {"dim": 1},
         lambda x, y, dim: torch.cat([x, y], dim)),
        ("cat 8x3x1x37 twice dim -1 (one tensor)", lambda x, dim: K.cat([x, x], dim), (buf(8, 3, 1, 37),),
         {"dim": -1}, lambda x, dim: torch.cat([x, x], dim)),
        # eps 100 keeps var + eps positive whatever the random statistics
        ("batch_norm 2x8x11x13", lambda x, m, v, w, b, eps: K.batch_norm(x, w, b, m, v, False, 0.1, eps),
         (buf(2, 8, 11, 13), buf(8), buf(8), buf(8), buf(8)), {"eps": 100.0},
         lambda x, m, v, w, b, eps: F.batch_norm(x, m, v, w, b, False, 0.1, eps)),
        ("max_pool2d 2x3x11x13 3x3/2 pad 1", lambda x, **kw: K.max_pool2d_with_indices(x, **kw)[0],
         (buf(2, 3, 11, 13),), {"kernel_size": 3, "stride": 2, "padding": 1}, lambda x, **kw: F.max_pool2d(x, **kw)),
        # q as a model makes it, a (B, S, H, D) projection viewed as (B, H, S, D); cos of a batch of 1
        ("rotary 2x4x7x64 transposed", K.rotary, (buf(2, 7, 4, 64).transpose(1, 2), buf(1, 7, 64), buf(1, 7, 64)),
         {}, custom_ops.rotary),
        ("rotary x off 16B", K.rotary, (buf(2, 7, 4, 64, offset=1).transpose(1, 2), buf(1, 7, 64), buf(1, 7, 64)),
         {}, custom_ops.rotary),
        ("rotary contiguous 1x3x5x10", K.rotary, (buf(1, 3, 5, 10), buf(1, 5, 10), buf(1, 5, 10)), {},
         custom_ops.rotary),
        # q and k in one launch (k: 2 heads, its own region of the grid); the check reads k's output
        ("rotary_qk k of 2x2x7x64", lambda *a: K.rotary_qk(*a)[1],
         (buf(2, 7, 4, 64).transpose(1, 2), buf(2, 7, 2, 64).transpose(1, 2), buf(1, 7, 64), buf(1, 7, 64)),
         {}, lambda *a: custom_ops.rotary_qk(*a)[1]),
        ("silu_mul 37x45", K.silu_mul, (buf(37, 45), buf(37, 45)), {}, custom_ops.silu_mul),
        ("silu_mul up off 16B", K.silu_mul, (buf(37, 45), buf(37, 45, offset=3)), {}, custom_ops.silu_mul),
        # the normed output, then the sum (the launch's second store); a row past one block
        ("add_rms_norm 5x4097", lambda *a: K.add_rms_norm(*a)[0], (buf(5, 4097), buf(5, 4097), buf(4097), 1e-6), {},
         lambda *a: custom_ops.add_rms_norm(*a)[0]),
        # int64 positions (every other column), float32 frequencies; `like` carries the tables' dtype
        ("rope_cos_sin strided positions", lambda p, f, like: K.rope_cos_sin(p, f, 1.0, like.dtype)[1],
         (buf(3, 14, dt=torch.int64)[:, ::2], buf(24, dt=torch.float32), buf(1)), {},
         lambda p, f, like: custom_ops.rope_cos_sin(p, f, 1.0, like.dtype)[1]),
        # a decode step's KV cache grown, the new states transposed views; the values' output
        ("cat_kv 3x2x9x40 + 1", lambda *a: K.cat_kv(*a, -2)[1],
         (buf(3, 2, 9, 40), buf(3, 1, 2, 40).transpose(1, 2), buf(3, 2, 9, 40), buf(3, 1, 2, 40).transpose(1, 2)), {},
         lambda *a: custom_ops.cat_kv(*a, -2)[1]),
        ("add_layer_norm sum 7x20000", lambda *a: K.add_layer_norm(*a)[1],
         (buf(7, 20000), buf(7, 20000), buf(20000), buf(20000), 1e-5), {}, lambda *a: custom_ops.add_layer_norm(*a)[1]),
    ]


def main() -> None:
    import torch

    from nbx_tune.kernels.runtime import certified, launch
    from nbx_tune.kernels.matmul import _FLAGS, SPEC, alignment, extra_columns, uses_tma, vector_elems

    through = launch.through_triton
    launched = [0]

    def counting(*a):  # launches through Triton: a call served a replay makes none
        launched[0] += 1
        return through(*a)

    launch.through_triton = counting
    g = torch.Generator(device=DEV).manual_seed(0)
    rows, report, failures = [], [], 0
    dtypes = (("float16", torch.float16), ("bfloat16", torch.bfloat16), ("float32", torch.float32))
    all_cases, expect_replays = [], 0
    for dtname, dt in dtypes[2:] if DEV == "cpu" else dtypes:  # the interpreter: fp32 only, and quickly

        def buf(*shape, offset=0, dt=dt):
            flat = torch.empty(offset + math.prod(shape), device=DEV, dtype=dt)
            return flat[offset:].view(*shape)

        for name, op, args, kw, ref in matmul_cases(torch, buf) + family_cases(torch, buf):
            tensors = [t for t in args if isinstance(t, torch.Tensor)]
            if op.__module__.startswith("nbx_tune.kernels.matmul"):  # aligned=0 under a TMA tile: staged into descriptors
                a, b = tensors[-2:]
                aligned = alignment(a.stride(), b.stride(), b.shape[-1], a.shape[-1], vector_elems(dt))
                dims = (a.shape[0] if a.dim() == 3 else 1, a.shape[-2], b.shape[-1], a.shape[-1])
                bias = len(tensors) == 3 and kw.get("beta", 1) != 0
                replayable = aligned > 0 or not uses_tma(certified.config_for(SPEC, (dtname,), _FLAGS[bias, aligned, "nn"],
                                                                               dims))
            else:
                replayable = True
            all_cases.append((dtname, name, op, args, kw, ref, replayable))
            expect_replays += replayable
    certified.reload()

    def fill(args):  # new data; a broadcast operand's goes into its base
        for t in args:
            if isinstance(t, torch.Tensor):
                t = t if 0 not in t.stride() else t._base
                t.copy_(torch.randn(t.shape, device=DEV, generator=g))

    first, through_triton = [], []
    for dtname, name, op, args, kw, ref, replayable in all_cases:
        fill(args)
        n0 = launched[0]
        first.append(op(*args, **kw))
        through_triton.append(launched[0] > n0)  # not served by an earlier call's replay
    remembered = len(launch.REMEMBERED)
    for i in reversed(range(len(all_cases))):  # reversed: each replay found among all the others
        dtname, name, op, args, kw, ref, replayable = all_cases[i]
        n0 = launched[0]
        same = torch.equal(op(*args, **kw), first[i])
        replayed = launched[0] == n0
        fill(args)
        got = op(*args, **kw)
        saved = dict(launch.REMEMBERED)
        launch.REMEMBERED.clear()
        new_same = torch.equal(got, op(*args, **kw))  # Triton's launch on the new data
        launch.REMEMBERED.clear()
        launch.REMEMBERED.update(saved)
        want = ref(*[t.double() if isinstance(t, torch.Tensor) else t for t in args], **kw)
        err = ((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()
        ok = same and new_same and through_triton[i] and err <= RTOL[dtname] and (
            DEV == "cpu" or replayed == replayable)
        failures += not ok
        rows.append([dtname, name, "yes" if through_triton[i] else "NO", "yes" if replayed else "no",
                     "yes" if same and new_same else "NO", f"{err:.1e}", "ok" if ok else "FAIL"])
        report.append({"dtype": dtname, "case": name, "first_through_triton": through_triton[i],
                       "replayed": replayed, "expected_replay": replayable, "bit_identical": same and new_same,
                       "err": err, "ok": ok})
    if DEV != "cpu" and remembered != expect_replays:
        failures += 1
        print(f"FAIL: {remembered} replays remembered for {expect_replays} replayable cases; "
              f"not remembered: {dict(launch.REFUSED)}")
    if DEV != "cpu":
        # The wide case must have run a 192-wide TMA tile in bf16, or it proved nothing about them.
        seat = (SPEC.name, ("bfloat16",), _FLAGS[0, 16, "nn"], (1, 512, 11008, 4096))
        served = certified.config_for(SPEC, *seat[1:])
        print(f"{WIDE_CASE} bfloat16 served {served}")
        if certified.state().memo[seat][1] is not None:
            print(f"NOT CHECKED {WIDE_CASE}: no current certificate for its seat (re-certify hopper.json)")
        elif not (extra_columns(served) and uses_tma(served)):
            failures += 1
            print(f"FAIL {WIDE_CASE}: the shipped table did not serve a TMA tile with EXTRA_N")
    env = environment()
    save("direct_launch_check.json", {"env": env, "checks": report, "failures": failures,
                                      "not_remembered": dict(launch.REFUSED)})
    print(f"{env['date']} {env['gpu']} driver {env['driver']} Triton {env['triton']} torch {env['torch']}")
    print(table(rows[::-1], ["dtype", "case", "1st via Triton", "replayed", "replay == Triton", "err vs fp64",
                             "result"]))
    print(f"{len(report)} checks, {failures} failures")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
