"""The keras_attn layers, one module each."""

from keras_attn.layers.causal_lm import CausalLM
from keras_attn.layers.feed_forward import PositionwiseFeedForward
from keras_attn.layers.multi_head_attention import MultiHeadAttention
from keras_attn.layers.transformer_decoder import TransformerDecoderLayer
from keras_attn.layers.transformer_encoder import TransformerEncoderLayer

__all__ = [
    "CausalLM",
    "MultiHeadAttention",
    "PositionwiseFeedForward",
    "TransformerDecoderLayer",
    "TransformerEncoderLayer",
]
