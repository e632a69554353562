"""Which sublayers hold the weights of each keras_attn layer kind (plain data, no imports).

Weights are named like the reference's parameter dicts, flattened with "/":
`query/kernel`, `self_attention/query/kernel`, `feed_forward_norm/gamma`.
`testing.weights.named_variables` walks a built layer by this table, and the
parity cases (plain NumPy) name their weights from it.
"""

__all__ = ["LAYOUT"]

# Layer kind -> its dense sublayers (`<part>_dense`), its norms (`<part>`,
# LayerNormalization `gamma`/`beta` or RMSNormalization `scale`), or its
# blocks (each a sublayer `<part>` plus a norm `<part>_norm`), or its own weights
# (`<part>`: attention sinks), or its projections (`Dense` sublayers `<part>` named without
# the `_dense` suffix: GatedDeltaNet's `in_proj_qkv`, ...). Parts a layer
# was built without (a gate, qk norms, cross-attention) are skipped.
LAYOUT = {
    "MultiHeadAttention": {"dense": ("query", "key", "value", "gate", "output"),
                           "norms": ("query_norm", "key_norm"), "weights": ("sinks",)},
    "MultiHeadLatentAttention": {"dense": ("query", "query_a", "query_b", "key_value_a",
                                           "key_value_b", "output"),
                                 "norms": ("query_a_norm", "key_value_a_norm")},
    "PositionwiseFeedForward": {"dense": ("gate", "intermediate", "output")},
    "GatedDeltaNet": {"projections": ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a",
                                      "out_proj"),
                      "weights": ("conv1d_kernel", "dt_bias", "A_log", "norm_scale")},
    "TransformerEncoderLayer": {"blocks": ("self_attention", "feed_forward"),
                                "norms": ("post_attention_norm", "post_feed_forward_norm")},
    "TransformerDecoderLayer": {"blocks": ("self_attention", "cross_attention", "feed_forward"),
                                "norms": ("post_attention_norm", "post_cross_attention_norm",
                                          "post_feed_forward_norm")},
}
