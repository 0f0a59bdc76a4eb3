"""Certified kernels as nodes of a compiled graph: the GEMM and attention public ops as
`torch.library` ops with fake implementations, so `torch.compile` traces them as one node
each, and the Inductor pass that puts them where a certified seat is.

    torch.ops.nbx_tune.mm(a, b, site)                       # a @ b
    torch.ops.nbx_tune.addmm(bias, a, b, beta, alpha, site) # beta * bias + alpha * (a @ b)
    torch.ops.nbx_tune.bmm(a, b, site)                      # batched a @ b
    torch.ops.nbx_tune.sdpa(q, k, v, is_causal, scale, site)  # attention, GQA where heads differ

`site` names the graph node the op replaced; `compiled_stats()` counts per site the calls that
ran a certified kernel and those that ran torch's op, with the reason. A call runs the kernel
only where its own seat (from its real shapes, strides and dtype) has a certificate here and no
torch baseline says torch is faster (kernels/runtime/torch_rule.py, read as under serve()); any
other call runs torch's op, so a dynamic shape that leaves the seat's bucket runs torch, never
a default config.

`CertifiedPass` is an Inductor post-grad pass (`torch._inductor.config.post_grad_custom_pre_pass`):
it replaces `aten.mm`, `aten.addmm`, `aten.bmm` and the backend ops SDPA decomposes into
(flash, efficient, cuDNN, the CPU flash) by these ops where the node's shapes (symbolic sizes
read at their hints) fall on a certified seat. Inductor keeps the element-wise work around the
nodes in its own fused kernels. `compiled(model)` and `compile_backend` compile with the pass;
serve() installs it while active, for a model compiled inside it.

Imports torch only at module load; the kernels (and triton) on first use, after the device is
chosen as at every entry point.
"""

from __future__ import annotations

import hashlib
import operator
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from nbx_tune.errors import KernelError

aten = torch.ops.aten


@dataclass
class SiteStats:
    seat: str = ""  # the certified seat the pass found for the node
    certified: int = 0  # calls that ran the certified kernel
    torch: Counter = field(default_factory=Counter)  # calls that ran torch's op: reason -> calls

    def to_dict(self) -> dict:
        return {"seat": self.seat, "certified": self.certified, "torch": sum(self.torch.values()),
                "reasons": dict(self.torch)}


_stats: dict[str, SiteStats] = {}
_tls = threading.local()


# ----------------------------------------------------------------------------- seats


_families = []


def _kernels():
    """The matmul and attention families, imported once the device is chosen (every entry
    point's rule: no GPU, the interpreter)."""
    if not _families:
        from nbx_tune import kernels
        from nbx_tune.kernels import attention, matmul

        kernels._find_device()
        _families[:] = [matmul, attention]
    return _families


def mm_seat(a, b, bias: bool):
    """(spec, dtypes, flags, dims) of a GEMM a @ b (+ bias), as the public op reads it, or a
    KernelError saying why it has none. 2-D or batched 3-D; works on fake and meta tensors."""
    matmul, _ = _kernels()
    name = {v: k for k, v in matmul.TORCH_DTYPES.items()}.get(a.dtype)
    if name is None or b.dtype != a.dtype:
        raise KernelError(f"matmul: dtypes {a.dtype}, {b.dtype} are not served")
    rank = a.dim()
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    aligned = matmul.alignment(a.stride(), b.stride(), N, K, 16 // a.element_size())
    flags = matmul._FLAGS[int(bias), aligned, matmul.operand_major(a) + matmul.operand_major(b)]
    return matmul.SPEC, (name,), flags, (a.shape[0] if rank == 3 else 1, M, N, K)


def sdpa_seat(q, k, v, is_causal: bool):
    _kernels()
    from nbx_tune.kernels.attention.spec import SPEC, TORCH_DTYPES
    from nbx_tune.kernels.spec import seat_flags

    name = {v_: k_ for k_, v_ in TORCH_DTYPES.items()}.get(q.dtype)
    if name is None or k.dtype != q.dtype or v.dtype != q.dtype or q.dim() != 4:
        raise KernelError(f"attention: dtypes {q.dtype}, {k.dtype}, {v.dtype} are not served")
    B, Hq, Lq, D = q.shape
    return SPEC, (name,), seat_flags(causal=int(bool(is_causal))), (B * Hq, Lq, k.shape[2], D, v.shape[3])


_memo: dict = {}
_memo_of = [None]  # what the memo was made from: the launch state (certified.reload() makes another), its sizes


def certified_seat(spec, dtypes, flags, dims) -> str:
    """The seat's label where a certificate serves it and torch is not faster; else raises
    KernelError with the reason torch runs instead."""
    from nbx_tune.kernels.runtime import certified
    from nbx_tune.kernels.runtime.torch_rule import REASON
    from nbx_tune.kernels.spec import bucket_of, seat_label

    st = certified.state()
    made_from = (st, len(st.entries), len(st.deferred))  # a reload, or seats added in place
    if _memo_of[0] != made_from:
        _memo.clear()
        _memo_of[0] = made_from
    key = (spec.name, dtypes, flags, dims)
    hit = _memo.get(key)
    if hit is None:
        bucket = bucket_of(st.profile, spec.key, dims)
        seat = (spec.name, dtypes, flags, bucket)
        label = seat_label(spec.name, dtypes, flags, spec.key, bucket)
        if seat not in st.entries:
            hit = KernelError(f"no certified seat {label}")
        elif seat in st.deferred:
            hit = KernelError(REASON)
        else:
            hit = label
        _memo[key] = hit
    if isinstance(hit, KernelError):
        raise hit
    return hit


# ----------------------------------------------------------------------------- the ops


def _sdpa_torch(q, k, v, is_causal, scale):
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale,
                                          enable_gqa=k.shape[1] != q.shape[1])


