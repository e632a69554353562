"""Read a layer's weights as the reference's parameter dicts, or randomise them."""

import keras
import numpy as np

__all__ = ["randomize_weights", "reference_params"]


def _np(variable):
    return keras.ops.convert_to_numpy(variable).astype(np.float64)


def _dense(layer):
    return {"kernel": _np(layer.kernel),
            "bias": _np(layer.bias) if layer.bias is not None else None}


def _norm(layer):
    return {"gamma": _np(layer.gamma), "beta": _np(layer.beta)}


def reference_params(layer):
    """The weights of a keras_attn layer laid out for `testing.reference`."""
    name = type(layer).__name__
    if name == "MultiHeadAttention":
        return {"query": _dense(layer.query_dense), "key": _dense(layer.key_dense),
                "value": _dense(layer.value_dense), "output": _dense(layer.output_dense)}
    if name == "PositionwiseFeedForward":
        return {"intermediate": _dense(layer.intermediate_dense),
                "output": _dense(layer.output_dense)}
    if name in ("TransformerEncoderLayer", "TransformerDecoderLayer"):
        params = {}
        for part in ("self_attention", "cross_attention", "feed_forward"):
            if hasattr(layer, part):
                params[part] = reference_params(getattr(layer, part))
                params[part + "_norm"] = _norm(getattr(layer, part + "_norm"))
        return params
    raise TypeError(f"no reference layout for layer type {name}")


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
        if variable.path.endswith("gamma"):
            value = 1.0 + value
        variable.assign(value.astype(keras.backend.standardize_dtype(variable.dtype)))
