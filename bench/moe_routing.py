"""A mixture-of-experts layer's routing ops on the kernels against torch's, side by side in
one run, at a decode step's and a 4096-token prefill's sizes (Mixtral: 8 experts, top-2;
DeepSeek-V3's router: 256, top-8; hidden 4096, bf16 tokens): topk, the sort of the routed
expert ids, `perm // k`, the tokens' gather, histc, cumsum, the inverse permutation's
index_put_; and a padded batch's mask read at every (batch, key) pair (x[i0, i1]) and its
`.all()`, which every family with a padded batch makes. Per case: device time of each and the ratio, and whether the outputs are torch's
bit for bit. Then where torch's own order of ties is the stable one the kernels give: the
expert ids' sort (ties everywhere) and a top-k over rows with ties, on this GPU.

    python bench/moe_routing.py              # on the GPU, after a census of the cases' seats
    python bench/moe_routing.py --no-census  # the declared defaults
    python bench/moe_routing.py --smoke      # the CPU interpreter, tiny sizes: checks the script runs

Writes moe_routing.json under $OUT (or bench_out/).
"""

from __future__ import annotations

import os
import sys

SMOKE = "--smoke" in sys.argv  # as a script; main(argv) sets it for a caller
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

from nbx_tune.testing.bench import certify_recorded, environment, save, side_by_side, table, wall_ms  # noqa: E402


