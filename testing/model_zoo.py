"""Tiny random-weight models of many transformers families, run under torch and under
`serve()`: the logits compared, what serve() launched (certified, default) and what it
handed to torch (with why), and the ops that never reached a served op at all (read from
a trace of the same call). Shared by tests/test_model_zoo.py and bench/model_zoo_coverage.py.

Every config is tiny (hidden 32, one or two layers, vocab 128), fp32, eval mode, nothing
downloaded; a padded batch (left padding in an attention mask) where the family takes one.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections import Counter
from pathlib import Path
from dataclasses import dataclass, field

import torch

VOCAB = 128
_TOKENS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)  # inside the tiny vocabulary
_DECODER = dict(**_TOKENS, vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, head_dim=8)
_MOE = dict(num_local_experts=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
            shared_expert_intermediate_size=32, decoder_sparse_step=1)
_ENCODER = dict(**_TOKENS, vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, max_position_embeddings=64)

# family -> (config class, model class, config kwargs, a padded batch): decoders with and
# without sliding windows, multi-query (Falcon) and grouped-query attention, mixtures of
# experts, encoders. Attention through SDPA, except where the family has no SDPA path
# (Gemma2's logit soft-capping: `_EAGER`).
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", _DECODER, True),
    "mistral": ("MistralConfig", "MistralForCausalLM", {**_DECODER, "sliding_window": 4}, True),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", _DECODER, True),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", _DECODER, True),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", _DECODER, False),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {**_DECODER, "sliding_window": 4}, True),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", _DECODER, False),
    "phi": ("PhiConfig", "PhiForCausalLM", _DECODER, False),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(**_TOKENS, vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64),
             True),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", _DECODER, False),
    "falcon": ("FalconConfig", "FalconForCausalLM", dict(**_TOKENS, vocab_size=VOCAB, hidden_size=32,
                                                         num_hidden_layers=2, num_attention_heads=4,
                                                         multi_query=True), False),
    "opt": ("OPTConfig", "OPTForCausalLM", dict(**_TOKENS, vocab_size=VOCAB, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                                                num_attention_heads=4, word_embed_proj_dim=32,
                                                max_position_embeddings=64), False),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", _DECODER, False),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", {**_DECODER, "sliding_window": 4}, False),
    "olmo": ("OlmoConfig", "OlmoForCausalLM", _DECODER, False),
    "cohere": ("CohereConfig", "CohereForCausalLM", _DECODER, False),
    "granite": ("GraniteConfig", "GraniteForCausalLM", _DECODER, False),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {**_DECODER, **_MOE}, False),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", {**_DECODER, **_MOE}, False),
    "bert": ("BertConfig", "BertModel", _ENCODER, True),
    "roberta": ("RobertaConfig", "RobertaModel", _ENCODER, False),
}


_EAGER = {"gemma2"}


@dataclass
class Result:
    family: str
    rel_err: float = float("nan")  # max|serve - torch| / max|torch| of the logits
    seconds: float = 0.0  # the served forward's wall time
    served: dict = field(default_factory=dict)  # serve_stats(): op -> certified/default/torch/reasons
    unrouted: Counter = field(default_factory=Counter)  # ops no kernel is routed for: launches
    error: str = ""  # the family could not be built here

    def totals(self) -> dict:
        t = Counter()
        for s in self.served.values():
            t.update(certified=s["certified"], default=s["default"], torch=s["torch"])
        t["unrouted"] = sum(self.unrouted.values())
        return dict(t)

    def defaults(self) -> dict[str, int]:
        """op -> launches on a default config (a seat no census certified)."""
        return {op: s["default"] for op, s in self.served.items() if s["default"]}

    def fell_through(self) -> dict[str, dict[str, int]]:
        """op -> {reason: calls} for every served op handed to torch."""
        return {op: dict(s["reasons"]) for op, s in self.served.items() if s["torch"]}

    def to_dict(self) -> dict:
        return {"family": self.family, "rel_err": self.rel_err, "seconds": round(self.seconds, 3),
                "totals": self.totals(), "defaults": self.defaults(), "fell_through": self.fell_through(), "unrouted": dict(self.unrouted),
                "error": self.error}


@contextlib.contextmanager
def _without_repo_root():
    """sys.path without the checkout's root, whose `kernels/` folder would shadow the
    `kernels` package transformers probes for (run from the root, pytest puts it there)."""
    root = str(Path(__file__).resolve().parents[1])
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if p not in ("", root) and Path(p or ".").resolve() != Path(root)]
    try:
        yield
    finally:
        sys.path[:] = saved


def build(family: str, seed: int = 0, device: str = "cpu", dtype=torch.float32):
    """(model, kwargs of one forward) for a family of FAMILIES."""
    cfg_name, model_name, kwargs, padded = FAMILIES[family]
    with _without_repo_root():
        import transformers

        config_cls, model_cls = getattr(transformers, cfg_name), getattr(transformers, model_name)
    config = config_cls(**kwargs)
    config._attn_implementation = "eager" if family in _EAGER else "sdpa"
    torch.manual_seed(seed)
    model = model_cls(config).eval().to(device=device, dtype=dtype)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (2, 7), generator=g)
    mask = torch.ones(2, 7, dtype=torch.long)
    if padded:
        mask[1, :3] = 0  # left padding: a padded batch
    return model, {"input_ids": ids.to(device), "attention_mask": mask.to(device)}


def _output(out) -> torch.Tensor:
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


def run(family: str, trace: bool = True, device: str = "cpu", dtype=torch.float32) -> Result:
    """The family's forward under torch and under serve() (and, with `trace`, recorded:
    `Result.unrouted`)."""
    import nbx_tune
    from nbx_tune.kernels.serving import serve as serving

    res = Result(family)
    try:
        model, kwargs = build(family, device=device, dtype=dtype)
    except Exception as e:  # a family this transformers cannot build: said, not fatal
        res.error = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        return res
    with torch.no_grad():
        ref = _output(model(**kwargs))
        serving.reset_stats()
        t0 = time.perf_counter()
        with nbx_tune.serve():
            got = _output(model(**kwargs))
        res.seconds = time.perf_counter() - t0
        res.served = serving.stats()
        if trace:
            res.unrouted = unrouted_ops(record(model, kwargs))
    res.rel_err = float(((got - ref).abs().max() / ref.abs().max()).float())
    return res


def record(model, kwargs, path=None):
    """The trace rows of one forward (written to `path` too, where given)."""
    from nbx_tune.tuner.trace.recorder import Recorder

    with torch.no_grad(), Recorder() as rec:
        model(**kwargs)
    if path is not None:
        rec.write(path)
    return rec.rows


def unrouted_ops(rows) -> Counter:
    """Launches of trace rows whose op no served kernel is routed for (they run on torch,
    unseen by serve_stats): op -> launches."""
    from nbx_tune.kernels.runtime.registry import spec_for_op
    from nbx_tune.kernels.serving.serve import routes

    routed = routes()
    out = Counter()
    for row in rows:  # a row a kernel's spec reads (the library's own ops) is covered too
        if row.op.removesuffix(".default") not in routed and spec_for_op(row.op) is None:
            out[row.op] += row.count
    return out


def trace_seats(rows, profile) -> set[str]:
    """The seat labels a census of `rows` would tune (on `profile`)."""
    from nbx_tune.kernels.runtime.registry import get_spec, spec_for_op
    from nbx_tune.kernels.spec import NotServable, bucket_of, seat_label

    seats = set()
    for row in rows:
        spec = spec_for_op(row.op)
        p = spec.problem_from_row(row) if spec is not None else None
        if p is not None and not isinstance(p, NotServable):
            spec = get_spec(p.kernel)  # a row one family hands to another (x[i0, i1], SDPA with a mask)
            seats.add(seat_label(spec.name, p.dtypes, p.flags, spec.key, bucket_of(profile, spec.key, p.dims)))
    return seats


def missed_seats(fn) -> set[str]:
    """The seats fn() launches under serve() on a default config (no certificate read)."""
    import nbx_tune
    from nbx_tune.kernels.runtime import certified

    certified.reload()
    with torch.no_grad(), nbx_tune.serve():
        fn()
    return set(certified.launch_stats()["misses"])
