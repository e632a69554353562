"""The projections of `MultiHeadAttention`: inputs into heads, heads into the output.

Dimension letters: B batch, L a sequence length (T or S), H heads (or H_kv),
d a head width, D_out the output width. The sublayers are plain
`keras.layers.Dense` (public weight names `query_dense`, `key_dense`,
`value_dense`, `output_dense`); their kernels `(in, H * d)` are read as
`(in, H, d)` by a free reshape.
"""

import keras
from keras import ops

from keras_attn import _hooks
from keras_attn.cache import positions
from keras_attn.layers._common import clone_initializer
from keras_attn.rotary import apply_rope

__all__ = ["dense", "dense_config", "einsum_sums_in_float32", "full_width_norm", "gate",
           "head_norm", "project_heads", "project_output", "projection_form", "qk_norm_layer",
           "query_positions", "query_scale", "rope", "rope_heads", "set_dense_arguments",
           "value_norm"]

_DENSE_ARGUMENTS = {f"{part}_{kind}": module
                    for kind, module in (("initializer", keras.initializers),
                                         ("regularizer", keras.regularizers),
                                         ("constraint", keras.constraints))
                    for part in ("kernel", "bias")}


def set_dense_arguments(layer, **arguments):
    """`layer.kernel_initializer = keras.initializers.get(...)`, and so on for the six
    `Dense` arguments (`kernel_` / `bias_` + initializer, regularizer, constraint)."""
    for name, value in arguments.items():
        setattr(layer, name, _DENSE_ARGUMENTS[name].get(value))


def dense_config(layer):
    """The six `Dense` arguments of `layer`, serialised for its config."""
    return {name: module.serialize(getattr(layer, name))
            for name, module in _DENSE_ARGUMENTS.items()}


def rope(x, positions, options):
    """`(B, L, heads, d)` heads rotated by the options' RoPE (`options.rope`, a `RopeSpec`)."""
    return apply_rope(x, options.rope, positions)


def dense(layer, units, name, use_bias=None, activation=None):
    """A `Dense` sublayer of `layer` with its initializers, regularizers and constraints.

    `use_bias` None: the layer's `use_bias`.
    """
    return keras.layers.Dense(
        units,
        activation=activation,
        use_bias=layer.use_bias if use_bias is None else use_bias,
        kernel_initializer=clone_initializer(layer.kernel_initializer),
        bias_initializer=clone_initializer(layer.bias_initializer),
        kernel_regularizer=layer.kernel_regularizer,
        bias_regularizer=layer.bias_regularizer,
        kernel_constraint=layer.kernel_constraint,
        bias_constraint=layer.bias_constraint,
        dtype=layer.dtype_policy,
        name=name,
    )


def qk_norm_layer(kind, epsilon, head_dim, dtype, name):
    """`query_norm` / `key_norm`: one scale over `head_dim` features, d (shared by the
    heads) or, with `qk_norm_full_width`, H * d or H_kv * d (OLMo 2)."""
    cls = keras.layers.RMSNormalization if kind == "rms" else keras.layers.LayerNormalization
    layer = cls(epsilon=epsilon, dtype=dtype, name=name)
    layer.build((None, None, None, head_dim))
    return layer


def head_norm(norm, x):
    """`norm` over each head's d features of `(B, L, heads, d)`."""
    return norm(x)


def full_width_norm(norm, x):
    """`norm` over all `heads * d` features of `(B, L, heads, d)` at once (OLMo 2's
    `q_norm = RMSNorm(H * d)` on the projection, before it is split into heads)."""
    B, L = ops.shape(x)[0], ops.shape(x)[1]
    heads, d = x.shape[2], x.shape[3]
    return ops.reshape(norm(ops.reshape(x, (B, L, heads * d))), (B, L, heads, d))


def value_norm(v, epsilon):
    """`(B, L, heads, d)` values over their root mean square over d, without a scale:
    `v / sqrt(mean(v^2) + epsilon)` (Gemma 4's `v_norm`), in float32 at least and cast
    back to v's dtype, as transformers' `Gemma4RMSNorm`."""
    dtype = v.dtype
    compute = "float64" if keras.backend.standardize_dtype(dtype) == "float64" else "float32"
    x = ops.cast(v, compute)
    x = x * ops.rsqrt(ops.mean(ops.square(x), axis=-1, keepdims=True) + epsilon)
    return ops.cast(x, dtype)


def _plain(dense):
    """Whether `dense` computes `x @ kernel + bias` (no LoRA, no quantization)."""
    return not getattr(dense, "lora_enabled", False) and not getattr(
        dense, "quantization_mode", None)


def einsum_sums_in_float32(x):
    """Whether the projections of `x` may run as one `ops.einsum`: not in float16.

    Every backend's `ops.matmul` sums float16 products in float32 and rounds
    once; their einsums do not all. NumPy's (`np.einsum` in float16, under
    Keras's NumPy backend) rounds every partial sum to float16, 2-3x the
    error of one rounding, and TensorFlow's sums the heads of the heads-first
    output projection (`bhtd,hdo->bto`) in float16. That failed the float16
    parity of cached decoding on NumPy (2.2e-2 from the float64 reference,
    1.8e-2 from TensorFlow), so float16 projections are matmuls: the same
    rule on every backend. float32 and bfloat16 keep the einsum (NumPy runs
    a bfloat16 einsum in float32): the matmul form of the input projections
    measured 8-10% slower in JAX's compiled train step (CPU, B=8 T=128
    D=256 H=8).
    """
    return keras.backend.standardize_dtype(x.dtype) != "float16"