def _sdpa_out(q, v):
    """The output as the kernel writes it: (B, Hq, Lq, Dv) in (B, Lq, Hq, Dv) memory order."""
    B, Hq, Lq, _ = q.shape
    Dv = v.shape[3]
    return torch.empty_strided((B, Hq, Lq, Dv), (Lq * Hq * Dv, Dv, Hq * Dv, 1), dtype=q.dtype, device=q.device)


_verdicts: dict = {}  # a call's key -> its seat's label, or the KernelError saying why torch runs
_verdicts_of = [None]


def _verdict(key, seat, args):
    from nbx_tune.kernels.runtime import certified

    st = certified._state or certified.state()
    made_from = (st, len(st.entries), len(st.deferred))
    if _verdicts_of[0] != made_from:
        _verdicts.clear()
        _verdicts_of[0] = made_from
    v = _verdicts.get(key)
    if v is None:
        try:
            v = certified_seat(*seat(*args))
        except KernelError as e:
            v = e
        _verdicts[key] = v
    return v, st


def _run(site, key, seat, kernel, fallback, args):
    """One call of a compiled node: the kernel where its seat is certified, else torch. The
    seat is read once per distinct call key (shapes, strides, dtypes)."""
    from nbx_tune.kernels.runtime import certified

    stats = _stats.get(site) or _stats.setdefault(site, SiteStats(seat=site.partition(" ")[2]))
    verdict, st = _verdict(key, seat, args)
    serving = certified.SERVING
    was = serving.busy
    serving.busy = True  # as under serve(): a faster torch baseline defers, torch's own calls go to torch
    try:
        try:
            if isinstance(verdict, KernelError):
                raise verdict
            before = st.misses.total
            out = kernel(*args)
            if st.misses.total != before:  # the seat went between the check and the launch
                raise KernelError("no certified seat at launch")
            stats.certified += 1
            return out
        except KernelError as e:
            stats.torch[str(e).splitlines()[0][:200]] += 1
            return fallback(*args)
    finally:
        serving.busy = was


def _key(*tensors):
    return tuple((t.shape, t.stride(), t.dtype) for t in tensors)


def _mm(a, b, site):
    matmul, _ = _kernels()
    return _run(site, ("mm", _key(a, b)), _mm_seat, matmul.mm, torch.mm, (a, b))


def _bmm(a, b, site):
    matmul, _ = _kernels()
    return _run(site, ("bmm", _key(a, b)), _mm_seat, matmul.bmm, torch.bmm, (a, b))


def _mm_seat(a, b):
    return mm_seat(a, b, False)


def _addmm(bias, a, b, beta, alpha, site):
    matmul, _ = _kernels()
    return _run(site, ("addmm", beta != 0, _key(a, b)), lambda bias, a, b: mm_seat(a, b, beta != 0),
                lambda bias, a, b: matmul.addmm(bias, a, b, beta=beta, alpha=alpha),
                lambda bias, a, b: torch.addmm(bias, a, b, beta=beta, alpha=alpha), (bias, a, b))


def _sdpa(q, k, v, is_causal, scale, site):
    _, attention = _kernels()

    def torch_side(q, k, v):  # in the kernel's memory order: what the fake promised Inductor
        return _sdpa_out(q, v).copy_(_sdpa_torch(q, k, v, is_causal, scale))

    return _run(site, ("sdpa", is_causal, _key(q, k, v)), lambda q, k, v: sdpa_seat(q, k, v, is_causal),
                lambda q, k, v: attention.scaled_dot_product_attention(q, k, v, is_causal, scale),
                torch_side, (q, k, v))