def cases(torch, dev):
    """(name, torch's op, the kernels' public op that serve() calls for it, args)."""
    import importlib

    K = {m: importlib.import_module(f"nbx_tune.kernels.{m}") for m in ("topk", "index", "scan", "histc", "floor_divide",
                                                                         "all_any")}
    hidden, tokens = (32, 14) if SMOKE else (4096, 4096)
    g = torch.Generator(device=dev).manual_seed(0)
    out = []
    for label, n, experts, k in (("decode", 8 if SMOKE else 64, 8, 2), ("prefill", tokens, 8, 2),
                                 ("prefill DeepSeek", tokens, 64 if SMOKE else 256, 8)):
        probs = torch.softmax(torch.randn(n, experts, device=dev, generator=g), -1)
        top = torch.topk(probs, k).indices
        ids, perm = torch.sort(top.reshape(-1))
        x = torch.randn(n, hidden, device=dev, generator=g).to(torch.float32 if SMOKE else torch.bfloat16)
        counts = torch.histc(ids.to(torch.int32 if dev != "cpu" else torch.float32), bins=experts, min=0,
                             max=experts - 1)
        e = experts
        out += [(f"topk {label} {n}x{e} k{k}", torch.topk, K["topk"].topk, (probs, k)),
                (f"sort {label} {n * k} ids", torch.sort, K["topk"].sort, (top.reshape(-1),)),
                (f"floor_divide {label} {n * k}", torch.floor_divide, K["floor_divide"].floor_divide, (perm, k)),
                (f"index {label} {n}x{hidden}[{n * k}]", lambda x, i: x[i], lambda x, i: K["index"].index(x, [i]),
                 (x, perm // k)),
                (f"histc {label} {n * k} in {e}", lambda t, e=e: torch.histc(t, bins=e, min=0, max=e - 1),
                 lambda t, e=e: K["histc"].histc(t, e, 0, e - 1),
                 (ids.to(torch.int32 if dev != "cpu" else torch.float32),)),
                (f"cumsum {label} {e}", lambda c: torch.cumsum(c, 0, dtype=torch.int32),
                 lambda c: K["scan"].cumsum(c, 0, dtype=torch.int32), (counts,)),
                (f"index_put_ {label} {n * k}", lambda inv, p, a: inv.index_put_((p,), a),
                 lambda inv, p, a: K["index"].index_put_(inv, [p], a),
                 (torch.empty_like(perm), perm, torch.arange(n * k, device=dev)))]
    b, L = (2, 7) if SMOKE else (8, 4096)
    mask = torch.rand(b, L, device=dev, generator=g) < 0.9
    at = (torch.arange(b, device=dev)[:, None, None, None], torch.arange(L, device=dev)[None, None, None, :])
    out += [(f"index mask {b}x{L}[batch, key]", lambda m, i, j: m[i, j], lambda m, i, j: K["index"].index(m, [i, j]),
             (mask, *at)),
            (f"all mask {b}x{L}", torch.all, K["all_any"].all, (mask,))]
    return out


def certify(all_cases) -> None:
    """A census of the cases' seats, recorded from the torch ops, into a fresh database."""
    def run():
        for _, fn, _, args in all_cases:
            fn(*args)
    certify_recorded(run, "nbx-moe-routing-", SMOKE)


def same(a, b) -> bool:
    import torch

    if isinstance(a, tuple):
        return all(same(x, y) for x, y in zip(a, b))
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def tie_orders(torch, dev) -> dict:
    """How often torch's own sort and topk on this device put ties in index order."""
    g = torch.Generator(device=dev).manual_seed(1)
    agree = {"sort": 0, "topk": 0}
    trials = 3 if SMOKE else 50
    for _ in range(trials):
        ids = torch.randint(0, 8, (64 if SMOKE else 8192,), device=dev, generator=g)
        agree["sort"] += torch.equal(torch.sort(ids).indices, torch.sort(ids, stable=True).indices)
        x = torch.randint(0, 5, (16, 64), device=dev, generator=g).float()
        agree["topk"] += torch.equal(torch.topk(x, 8).indices,
                                     torch.sort(x, descending=True, stable=True).indices[:, :8])
    return {k: f"{v}/{trials}" for k, v in agree.items()}


def main(argv=None) -> int:
    """0 where every case served is torch's bit for bit (or handed to torch), else 1."""
    global SMOKE
    import torch

    from nbx_tune.kernels.runtime import certified

    argv = sys.argv[1:] if argv is None else argv
    SMOKE = "--smoke" in argv

    dev = "cpu" if SMOKE else "cuda"
    all_cases = cases(torch, dev)
    if "--no-census" not in argv:
        certify(all_cases)
    from nbx_tune.errors import KernelError

    rows, raw = [], {}
    for name, fn, kernel, args in all_cases:
        fresh = lambda: [a.clone() if isinstance(a, torch.Tensor) else a for a in args]  # noqa: E731
        want = fn(*fresh())
        try:
            got = kernel(*fresh())
        except KernelError as e:  # what serve() hands to torch (the CPU's ties)
            raw[name] = {"torch": str(e)}
            rows.append([name, "", "", "", f"torch: {e}"])
            continue
        ms = side_by_side({"torch": lambda: fn(*args), "kernel": lambda: kernel(*args)}, 1 if SMOKE else 200,
                          timer=(lambda f, rep: wall_ms(f, rep)) if SMOKE else None)
        exact = same(tuple(got) if isinstance(got, tuple) else got, tuple(want) if isinstance(want, tuple) else want)
        raw[name] = {"ms": ms, "torch_bits": exact}
        rows.append([name, f"{ms['torch'] * 1e3:.1f}", f"{ms['kernel'] * 1e3:.1f}",
                     f"{ms['torch'] / ms['kernel']:.2f}", "yes" if exact else "NO"])
    ties = tie_orders(torch, dev)
    env = environment()
    save("moe_routing.json", {"env": env, "cases": raw, "torch_ties_in_index_order": ties,
                              "misses": certified.launch_stats()["misses"]})
    print(f"{env['date']} {env['gpu']} driver {env['driver']} Triton {env['triton']} torch {env['torch']}")
    print(table(rows, ["case", "torch us", "kernel us", "x", "torch's bits"]))
    print(f"torch's own ties in index order on {dev}: {ties}")
    # the GPU's sort may order ties otherwise than torch's (the stable order): reported, not failed
    return 0 if all(c.get("torch_bits", True) or c_name.startswith(("sort", "topk"))
                    for c_name, c in raw.items()) else 1


if __name__ == "__main__":
    sys.exit(main())
