"""`dot_product_attention`: `keras.ops.dot_product_attention`, keeping float64 where the
backend has float64.

Keras 3.15's PyTorch backend computes `ops.dot_product_attention` and `ops.matmul` (and
`where`, `maximum`, `exp`) of float64 tensors in float32: its `result_type` maps 64-bit
dtypes to 32-bit (keras-team/keras#23704, open), while `einsum`, `add` and the
activations keep float64. A float64 layer then mixed the two: the float64 output
projection refused the explicit path's float32 output ("expected scalar type Double but
found Float", issue 38: `MultiHeadAttention(..., logit_soft_cap=3.0, dtype="float64")`),
which now casts its output back. The fused path, PyTorch's default, calls this instead:
float64 operands go to the backend's own kernel through the
`"float64_dot_product_attention"` hook (`keras_attn._device`), so that it computes in
float64; everything else to `keras.ops` unchanged. The explicit and blockwise paths run
in float64 on PyTorch at float32's precision until Keras is fixed. JAX (without x64)
and NumPy compute float64 as float32 by Keras's rule; TensorFlow keeps float64.
"""

import keras
from keras import ops

from keras_attn import _hooks

__all__ = ["dot_product_attention"]


def _float64(*tensors):
    return all(keras.backend.standardize_dtype(t.dtype) == "float64" for t in tensors)


def dot_product_attention(query, key, value, *, bias=None, mask=None, scale=None,
                          is_causal=False):
    """`ops.dot_product_attention` (`(B, T, H, d)` layout, `mask` or `bias`, not both), in
    float64 when query, key and value are float64 and the backend keeps it."""
    hook = (_hooks.get("float64_dot_product_attention")
            if _float64(query, key, value) else None)
    if hook is None:
        return ops.dot_product_attention(query, key, value, bias=bias, mask=mask, scale=scale,
                                         is_causal=is_causal)
    return hook(query, key, value, bias=bias, mask=mask, scale=scale, is_causal=is_causal)