def _mm_fake(a, b, site):
    return a.new_empty((a.shape[0], b.shape[1]))


def _bmm_fake(a, b, site):
    return a.new_empty((a.shape[0], a.shape[1], b.shape[2]))


def _addmm_fake(bias, a, b, beta, alpha, site):
    return a.new_empty((a.shape[0], b.shape[1]))


def _sdpa_fake(q, k, v, is_causal, scale, site):
    return _sdpa_out(q, v)


_LIB = torch.library.Library("nbx_tune", "FRAGMENT")  # kernels/serving/custom_ops.py holds the DEF
for _schema, _real, _fake in (
        ("mm(Tensor a, Tensor b, str site) -> Tensor", _mm, _mm_fake),
        ("bmm(Tensor a, Tensor b, str site) -> Tensor", _bmm, _bmm_fake),
        ("addmm(Tensor bias, Tensor a, Tensor b, float beta, float alpha, str site) -> Tensor", _addmm, _addmm_fake),
        ("sdpa(Tensor q, Tensor k, Tensor v, bool is_causal, float? scale, str site) -> Tensor", _sdpa, _sdpa_fake)):
    _name = _schema.partition("(")[0]
    _LIB.define(_schema)
    _LIB.impl(_name, _real, "CompositeExplicitAutograd")
    torch.library.register_fake(f"nbx_tune::{_name}", _fake, lib=_LIB)

mm = torch.ops.nbx_tune.mm.default
bmm = torch.ops.nbx_tune.bmm.default
addmm = torch.ops.nbx_tune.addmm.default
sdpa = torch.ops.nbx_tune.sdpa.default


def stats() -> dict:
    """Per compiled node (`site`): its seat, calls on the certified kernel, calls on torch's op."""
    return {site: s.to_dict() for site, s in sorted(_stats.items()) if s.certified or s.torch}


def reset_stats() -> None:
    _stats.clear()


# ----------------------------------------------------------------------------- the pass


def _hint(x):
    if isinstance(x, torch.SymInt):
        hint = x.node.hint
        if hint is None:
            raise KernelError("a size with no hint")
        return int(hint)
    return int(x)


def _meta(t):
    """A meta tensor with the fake value's sizes and strides at their hints."""
    return torch.empty_strided([_hint(s) for s in t.shape], [_hint(s) for s in t.stride()],
                               dtype=t.dtype, device="meta")


