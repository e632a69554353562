"""The keras_attn layers, one module each."""

from keras_attn.layers.feed_forward import PositionwiseFeedForward
from keras_attn.layers.gated_deltanet import GatedDeltaNet
from keras_attn.layers.latent_attention import MultiHeadLatentAttention
from keras_attn.layers.mixture_of_experts import MixtureOfExperts
from keras_attn.layers.multi_head_attention import MultiHeadAttention
from keras_attn.layers.parallel_mixture_of_experts import ParallelMixtureOfExperts
from keras_attn.layers.transformer_decoder import TransformerDecoderLayer
from keras_attn.layers.transformer_encoder import TransformerEncoderLayer

__all__ = [
    "CausalLM",
    "GatedDeltaNet",
    "MixtureOfExperts",
    "MultiHeadAttention",
    "MultiHeadLatentAttention",
    "ParallelMixtureOfExperts",
    "PositionwiseFeedForward",
    "TransformerDecoderLayer",
    "TransformerEncoderLayer",
]


def __getattr__(name):
    # `CausalLM` moved up to the models tier (keras_attn.models); the old name stays, looked
    # up only when asked for, so that importing the layers never imports a model.
    if name == "CausalLM":
        from keras_attn.models.causal_lm import CausalLM

        return CausalLM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
