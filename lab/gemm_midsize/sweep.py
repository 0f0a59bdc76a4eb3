"""Configs outside matmul's space at the mid-size GEMM shapes still below torch (48-128
tiles of 128 x 128 for 132 SMs): 8-warp tiles (two warpgroups per program), 128 x 64 tiles,
deeper pipelines, persistent 8-warp tiles, against the space's best and torch, timed side by
side under CUDA graphs. Usage (GPU): python3 lab/gemm_midsize/sweep.py; writes
$OUT/gemm_midsize.json."""

from __future__ import annotations

import sys


SHAPES = [(1000, 1024, 4096), (800, 1536, 1536), (800, 1536, 8960), (800, 8960, 1536), (1024, 768, 3072),
          (1024, 2304, 768), (64, 4096, 4096)]


def candidates():
    from nbx_tune.kernels.matmul import _c

    return [_c(128, 64, 64, 8, 4, tma=1), _c(128, 64, 64, 8, 3, tma=1), _c(128, 64, 64, 4, 4, tma=1),
            _c(128, 64, 128, 8, 3, tma=1), _c(64, 128, 64, 8, 4, tma=1), _c(64, 128, 64, 8, 5, tma=1),
            _c(64, 128, 128, 4, 3, tma=1), _c(64, 128, 32, 4, 6, tma=1), _c(64, 64, 64, 4, 5, tma=1),
            _c(128, 64, 64, 8, 4), _c(64, 128, 64, 8, 4),
            _c(128, 64, 64, 8, 4, tma=1, sched=1, flatten=1), _c(64, 128, 64, 8, 4, tma=1, sched=1, flatten=1),
            _c(128, 128, 64, 8, 4, tma=1, sched=1, flatten=1, ws=1)]


def main() -> int:
    from nbx_tune.lab.gemm_persistent.space import save, time_shape

    from nbx_tune.kernels import matmul as MM
    from nbx_tune.profiles import get_profile
    from nbx_tune.kernels.trace import make_row

    hopper = get_profile("hopper")
    new = candidates()
    names = {str(c) for c in new}
    out = []
    for m, n, k in SHAPES:
        p = MM.SPEC.problem_from_row(make_row("aten.mm", ["bfloat16"] * 2, [(m, k), (k, n)]))
        t, bad = time_shape(m, n, k, [c for c in (*MM.CONFIGS, *new) if MM.SPEC.static_refusal(hopper, c, p) is None])
        space = min((s for s in t if s != "torch" and s not in names), key=t.get)
        ranked = sorted((s for s in t if s in names), key=t.get)
        out.append({"shape": [m, n, k], "torch_us": t["torch"] * 1e3, "space_best": [space, t[space] * 1e3],
                    "new": [[s, t[s] * 1e3] for s in ranked], "bad": bad})
        print(f"{m}x{n}x{k}: torch {t['torch']*1e3:.1f} us, space best {t[space]*1e3:.1f} us "
              f"({t['torch']/t[space]:.3f}) {space}", flush=True)
        for s in ranked[:4]:
            print(f"    new {t[s]*1e3:6.1f} us ({t['torch']/t[s]:.3f}) {s}")
        for b in bad[:4]:
            print("    bad:", b)
    save(out, "gemm_midsize.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