def projection_form():
    """How the plain projections run: `"einsum"` over the `(in, H, d)` view of the kernel,
    or `"matmul"`, one GEMM over the 2-D kernel and a free reshape. The same weights
    either way; which is faster depends on the backend (measured by
    `python -m benchmarks.projection_forms`), so the `"projection_form"` hook (the
    backend boundary's table of those measurements) decides; `"einsum"` without it."""
    form = _hooks.get("projection_form")
    return "einsum" if form is None else form()


def project_heads(dense, x, heads, head_dim):
    """`dense(x)` `(B, L, in)` as `(B, L, heads, d)`.

    One einsum into the heads layout (as Keras's own MHA does with
    `EinsumDense`), or one matmul and a reshape (`projection_form`); the
    weights are the same. A LoRA or quantized `Dense`, and float16
    (`einsum_sums_in_float32`), go through `dense(x)` and a reshape.
    """
    if not _plain(dense) or not einsum_sums_in_float32(x):
        y = dense(x)  # (B, L, heads * d)
        return ops.reshape(y, (ops.shape(y)[0], ops.shape(y)[1], heads, head_dim))
    if projection_form() == "matmul":
        y = ops.matmul(x, dense.kernel)  # (B, L, heads * d)
        if dense.bias is not None:
            y = y + dense.bias
        y = ops.reshape(y, (ops.shape(y)[0], ops.shape(y)[1], heads, head_dim))
        return dense.activation(y)
    kernel = ops.reshape(dense.kernel, (dense.kernel.shape[0], heads, head_dim))
    y = ops.einsum("bli,ihd->blhd", x, kernel)
    if dense.bias is not None:
        y = y + ops.reshape(dense.bias, (heads, head_dim))
    return dense.activation(y)  # `linear` (the identity) unless set, as for the gate


def gate(dense, query, attended, heads, head_dim, heads_first=False):
    """Keras's `use_gate`: `attended * sigmoid(query W_g + b_g)`, per head and feature.

    `dense` is the `gate_dense` sublayer (activation sigmoid) on the query
    input `(B, T, q_dim)`; `attended` is `(B, T, H, d_v)` (`(B, H, T, d_v)`
    if `heads_first`). Gated attention output, arXiv 2505.06708 (Qwen3-Next).
    """
    g = project_heads(dense, query, heads, head_dim)  # (B, T, H, d_v)
    return attended * (ops.swapaxes(g, 1, 2) if heads_first else g)


def rope_heads(q, k, query_length, key_length, cache, cache_update_index, options):
    """RoPE of the projected `q` `(B, T, H, d)` and `k` `(B, S_new, H_kv, d)` at their
    absolute positions (`k` None: a read-only cache, whose stored keys are rotated
    already, and the queries end at its S_max)."""
    if k is None:
        q_positions, _ = positions(query_length, ops.shape(cache)[2])
        return rope(q, q_positions, options), None
    q_positions, k_positions = positions(
        query_length, key_length, 0 if cache is None else cache_update_index)
    return rope(q, q_positions, options), rope(k, k_positions, options)


def query_positions(query_length, key_length):
    """The absolute positions `(T,)` of T queries over S keys without a cache
    (bottom-right aligned, as RoPE's: query i at `i + S - T`)."""
    return positions(query_length, key_length)[0]


def query_scale(q, q_positions, options):
    """`(B, T, H, d)` queries times `1 + beta * log(1 + floor((p + o) / n))` at their absolute
    positions `(T,)` (`options.query_scale_beta`, `options.query_scale_length`,
    `options.query_scale_offset`; o = 1: Llama 4's temperature tuning):
    transformers' `get_llama_4_attn_scale`, computed in float32 and cast to q's dtype
    as there. The floor is an integer division (exact at any position)."""
    steps = ops.floor_divide(ops.cast(q_positions, "int32") + options.query_scale_offset,
                             options.query_scale_length)
    scale = 1.0 + options.query_scale_beta * ops.log1p(ops.cast(steps, "float32"))
    return ops.multiply(q, ops.cast(ops.reshape(scale, (1, -1, 1, 1)), q.dtype))  # (1, T, 1, 1)


def project_output(dense, attended, heads, head_dim, heads_first=False):
    """`dense` over `(B, T, H, d_v)` (`(B, H, T, d_v)` if `heads_first`): `(B, T, D_out)`.

    One einsum contracts heads and width in either layout, so no transpose
    back (the decode step measured faster so); a LoRA or quantized `Dense`,
    and float16, get `(B, T, H * d_v)` and `dense`.
    """
    if not _plain(dense) or not einsum_sums_in_float32(attended):
        if heads_first:
            attended = ops.swapaxes(attended, 1, 2)  # (B, T, H, d_v)
        B, T = ops.shape(attended)[0], ops.shape(attended)[1]
        return dense(ops.reshape(attended, (B, T, heads * head_dim)))  # (B, T, D_out)
    if projection_form() == "matmul":
        if heads_first:
            attended = ops.swapaxes(attended, 1, 2)  # (B, T, H, d_v)
        B, T = ops.shape(attended)[0], ops.shape(attended)[1]
        y = ops.matmul(ops.reshape(attended, (B, T, heads * head_dim)), dense.kernel)
        return y if dense.bias is None else y + dense.bias  # (B, T, D_out)
    kernel = ops.reshape(dense.kernel, (heads, head_dim, -1))  # (H, d_v, D_out)
    y = ops.einsum("bhtd,hdo->bto" if heads_first else "bthd,hdo->bto", attended, kernel)
    if dense.bias is not None:
        y = y + dense.bias
    return y