# SDPA's backend ops as a post-grad graph holds them (the output is item 0 of each)
_SDPA_OPS = frozenset(getattr(aten, n).default for n in (
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu") if hasattr(aten, n))


def _bound(node) -> dict:
    """The node's arguments by schema name, defaults filled in."""
    schema = node.target._schema
    out = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
    out.update(zip((a.name for a in schema.arguments), node.args))
    out.update(node.kwargs)
    return out


def _val(n):
    return n.meta.get("val") if isinstance(n, torch.fx.Node) else None


def _plan(node):
    """(replacement op, its args, the node whose uses it takes, seat) for a node the pass
    replaces, else None."""
    t = node.target
    if t in (aten.mm.default, aten.bmm.default):
        a, b = (_val(x) for x in node.args[:2])
        if a is None or b is None:
            return None
        seat = mm_seat(_meta(a), _meta(b), False)
        return (mm if t == aten.mm.default else bmm), tuple(node.args[:2]), node, seat
    if t == aten.addmm.default:
        args = _bound(node)
        vals = [_val(args[k]) for k in ("self", "mat1", "mat2")]
        if any(v is None for v in vals):
            return None
        beta, alpha = float(args["beta"]), float(args["alpha"])
        seat = mm_seat(_meta(vals[1]), _meta(vals[2]), beta != 0)
        return addmm, (args["self"], args["mat1"], args["mat2"], beta, alpha), node, seat
    if t in _SDPA_OPS:
        args = _bound(node)
        if args.get("attn_mask") is not None or args.get("attn_bias") is not None or args.get("dropout_p", 0.0):
            return None
        users = list(node.users)
        # only the output is read (inference): the kernel writes no logsumexp a backward could use
        if len(users) != 1 or users[0].target is not operator.getitem or users[0].args[1] != 0:
            return None
        q, k, v = (_val(args[n]) for n in ("query", "key", "value"))
        if q is None or k is None or v is None or q.dim() != 4 or k.shape[1] == 0 or \
                _hint(q.shape[1]) % _hint(k.shape[1]):
            return None
        causal = bool(args.get("is_causal", False))
        seat = sdpa_seat(_meta(q), _meta(k), _meta(v), causal)
        scale = args.get("scale")
        return sdpa, (args["query"], args["key"], args["value"], causal,
                      None if scale is None else float(scale)), users[0], seat
    return None


def rewrite(graph: torch.fx.Graph) -> int:
    """Replace the graph's GEMM and attention nodes at certified seats by the library's ops;
    returns how many. A node whose seat has no certificate, or where torch is faster, stays."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    done = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        try:
            with unset_fake_temporarily():
                plan = _plan(node)
                if plan is None:
                    continue
                op, args, takes, seat = plan
                label = certified_seat(*seat)
        except KernelError:
            continue
        site = f"{node.name} {label}"  # the node, and the seat it was placed for
        with graph.inserting_before(node):
            new = graph.call_function(op, (*args, site))
        vals = [_val(a) if isinstance(a, torch.fx.Node) else a for a in (*args, site)]
        fake_mode = next((v.fake_mode for v in vals if hasattr(v, "fake_mode")), None)
        if fake_mode is not None:
            with fake_mode:
                new.meta["val"] = op(*vals)
        takes.replace_all_uses_with(new)
        if takes is not node:
            graph.erase_node(takes)
        graph.erase_node(node)
        done += 1
    if done:
        graph.lint()
    return done


def _pass_base():
    from torch._inductor.custom_graph_pass import CustomGraphPass

    return CustomGraphPass


class _CertifiedPass:
    """The pass as Inductor calls it. Its uuid (Inductor's FX graph cache key) covers this
    module's source and the certified seats it may place, so a graph is not taken from the
    cache after the certificates changed."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        rewrite(graph)

    def uuid(self):
        from nbx_tune.kernels.runtime import certified

        st = certified.state()
        seats = sorted(repr(s) for s in st.entries if s[0] in ("matmul", "attention") and s not in st.deferred)
        h = hashlib.sha256(Path(__file__).read_bytes())
        h.update("\n".join(seats).encode())
        return h.hexdigest()


def certified_pass():
    """The pass, as an instance of Inductor's CustomGraphPass (so the FX graph cache keys on it)."""
    cls = type("CertifiedPass", (_CertifiedPass, _pass_base()), {})
    return cls()


class _Chain:
    """The pass after one the user had installed: both run, both key the cache."""

    def __init__(self, first, second):
        self.first, self.second = first, second

    def __call__(self, graph):
        self.first(graph)
        self.second(graph)

    def uuid(self):
        u = getattr(self.first, "uuid", lambda: None)()
        return None if u is None else (u, self.second.uuid())


def config_patches(mode: str | None = None) -> dict:
    """Inductor config for a compile with the pass (and `mode`'s options, as torch.compile's)."""
    import torch._inductor.config as ic
    from torch._inductor import list_mode_options

    ours = certified_pass()
    pre = ic.post_grad_custom_pre_pass
    if pre is not None and not isinstance(pre, _CertifiedPass):
        ours = type("CertifiedChain", (_Chain, _pass_base()), {})(pre, ours)
    opts = dict(list_mode_options(mode)) if mode else {}
    opts["post_grad_custom_pre_pass"] = ours
    return opts


def compile_backend(gm, example_inputs, mode: str | None = None):
    """A Dynamo backend: Inductor with the pass. `torch.compile(model, backend=nbx_tune.compile_backend)`."""
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(gm, example_inputs, config_patches=config_patches(mode))


def compiled(model, *, mode: str | None = None, **kwargs):
    """`torch.compile(model, **kwargs)` with the certified pass (Inductor's `mode` options too)."""
    return torch.compile(model, backend=lambda gm, ex: compile_backend(gm, ex, mode), **kwargs)


_saved = []  # serve()'s: the config value it replaced, one per install


def install_pass() -> None:
    """Put the pass in Inductor's config (serve() does while active): models compiled from now
    on place certified kernels. Nothing where Inductor is not imported (nothing compiles)."""
    import sys

    ic = sys.modules.get("torch._inductor.config")
    if ic is None:
        return
    _saved.append(ic.post_grad_custom_pre_pass)
    ic.post_grad_custom_pre_pass = config_patches()["post_grad_custom_pre_pass"]


def remove_pass() -> None:
    import sys

    ic = sys.modules.get("torch._inductor.config")
    if ic is not None and _saved:
        ic.post_grad_custom_pre_pass = _saved.pop()


__all__ = ["mm", "bmm", "addmm", "sdpa", "rewrite", "certified_pass", "compile_backend", "compiled",
           "stats", "reset_stats", "install_pass", "remove_pass", "mm_seat", "sdpa_seat", "certified_seat"]
