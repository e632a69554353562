"""A `keras_attn.MultiHeadAttention` from a `keras.layers.MultiHeadAttention`."""

import keras

from keras_attn.convert._common import MHA_DERIVED, assign, check_kwargs, mha_plan
from keras_attn.layers.multi_head_attention import MultiHeadAttention

__all__ = ["multi_head_attention_from_keras"]

# Keras MHA equations for rank-3 inputs (the default attention axes).
_KERAS_PROJECTION_EQUATION = "abc,cde->abde"
_KERAS_OUTPUT_EQUATION = "abcd,cde->abe"


def multi_head_attention_from_keras(layer, **kwargs):
    """A `keras_attn.MultiHeadAttention` with the weights of a Keras one.

    Keras's `EinsumDense` kernels `(D_q, H, d_k)`, `(D_k, H, d_k)`,
    `(D_v, H, d_v)`, `(H, d_v, D_out)` and biases `(H, d)`, `(D_out,)` are
    reshaped into our `Dense` kernels `(D_q, H * d_k)`, ..., `(H * d_v, D_out)`
    (head `h` owns columns `[h * d, (h + 1) * d)`). Both layers compute the
    same function, called the same way (`(query, value, key)`).

    Args:
        layer: a built `keras.layers.MultiHeadAttention` for rank-3 inputs
            (query `(B, T, D_q)`, key `(B, S, D_k)`, value `(B, S, D_v)`)
            with the default `attention_axes`, a single-axis `output_shape`
            (or none), no `use_gate`, and not quantized. A `sliding_window`
            comes along (the same band when T == S; with T != S keras_attn
            aligns it bottom-right, as its causal mask).
            Its regularizers, constraints and activity regularizer come along.
        **kwargs: further arguments of `keras_attn.MultiHeadAttention`
            (`name`, `implementation`, `dtype`, `dropout`, `seed`, ...).
            By default `dropout`, `seed`, `dtype`, the initializers and the
            regularizers are copied from `layer`; `num_heads`, `key_dim`,
            `value_dim`, `output_dim` and `use_bias` are read from it and
            cannot be passed.

    Returns:
        A built `keras_attn.MultiHeadAttention` with H = `layer.num_heads`,
        `key_dim` d_k, `value_dim` d_v, output width D_out, and the same
        weights.

    Raises:
        ValueError: `layer` is not a built Keras `MultiHeadAttention`, or it
            uses an option listed above that keras_attn does not have.
    """
    if not isinstance(layer, keras.layers.MultiHeadAttention):
        raise ValueError(
            "`layer` must be a `keras.layers.MultiHeadAttention`. "
            f"Received: layer of type {type(layer).__name__}")
    if not layer.built:
        raise ValueError(
            f"`layer` ('{layer.name}') must be built (call it once, or call `build`) so that "
            "its weights exist. Received: an unbuilt layer")
    check_kwargs(kwargs, MHA_DERIVED, "Keras layer")
    problems = []
    if getattr(layer, "_use_gate", False):
        problems.append("use_gate=True")
    output_shape = getattr(layer, "_output_shape", None)
    if output_shape and len(output_shape) != 1:
        problems.append(f"output_shape={output_shape} (only one output axis is supported)")
    equations = [d.equation for d in (layer._query_dense, layer._key_dense, layer._value_dense)]
    if (any(e != _KERAS_PROJECTION_EQUATION for e in equations)
            or layer._output_dense.equation != _KERAS_OUTPUT_EQUATION
            or tuple(layer._attention_axes or (1,)) != (1,)):
        problems.append(
            f"attention_axes={layer._attention_axes} on inputs of rank "
            f"{len(equations[0].split(',')[0])} (only rank-3 inputs (B, T, D) with the "
            "default attention axes are supported)")
    for dense in (layer._query_dense, layer._key_dense, layer._value_dense, layer._output_dense):
        if getattr(dense, "quantization_mode", None):
            problems.append(f"quantization_mode={dense.quantization_mode!r}")
            break
    if problems:
        raise ValueError(
            f"Cannot convert Keras MultiHeadAttention '{layer.name}': keras_attn.MultiHeadAttention "
            f"does not support {'; '.join(problems)}.")

    H, d_k, d_v = layer.num_heads, layer.key_dim, layer.value_dim
    read = keras.ops.convert_to_numpy
    weights, widths = {}, {}
    for part, dense in (("query", layer._query_dense), ("key", layer._key_dense),
                        ("value", layer._value_dense)):
        kernel = read(dense.kernel)  # (D_in, H, d)
        widths[part] = kernel.shape[0]
        bias = read(dense.bias).reshape(-1) if layer.use_bias else None  # (H * d,)
        weights[part] = (kernel.reshape(kernel.shape[0], -1), bias)
    out_kernel = read(layer._output_dense.kernel)  # (H, d_v, D_out)
    out_dim = out_kernel.shape[-1]
    weights["output"] = (out_kernel.reshape(H * d_v, out_dim),
                         read(layer._output_dense.bias) if layer.use_bias else None)

    options = {
        "dropout": layer.dropout,
        "seed": layer.seed,
        "dtype": layer.dtype_policy,
        "kernel_initializer": keras.initializers.serialize(layer._kernel_initializer),
        "bias_initializer": keras.initializers.serialize(layer._bias_initializer),
        "kernel_regularizer": layer._kernel_regularizer,
        "bias_regularizer": layer._bias_regularizer,
        "kernel_constraint": layer._kernel_constraint,
        "bias_constraint": layer._bias_constraint,
        "activity_regularizer": layer.activity_regularizer,
        "sliding_window": getattr(layer, "_sliding_window", None),
    }
    options.update(kwargs)
    new = MultiHeadAttention(
        H, key_dim=d_k, value_dim=d_v if d_v != d_k else None,
        output_dim=out_dim if output_shape else None, use_bias=layer.use_bias, **options)
    new.build(query_shape=(None, None, widths["query"]), key_shape=(None, None, widths["key"]),
              value_shape=(None, None, widths["value"]))
    assign(mha_plan(new, weights))
    return new
