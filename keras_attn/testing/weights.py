"""The one traversal of the weight layout: named variables, reference params, random weights.

`named_variables` walks a built layer by `testing.layout.LAYOUT`; the
reference's parameter dicts (`reference_params`) and the parity worker's
weight loading both use that walk, and the parity cases name their NumPy
weights from the same table.
"""

import keras
import numpy as np

from keras_attn.testing.layout import LAYOUT

__all__ = ["named_variables", "randomize_weights", "reference_params"]

def named_variables(layer, prefix=""):
    """`name -> keras.Variable` for every weight of a built keras_attn layer."""
    kind = type(layer).__name__
    if kind not in LAYOUT:
        raise TypeError(f"no weight layout for layer type {kind}")
    out = {}
    for part in LAYOUT[kind].get("dense", ()):
        dense = getattr(layer, part + "_dense", None)
        if dense is None:  # e.g. no gate in a plain feed-forward
            continue
        out[f"{prefix}{part}/kernel"] = dense.kernel
        if dense.bias is not None:
            out[f"{prefix}{part}/bias"] = dense.bias
    for part in LAYOUT[kind].get("projections", ()):  # `Dense` sublayers `<part>`, no bias
        out[f"{prefix}{part}/kernel"] = getattr(layer, part).kernel
    for part in LAYOUT[kind].get("norms", ()):
        out.update(_norm_variables(getattr(layer, part, None), f"{prefix}{part}/"))
    for part in LAYOUT[kind].get("weights", ()):
        if getattr(layer, part, None) is not None:  # built with it (`use_sinks`)
            out[f"{prefix}{part}"] = getattr(layer, part)
    for part in LAYOUT[kind].get("blocks", ()):
        if getattr(layer, part, None) is None:  # a decoder built without memory
            continue
        out.update(named_variables(getattr(layer, part), f"{prefix}{part}/"))
        out.update(_norm_variables(getattr(layer, part + "_norm"), f"{prefix}{part}_norm/"))
    return out


def _norm_variables(norm, prefix):
    """LayerNormalization's `gamma`/`beta` or RMSNormalization's `scale` (none if absent)."""
    if norm is None:
        return {}
    names = ("scale",) if hasattr(norm, "scale") and not hasattr(norm, "gamma") else ("gamma", "beta")
    return {prefix + name: getattr(norm, name) for name in names
            if getattr(norm, name, None) is not None}


def reference_params(layer):
    """The weights of a keras_attn layer as the reference's nested float64 dicts."""
    params = {}
    for name, variable in named_variables(layer).items():
        *path, leaf = name.split("/")
        node = params
        for key in path:
            node = node.setdefault(key, {})
        node[leaf] = keras.ops.convert_to_numpy(variable).astype(np.float64)
    return params


def randomize_weights(layer, seed=0, scale=0.5):
    """Give every weight (biases and LayerNorm ones too) a random value.

    Default initialisers leave biases at zero and LayerNorm at identity,
    which would let a bug in those paths go unseen.
    """
    rng = np.random.default_rng(seed)
    for variable in layer.weights:
        if "float" not in keras.backend.standardize_dtype(variable.dtype):
            continue  # e.g. a dropout seed generator's state
        shape = tuple(variable.shape)
        value = rng.normal(0.0, scale, size=shape)
        if variable.path.endswith(("gamma", "scale")):
            value = 1.0 + value
        variable.assign(value.astype(keras.backend.standardize_dtype(variable.dtype)))
