"""A `keras_attn.MultiHeadAttention` from a `keras.layers.MultiHeadAttention`."""

import keras

from keras_attn.convert import _common
from keras_attn.layers.multi_head_attention import MultiHeadAttention

__all__ = ["multi_head_attention_from_keras"]

# Keras MHA equations for rank-3 inputs (the default attention axes).
_KERAS_PROJECTION_EQUATION = "abc,cde->abde"
_KERAS_OUTPUT_EQUATION = "abcd,cde->abe"


def multi_head_attention_from_keras(layer: keras.layers.MultiHeadAttention,
                                    **kwargs) -> MultiHeadAttention:
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
    _common.check_kwargs(kwargs, _common.MHA_DERIVED, "Keras layer")
    arguments = _unexposed_arguments(layer)
    _check_supported(layer, arguments)

    H, d_k, d_v = layer.num_heads, layer.key_dim, layer.value_dim
    read = keras.ops.convert_to_numpy
    weights, widths = {}, {}
    for part, dense in (("query", layer.query_dense), ("key", layer.key_dense),
                        ("value", layer.value_dense)):
        kernel = read(dense.kernel)  # (D_in, H, d)
        widths[part] = kernel.shape[0]
        bias = read(dense.bias).reshape(-1) if layer.use_bias else None  # (H * d,)
        weights[part] = (kernel.reshape(kernel.shape[0], -1), bias)
    out_kernel = read(layer.output_dense.kernel)  # (H, d_v, D_out)
    out_dim = out_kernel.shape[-1]
    weights["output"] = (out_kernel.reshape(H * d_v, out_dim),
                         read(layer.output_dense.bias) if layer.use_bias else None)

    options = {**_options(layer), "sliding_window": arguments["sliding_window"], **kwargs}
    new = MultiHeadAttention(
        H, key_dim=d_k, value_dim=d_v if d_v != d_k else None,
        output_dim=out_dim if arguments["output_shape"] else None, use_bias=layer.use_bias,
        **options)
    new.build(query_shape=(None, None, widths["query"]), key_shape=(None, None, widths["key"]),
              value_shape=(None, None, widths["value"]))
    _common.assign(_common.mha_plan(new, weights))
    return new


def _unexposed_arguments(layer):
    """`use_gate`, `output_shape` and `sliding_window` of a Keras MultiHeadAttention.

    The converter's only private reads. Keras has no public attribute for
    these three (it keeps `output_shape` private on purpose: a public one
    may conflict with `summary()` of Functional and Sequential models).
    `get_config()` has them, but it serializes every regularizer and
    constraint too, and so raises `NotImplementedError` for a custom one
    without `get_config`, which the converter takes as it is. So they are
    read where `get_config()` reads them; the defaults are for Keras before
    3.14 (`use_gate`) and 3.15 (`sliding_window`).
    """
    return {"use_gate": getattr(layer, "_use_gate", False),
            "output_shape": getattr(layer, "_output_shape", None),
            "sliding_window": getattr(layer, "_sliding_window", None)}


def _check_supported(layer, arguments):
    """Raise if `layer` uses an option keras_attn lacks (`arguments`: `_unexposed_arguments`)."""
    problems = []
    if arguments["use_gate"]:
        problems.append("use_gate=True")
    output_shape = arguments["output_shape"]
    if output_shape and len(output_shape) != 1:
        problems.append(f"output_shape={output_shape} (only one output axis is supported)")
    projections = (layer.query_dense, layer.key_dense, layer.value_dense)
    equations = [dense.equation for dense in projections]
    if (any(e != _KERAS_PROJECTION_EQUATION for e in equations)
            or layer.output_dense.equation != _KERAS_OUTPUT_EQUATION
            or tuple(layer.attention_axes or (1,)) != (1,)):
        problems.append(
            f"attention_axes={layer.attention_axes} on inputs of rank "
            f"{len(equations[0].split(',')[0])} (only rank-3 inputs (B, T, D) with the "
            "default attention axes are supported)")
    for dense in (*projections, layer.output_dense):
        if dense.quantization_mode:
            problems.append(f"quantization_mode={dense.quantization_mode!r}")
            break
    if problems:
        raise ValueError(
            f"Cannot convert Keras MultiHeadAttention '{layer.name}': keras_attn.MultiHeadAttention "
            f"does not support {'; '.join(problems)}.")


def _options(layer):
    """Arguments of `layer` that `keras_attn.MultiHeadAttention` takes as they are.

    Keras hands its four projections the regularizer and constraint objects
    themselves and a copy of each initializer (`from_config(get_config())`,
    so it serializes alike): they are read from `query_dense`, the public
    `EinsumDense` attributes. The initializers go serialized, so that the
    new layer has copies of its own.
    """
    projection = layer.query_dense
    return {
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
    }
