"""The pattern of transformers' KV cache: DynamicLayer.update's two cats."""

from __future__ import annotations

from typing import Callable

from nbx_tune.kernels.serving import custom_ops
from nbx_tune.kernels.serving.fusions.engine import Fusion, Pattern, _calls


def _cat_kv(original: Callable) -> Callable:
    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        _calls["cat_kv"] += 1
        self.keys, self.values = custom_ops.cat_kv(self.keys, key_states, self.values, value_states, -2)
        return self.keys, self.values

    return update


# transformers' DynamicLayer.update, a KV cache layer growing by a step's keys and values:
# two cats a layer, as torch.ops.nbx_tune.cat_kv (whose body is the two cats).
CAT_KV = Fusion("cat_kv", "nbx_tune.cat_kv", Pattern('''
def update(self, key_states, value_states, *args, **kwargs):
    # Lazy initialization
    if not self.is_initialized:
        self.lazy_initialization(key_states, value_states)

    self.keys = torch.cat([self.keys, key_states], dim=-2)
    self.values = torch.cat([self.values, value_states], dim=-2)
    return self.keys, self.values
'''), _cat_kv, method="DynamicLayer.update")
