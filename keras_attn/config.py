"""Global settings of the attention implementations.

`implementation="auto"` (the default of `scaled_dot_product_attention` and
`MultiHeadAttention`) picks the blockwise, memory-efficient path when the
attention scores of one call would hold more than
`blockwise_threshold()` elements (`B * H * T * S`, counted over the
broadcast leading dims), and the fused `keras.ops.dot_product_attention`
path below it. The blockwise path works on query and key blocks of
`attention_block_size()` positions, so it never holds more than
`B * H * block_size**2` scores at once.

Example:

```python
import keras_attn

keras_attn.config.set_attention_block_size(256)
keras_attn.config.set_blockwise_threshold(2**24)  # go blockwise sooner
```

The settings are process-wide and read at call (trace) time: change them
before a model is compiled.
"""

from keras_attn._validation import check_positive_int

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_BLOCKWISE_THRESHOLD",
    "attention_block_size",
    "blockwise_threshold",
    "set_attention_block_size",
    "set_blockwise_threshold",
]

# 512 x 512 float32 scores = 1 MiB per (batch, head) pair: large enough for
# efficient matmuls on CPU, small enough to stay in cache-sized tiles.
DEFAULT_BLOCK_SIZE = 512
# 2**26 scores = 256 MiB in float32. The explicit and non-flash fused paths
# hold a few tensors of that size (logits, weights, and their gradients).
DEFAULT_BLOCKWISE_THRESHOLD = 2**26

_settings = {
    "block_size": DEFAULT_BLOCK_SIZE,
    "threshold": DEFAULT_BLOCKWISE_THRESHOLD,
}


def attention_block_size():
    """The query/key block length of the blockwise attention path."""
    return _settings["block_size"]


def set_attention_block_size(block_size):
    """Set the query/key block length of the blockwise attention path.

    Args:
        block_size: positive int. Memory of one step is
            `B * H * block_size**2` scores; larger blocks mean fewer,
            larger matmuls.
    """
    _settings["block_size"] = check_positive_int("block_size", block_size)


def blockwise_threshold():
    """Score count `B * H * T * S` above which `"auto"` goes blockwise."""
    return _settings["threshold"]


def set_blockwise_threshold(num_scores):
    """Set the score count above which `implementation="auto"` goes blockwise.

    Args:
        num_scores: positive int, compared with `B * H * T * S` (the number
            of elements of the attention scores of one call).
    """
    _settings["threshold"] = check_positive_int("num_scores", num_scores)
