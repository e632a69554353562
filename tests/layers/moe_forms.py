"""The computations of `MixtureOfExperts`' routed experts that a test parametrizes over.

"dense" and "sparse" are the layer's `implementation`s. On PyTorch run eagerly, "sparse"
is a loop over the experts (the `"experts_by_loop"` hook, observed as "moe_expert_loop");
"sparse-blocks" turns that hook off, so that the sorted-block dispatch that the other
backends (and traced PyTorch steps) run is tested on PyTorch too. Elsewhere
"sparse-blocks" would repeat "sparse" and is not listed.
"""

import contextlib

import keras

from keras_attn import _hooks

EXPERT_LOOP = keras.backend.backend() == "torch"
IMPLEMENTATIONS = ["dense", "sparse"] + (["sparse-blocks"] if EXPERT_LOOP else [])


def layer_arg(implementation):
    """The layer's `implementation=` for a parametrized name."""
    return "sparse" if implementation == "sparse-blocks" else implementation


def paths(implementation):
    """What `keras_attn.observe_paths()` counts for one call of the layer."""
    if implementation == "dense":
        return {"moe_dense": 1}
    if implementation == "sparse" and EXPERT_LOOP:
        return {"moe_sparse": 1, "moe_expert_loop": 1}
    return {"moe_sparse": 1}


@contextlib.contextmanager
def form(implementation):
    """Inside: the expert loop hook off for "sparse-blocks"; nothing changed otherwise."""
    if implementation != "sparse-blocks":
        yield
        return
    loop = _hooks.get("experts_by_loop")
    _hooks.set("experts_by_loop", None)
    try:
        yield
    finally:
        _hooks.set("experts_by_loop", loop)
