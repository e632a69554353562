"""Gemma 4's (Gemma 3n's) per-layer input embeddings, for `CausalLM`.

Every block i gets, beside the residual stream, a P-wide input of its own made from
the token ids and the scaled embeddings `x` `(B, T, D)`:

    tokens    = sqrt(P) * E_per_layer[ids]                  (B, T, L, P)
    projected = norm(x W / sqrt(D))                         (B, T, L, P)
    inputs    = (projected + tokens) / sqrt(2)              slice i to block i

as transformers' `Gemma4TextModel.get_per_layer_inputs` and
`project_per_layer_inputs`. L is the number of blocks, P
`hidden_size_per_layer_input`. The sublayers (weight names) are
`embed_tokens_per_layer` `Embedding(V_p, L * P)`, `per_layer_model_projection`
`Dense(L * P)` without bias, `per_layer_projection_norm` (RMS over P).
"""

import keras
from keras import ops

__all__ = ["add_sublayers", "build", "check", "compute"]


def check(lm):
    """Refuse a per-layer vocabulary without per-layer inputs."""
    if lm.vocab_size_per_layer_input is not None and not lm.hidden_size_per_layer_input:
        raise ValueError(
            "`vocab_size_per_layer_input` is the per-layer embeddings' vocabulary, which "
            "need `hidden_size_per_layer_input`. Received: vocab_size_per_layer_input="
            f"{lm.vocab_size_per_layer_input}, hidden_size_per_layer_input=None")


def add_sublayers(lm):
    """Make `lm`'s three per-layer-input sublayers (in `CausalLM.__init__`)."""
    L, P = len(lm.blocks), lm.hidden_size_per_layer_input
    lm.embed_tokens_per_layer = keras.layers.Embedding(
        lm.vocab_size_per_layer_input or lm.vocabulary_size, L * P,
        dtype=lm.dtype_policy, name="embed_tokens_per_layer")
    lm.per_layer_model_projection = keras.layers.Dense(
        L * P, use_bias=False, dtype=lm.dtype_policy, name="per_layer_model_projection")
    lm.per_layer_projection_norm = keras.layers.RMSNormalization(
        epsilon=lm.layer_norm_epsilon, dtype=lm.dtype_policy, name="per_layer_projection_norm")


def build(lm, hidden_shape):
    """Build them for hidden states of `hidden_shape` `(None, None, D)`."""
    lm.embed_tokens_per_layer.build((None, None))
    lm.per_layer_model_projection.build(hidden_shape)
    lm.per_layer_projection_norm.build((None, None, None, lm.hidden_size_per_layer_input))


def compute(lm, token_ids, x):
    """`(B, T, L, P)`: the per-layer inputs of `token_ids` `(B, T)` and their scaled
    embeddings `x` `(B, T, D)`."""
    L, P = len(lm.blocks), lm.hidden_size_per_layer_input
    B, T = ops.shape(x)[0], ops.shape(x)[1]
    tokens = lm.embed_tokens_per_layer(token_ids)  # (B, T, L * P)
    tokens = ops.reshape(tokens * ops.cast(P ** 0.5, tokens.dtype), (B, T, L, P))
    projected = lm.per_layer_model_projection(x) * ops.cast(lm.hidden_dim ** -0.5, x.dtype)
    projected = lm.per_layer_projection_norm(ops.reshape(projected, (B, T, L, P)))
    return (projected + ops.cast(tokens, projected.dtype)) * ops.cast(2.0 ** -0.5,
                                                                      projected.dtype)
