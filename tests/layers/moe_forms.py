"""The computations of `MixtureOfExperts`' routed experts that a test parametrizes over.

"dense" and "sparse" are the layer's `implementation`s. On PyTorch (CPU), "sparse" runs
one grouped matmul per projection (the `"grouped_matmul"` hook of `keras_attn._device`,
observed as "moe_grouped"); "sparse-blocks" turns that hook off, so that the forms the
other backends run (the sorted blocks, and "moe_gathered" for fewer copies than experts)
are tested on PyTorch too. Elsewhere "sparse-blocks" would repeat "sparse" and is not
listed.
"""

import contextlib

import keras

from keras_attn import _hooks

GROUPED = keras.backend.backend() == "torch"
IMPLEMENTATIONS = ["dense", "sparse"] + (["sparse-blocks"] if GROUPED else [])


def layer_arg(implementation):
    """The layer's `implementation=` for a parametrized name."""
    return "sparse" if implementation == "sparse-blocks" else implementation


def paths(implementation, gathered=False, width=8):
    """What `keras_attn.observe_paths()` counts for one call of the layer (`gathered`: a
    call with fewer token copies than experts; `width`: the experts' intermediate_dim, in
    float32, whose rows the grouped matmul takes only in multiples of 16 bytes)."""
    if implementation == "dense":
        return {"moe_dense": 1}
    if implementation == "sparse" and GROUPED and (4 * width) % 16 == 0:
        return {"moe_sparse": 1, "moe_grouped": 1}
    return {"moe_sparse": 1, **({"moe_gathered": 1} if gathered else {})}


@contextlib.contextmanager
def form(implementation):
    """Inside: the grouped matmul hook off for "sparse-blocks"; nothing changed otherwise."""
    if implementation != "sparse-blocks":
        yield
        return
    grouped = _hooks.get("grouped_matmul")
    _hooks.set("grouped_matmul", None)
    try:
        yield
    finally:
        _hooks.set("grouped_matmul", grouped)
