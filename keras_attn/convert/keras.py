"""A `keras_attn.MultiHeadAttention` from a `keras.layers.MultiHeadAttention` or a
`keras.layers.GroupQueryAttention`."""

import keras

from keras_attn.convert import _common
from keras_attn.layers.multi_head_attention import MultiHeadAttention

__all__ = ["multi_head_attention_from_keras"]

# Keras MHA equations for rank-3 inputs (the default attention axes).
_KERAS_PROJECTION_EQUATION = "abc,cde->abde"
_KERAS_OUTPUT_EQUATION = "abcd,cde->abe"
# Keras's GroupQueryAttention takes rank-3 inputs only: its equations are fixed.
_GQA_EQUATIONS = {"query": "bqm,muh->bquh", "key": "bkm,mvh->bkvh", "value": "bkm,mvh->bkvh",
                  "gate": "bqm,muh->bquh", "output": "bquh,uhm->bqm"}

# Read from the source layer (its weights say them), never passed.
_MHA_DERIVED = (*_common.MHA_DERIVED, "use_gate")
_GQA_DERIVED = (*_MHA_DERIVED, "num_key_value_heads")


def _gqa_class():
    return getattr(keras.layers, "GroupQueryAttention", None)


def multi_head_attention_from_keras(layer: keras.layers.Layer, **kwargs) -> MultiHeadAttention:
    """A `keras_attn.MultiHeadAttention` with the weights of a Keras one.

    Keras's `EinsumDense` kernels `(D_q, H, d_k)`, `(D_k, H_kv, d_k)`,
    `(D_v, H_kv, d_v)`, `(H, d_v, D_out)` (and the gate's `(D_q, H, d_v)`)
    and biases `(H, d)`, `(D_out,)` are reshaped into our `Dense` kernels
    `(D_q, H * d_k)`, ..., `(H * d_v, D_out)` (head `h` owns columns
    `[h * d, (h + 1) * d)`; query head h reads key/value head `h // G`, as
    Keras's `repeat`). Both layers compute the same function, called the same
    way (`(query, value, key)`).

    Args:
        layer: a built `keras.layers.MultiHeadAttention` for rank-3 inputs
            (query `(B, T, D_q)`, key `(B, S, D_k)`, value `(B, S, D_v)`)
            with the default `attention_axes`, a single-axis `output_shape`
            (or none), and not quantized; or a built
            `keras.layers.GroupQueryAttention` (H = `num_query_heads`, H_kv =
            `num_key_value_heads`, d_k = d_v = `head_dim`), not quantized.
            Both: `use_gate` comes along (keras_attn's `gate_dense`), and so
            does `flash_attention` (as keras_attn's flag, unless `kwargs`
            choose an `implementation`). A `sliding_window` comes along: it is
            Keras's band `|i - j| < W` (with a causal mask also `j <= i`)
            whenever T == S, on calls with and without `use_causal_mask`;
            with T != S keras_attn aligns the window and the causal mask
            bottom-right, Keras top-left. Its regularizers, constraints and
            activity regularizer come along.
        **kwargs: further arguments of `keras_attn.MultiHeadAttention`
            (`name`, `implementation`, `dtype`, `dropout`, `seed`, ...).
            By default `dropout`, `seed`, `dtype`, the initializers and the
            regularizers are copied from `layer`; `num_heads`, `key_dim`,
            `value_dim`, `output_dim`, `use_bias`, `use_gate` (and from a
            GroupQueryAttention `num_key_value_heads`) are read from it and
            cannot be passed.

    Returns:
        A built `keras_attn.MultiHeadAttention` with H = `layer.num_heads`
        (or `num_query_heads`), `key_dim` d_k, `value_dim` d_v, output width
        D_out, and the same weights.

    Raises:
        ValueError: `layer` is not a built Keras `MultiHeadAttention` or
            `GroupQueryAttention`, or it uses an option listed above that
            keras_attn does not have (the message names the argument and
            its value).
    """
    gqa = _gqa_class()
    is_gqa = gqa is not None and isinstance(layer, gqa)
    if not is_gqa and not isinstance(layer, keras.layers.MultiHeadAttention):
        raise ValueError(
            "`layer` must be a `keras.layers.MultiHeadAttention` or a "
            "`keras.layers.GroupQueryAttention`. "
            f"Received: layer of type {type(layer).__name__}")
    if not layer.built:
        raise ValueError(
            f"`layer` ('{layer.name}') must be built (call it once, or call `build`) so that "
            "its weights exist. Received: an unbuilt layer")
    _common.check_kwargs(kwargs, _GQA_DERIVED if is_gqa else _MHA_DERIVED, "Keras layer")
    hidden = _unexposed_arguments(layer)
    if is_gqa:
        source = _gqa_source(layer, hidden)
    else:
        source = _mha_source(layer, hidden)
    _check_quantization(layer, source["dense"])

    read = keras.ops.convert_to_numpy
    weights, widths = {}, {}
    for part, dense in source["dense"].items():
        kernel = read(dense.kernel)  # (D_in, heads, d), or the output's (H, d_v, D_out)
        bias = read(dense.bias).reshape(-1) if source["use_bias"] else None  # (heads * d,)
        if part == "output":
            weights[part] = (kernel.reshape(-1, kernel.shape[-1]), bias)
        else:
            widths[part] = kernel.shape[0]
            weights[part] = (kernel.reshape(kernel.shape[0], -1), bias)

    options = {**_options(layer, source), **kwargs}
    if source["flash_attention"] is not None and "implementation" not in kwargs:
        options.setdefault("flash_attention", source["flash_attention"])
    H, d_k, d_v = source["num_heads"], source["key_dim"], source["value_dim"]
    new = MultiHeadAttention(
        H, key_dim=d_k, value_dim=d_v if d_v != d_k else None,
        output_dim=source["output_dim"], use_bias=source["use_bias"],
        use_gate=source["use_gate"], **options)
    new.build(query_shape=(None, None, widths["query"]), key_shape=(None, None, widths["key"]),
              value_shape=(None, None, widths["value"]))
    plan = _common.mha_plan(new, weights)
    if source["use_gate"]:
        plan += _common.dense_plan(new.gate_dense, *weights["gate"], "gate")
    _common.assign(plan)
    return new


