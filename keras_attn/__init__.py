"""keras_attn: attention and Transformer layers written once against keras.ops.

They run unchanged on the TensorFlow, JAX and PyTorch backends of Keras 3
(and on the NumPy backend for inference), chosen by `KERAS_BACKEND`.
"""

from keras_attn import config, convert, generation
from keras_attn.attention import (
    causal_mask,
    combine_masks,
    padding_mask,
    scaled_dot_product_attention,
    sliding_window_mask,
)
from keras_attn.cache import empty_cache
from keras_attn.layers import (
    MultiHeadAttention,
    PositionwiseFeedForward,
    TransformerDecoderLayer,
    TransformerEncoderLayer,
)
from keras_attn.rotary import RotaryEmbedding, rotary_embedding

__version__ = "0.1.0"

__all__ = [
    "MultiHeadAttention",
    "PositionwiseFeedForward",
    "RotaryEmbedding",
    "TransformerDecoderLayer",
    "TransformerEncoderLayer",
    "causal_mask",
    "combine_masks",
    "config",
    "convert",
    "empty_cache",
    "generation",
    "padding_mask",
    "rotary_embedding",
    "scaled_dot_product_attention",
    "sliding_window_mask",
]
