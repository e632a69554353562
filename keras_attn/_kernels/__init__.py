"""The three attention paths, one module each, over `(..., L, d)` tensors.

- `explicit`: materialised logits and weights, softmax in float32 at least;
  the only path that returns the weights or applies attention dropout.
- `fused`: `keras.ops.dot_product_attention` (PyTorch's SDPA, cuDNN/flash on
  GPU), wrapped so that it has this package's mask semantics.
- `blockwise`: an online-softmax loop over blocks of queries and keys with a
  recomputing custom gradient (memory linear in the sequence length).
- `common`: what they share (grouped heads, zeroing the keys no query sees,
  empty sequences).

Layers do not call these: `keras_attn.attention` is the door (`attend`,
`scaled_dot_product_attention`), and `keras_attn._policy` picks the path.
Positional masks come from `keras_attn._masks`.
"""