def _unexposed_arguments(layer):
    """What Keras keeps private: the converter's only private reads.

    A MultiHeadAttention's `use_gate`, `output_shape`, `sliding_window`,
    `flash_attention` and gate sublayer; a GroupQueryAttention's
    `flash_attention` and all five sublayers. Keras has no public attribute
    for these (it keeps `output_shape` private on purpose: a public one may
    conflict with `summary()` of Functional and Sequential models).
    `get_config()` has the options, but it serializes every regularizer and
    constraint too, and so raises `NotImplementedError` for a custom one
    without `get_config`, which the converter takes as it is. So they are
    read where `get_config()` reads them; the defaults are for Keras before
    3.14 (`use_gate`) and 3.15 (`sliding_window`).
    """
    flash = getattr(layer, "_flash_attention", None)
    gate = getattr(layer, "_gate_dense", None)
    if isinstance(layer, keras.layers.MultiHeadAttention):
        return {"use_gate": getattr(layer, "_use_gate", False),
                "output_shape": getattr(layer, "_output_shape", None),
                "sliding_window": getattr(layer, "_sliding_window", None),
                "flash_attention": flash, "gate": gate}
    return {"flash_attention": flash, "gate": gate, "query": layer._query_dense,
            "key": layer._key_dense, "value": layer._value_dense, "output": layer._output_dense}


def _refuse(layer, problems):
    if problems:
        kind = ("MultiHeadAttention" if isinstance(layer, keras.layers.MultiHeadAttention)
                else "GroupQueryAttention")
        raise ValueError(
            f"Cannot convert Keras {kind} '{layer.name}': "
            f"keras_attn.MultiHeadAttention does not support {'; '.join(problems)}.")


