"""A mixture-of-experts layer's routed experts in float64, from the definition: each token
through the SwiGLU MLP of each expert it is routed to (down(silu(gate(x)) * up(x))), scaled
by its routing weight and summed over its top-k. Weights as transformers stores them:
gate_up (E, 2I, H) with the gate's rows first, down (E, H, I).

Inputs arrive as the exact values the kernel sees (already rounded to their dtype).
"""

import numpy as np


def silu(x) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def moe_experts(hidden, w_gate_up, w_down, topk_ids, topk_weights) -> np.ndarray:
    """(T, H): sum over j of topk_weights[t, j] * expert_{topk_ids[t, j]}(hidden[t]); an id
    outside [0, E) (an expert-parallel sentinel) contributes nothing."""
    x = np.asarray(hidden, dtype=np.float64)
    w13 = np.asarray(w_gate_up, dtype=np.float64)
    w2 = np.asarray(w_down, dtype=np.float64)
    ids = np.asarray(topk_ids)
    weights = np.asarray(topk_weights, dtype=np.float64)
    E, I = w13.shape[0], w13.shape[1] // 2
    out = np.zeros(x.shape, dtype=np.float64)
    for e in range(E):
        t, j = np.nonzero(ids == e)
        if t.size == 0:
            continue
        h = x[t] @ w13[e].T
        y = (silu(h[:, :I]) * h[:, I:]) @ w2[e].T
        np.add.at(out, t, y * weights[t, j][:, None])
    return out
