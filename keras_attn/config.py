"""Global settings of the attention implementations: overrides of the `auto` policy.

`implementation="auto"` (the default of `scaled_dot_product_attention` and
`MultiHeadAttention`) follows a measured, backend-aware policy written out in
`keras_attn._policy` (the table `POLICY`, read by `select_implementation`)
and in the docs' performance guide (docs/guides/performance.md): blockwise
when the scores of one call would exceed 2**26
elements, and below that the faster path on the backend and device (on a
CPU, blockwise from 32 x 32 scores per head under JAX and 512 x 512 causal /
1024 x 1024 full under TensorFlow, with 16 queries at least; elsewhere the
fused kernel). The blockwise path
then picks its block length from the shape.

Both settings below override the policy, process-wide, until set back to
None:

```python
import keras_attn

keras_attn.config.set_attention_block_size(256)   # every blockwise call uses 256
keras_attn.config.set_blockwise_threshold(2**24)  # one rule everywhere: blockwise above
keras_attn.config.set_blockwise_threshold(None)   # back to the measured policy
```

They are read at call (trace) time: change them before a model is compiled.
"""

from keras_attn import _policy

__all__ = [
    "attention_block_size",
    "blockwise_threshold",
    "set_attention_block_size",
    "set_blockwise_threshold",
]


def attention_block_size():
    """The query/key block length set with `set_attention_block_size`.

    Without a setting the blockwise path chooses the block from the shape
    (see `set_attention_block_size`); this then returns 512, the largest
    block it uses.
    """
    return _policy.block_size_override() or _policy.DEFAULT_BLOCK_SIZE


def set_attention_block_size(block_size):
    """Set the query/key block length of the blockwise attention path.

    Args:
        block_size: positive int, or None to let the blockwise path choose
            it from the shape again (the default). Memory of one step is
            `B * H * block_size**2` scores; larger blocks mean fewer,
            larger matmuls. A block is never longer than its sequence.
    """
    _policy.set_setting("block_size", block_size, "block_size")


def blockwise_threshold():
    """Score count `B * H * T * S` above which `"auto"` always goes blockwise.

    Without a setting this is 2**26 (256 MiB of float32 scores), the memory
    bound of the policy (below it, the policy decides by speed).
    """
    return _policy.threshold_override() or _policy.DEFAULT_BLOCKWISE_THRESHOLD


def set_blockwise_threshold(num_scores):
    """Set the score count above which `implementation="auto"` goes blockwise.

    A set threshold replaces the backend-aware policy of `auto` by one
    rule on every backend and device: blockwise above `num_scores`, fused
    (or explicit, for a soft-cap) at or below it.

    Args:
        num_scores: positive int, compared with `B * H * T * S` (the number
            of elements of the attention scores of one call), or None to
            restore the measured policy (the default).
    """
    _policy.set_setting("threshold", num_scores, "num_scores")


# The names of release 0.1.0 beyond the two settings, still importable (not in `__all__`):
# the defaults and the raw overrides now live with the policy that reads them.
DEFAULT_BLOCK_SIZE = _policy.DEFAULT_BLOCK_SIZE
DEFAULT_BLOCKWISE_THRESHOLD = _policy.DEFAULT_BLOCKWISE_THRESHOLD
block_size_override = _policy.block_size_override
threshold_override = _policy.threshold_override