def _mha_source(layer, hidden):
    """The parts of a Keras MultiHeadAttention, after refusing what keras_attn lacks."""
    problems = []
    output_shape = hidden["output_shape"]
    if output_shape and len(output_shape) != 1:
        problems.append(f"output_shape={output_shape} (only one output axis is supported)")
    dense = {"query": layer.query_dense, "key": layer.key_dense, "value": layer.value_dense}
    if hidden["use_gate"]:
        dense["gate"] = hidden["gate"]
    equations = [d.equation for d in dense.values()]
    if (any(e != _KERAS_PROJECTION_EQUATION for e in equations)
            or layer.output_dense.equation != _KERAS_OUTPUT_EQUATION
            or tuple(layer.attention_axes or (1,)) != (1,)):
        problems.append(
            f"attention_axes={layer.attention_axes} on inputs of rank "
            f"{len(equations[0].split(',')[0])} (only rank-3 inputs (B, T, D) with the "
            "default attention axes are supported)")
    _refuse(layer, problems)
    dense["output"] = layer.output_dense
    out_dim = int(layer.output_dense.kernel.shape[-1])
    return {"dense": dense, "num_heads": layer.num_heads, "key_dim": layer.key_dim,
            "value_dim": layer.value_dim, "use_bias": layer.use_bias,
            "use_gate": bool(hidden["use_gate"]),
            "output_dim": out_dim if output_shape else None,
            "sliding_window": hidden["sliding_window"],
            "flash_attention": hidden["flash_attention"], "query_dense": layer.query_dense}


def _gqa_source(layer, hidden):
    """The parts of a Keras GroupQueryAttention, after refusing what keras_attn lacks."""
    use_gate = bool(getattr(layer, "use_gate", False))  # Keras >= 3.15
    parts = ("query", "key", "value", "output") + (("gate",) if use_gate else ())
    dense = {part: hidden[part] for part in parts}
    odd = [f"the {part} equation {d.equation!r}" for part, d in dense.items()
           if d.equation != _GQA_EQUATIONS[part]]
    _refuse(layer, [f"{', '.join(odd)} (expected Keras's {_GQA_EQUATIONS})"] if odd else [])
    return {"dense": dense, "num_heads": layer.num_query_heads, "key_dim": layer.head_dim,
            "value_dim": layer.head_dim, "use_bias": layer.use_bias, "use_gate": use_gate,
            "output_dim": None, "num_key_value_heads": layer.num_key_value_heads,
            "sliding_window": getattr(layer, "sliding_window", None),  # Keras >= 3.15
            "flash_attention": hidden["flash_attention"], "query_dense": hidden["query"]}


def _check_quantization(layer, dense):
    for sublayer in dense.values():
        if sublayer.quantization_mode:
            _refuse(layer, [f"quantization_mode={sublayer.quantization_mode!r}"])


def _options(layer, source):
    """Arguments of `layer` that `keras_attn.MultiHeadAttention` takes as they are.

    Keras hands its projections the regularizer and constraint objects
    themselves and a copy of each initializer (`from_config(get_config())`,
    so it serializes alike): they are read from the query projection, the
    same for every Keras version and both layers. The initializers go
    serialized, so that the new layer has copies of its own.
    """
    projection = source["query_dense"]
    options = {
        "dropout": layer.dropout,
        "seed": layer.seed,
        "dtype": layer.dtype_policy,
        "kernel_initializer": keras.initializers.serialize(projection.kernel_initializer),
        "bias_initializer": keras.initializers.serialize(projection.bias_initializer),
        "kernel_regularizer": projection.kernel_regularizer,
        "bias_regularizer": projection.bias_regularizer,
        "kernel_constraint": projection.kernel_constraint,
        "bias_constraint": projection.bias_constraint,
        "activity_regularizer": layer.activity_regularizer,
        "sliding_window": source["sliding_window"],
    }
    if "num_key_value_heads" in source:
        options["num_key_value_heads"] = source["num_key_value_heads"]
    return options
