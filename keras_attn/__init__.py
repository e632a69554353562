"""keras_attn: attention and Transformer layers written once against keras.ops.

They run unchanged on the TensorFlow, JAX and PyTorch backends of Keras 3
(and on the NumPy backend for inference), chosen by `KERAS_BACKEND`.

The top level holds what a model is built and run with, as keras-hub's does:
the layers, the functional core and its masks, `AttentionOptions`, `RopeSpec`, the cache
(`empty_cache`), `generate` and `observe_paths`. Tools live in submodules:
`config` (the settings a user sets), `convert` (weights in), `distribution`
(layout maps for `keras.distribution`), `cache`, `generation`, `options`,
`models`, `layers`, `rope`.

The face is lazy (PEP 562): `import keras_attn` imports neither Keras nor a
backend; a name is imported when it is first used (`keras_attn.MultiHeadAttention`),
which is what lets the `keras-attn` command (`keras_attn.cli`) start without one.
When Keras is already imported, `import keras_attn` imports the layers at once, so
that `import keras; import keras_attn; keras.saving.load_model(path)` finds them
registered for deserialisation (Keras imports a saved layer's module only for its
own packages); otherwise using any layer name, or `keras_attn.register()`, does.
"""

import importlib
import sys
from typing import TYPE_CHECKING

__version__ = "0.1.0"

if TYPE_CHECKING:  # what `__getattr__` resolves, for type checkers and the API docs
    from keras_attn import (
        cache,
        config,
        convert,
        distribution,
        generation,
        layers,
        models,
        options,
        rope,
    )
    from keras_attn._observe import observe_paths
    from keras_attn.attention import (
        causal_mask,
        combine_masks,
        padding_mask,
        scaled_dot_product_attention,
        sliding_window_mask,
    )
    from keras_attn.cache import KVCache, empty_cache
    from keras_attn.generation import generate
    from keras_attn.layers.feed_forward import PositionwiseFeedForward
    from keras_attn.layers.gated_deltanet import GatedDeltaNet
    from keras_attn.layers.latent_attention import MultiHeadLatentAttention
    from keras_attn.layers.mixture_of_experts import MixtureOfExperts
    from keras_attn.layers.multi_head_attention import MultiHeadAttention
    from keras_attn.layers.parallel_mixture_of_experts import ParallelMixtureOfExperts
    from keras_attn.layers.transformer_decoder import TransformerDecoderLayer
    from keras_attn.layers.transformer_encoder import TransformerEncoderLayer
    from keras_attn.linear_attention import chunk_gated_delta_rule, recurrent_gated_delta_rule
    from keras_attn.models.causal_lm import CausalLM
    from keras_attn.options import AttentionOptions
    from keras_attn.recurrent_cache import RecurrentCache
    from keras_attn.rope import RopeSpec
    from keras_attn.rotary import RotaryEmbedding, rotary_embedding

# name -> the module that defines it (None: the name is a submodule).
_NAMES = {
    "AttentionOptions": "keras_attn.options",
    "CausalLM": "keras_attn.models.causal_lm",
    "GatedDeltaNet": "keras_attn.layers.gated_deltanet",
    "RecurrentCache": "keras_attn.recurrent_cache",
    "chunk_gated_delta_rule": "keras_attn.linear_attention",
    "recurrent_gated_delta_rule": "keras_attn.linear_attention",
    "KVCache": "keras_attn.cache",
    "MixtureOfExperts": "keras_attn.layers.mixture_of_experts",
    "MultiHeadAttention": "keras_attn.layers.multi_head_attention",
    "MultiHeadLatentAttention": "keras_attn.layers.latent_attention",
    "ParallelMixtureOfExperts": "keras_attn.layers.parallel_mixture_of_experts",
    "PositionwiseFeedForward": "keras_attn.layers.feed_forward",
    "RopeSpec": "keras_attn.rope",
    "RotaryEmbedding": "keras_attn.rotary",
    "TransformerDecoderLayer": "keras_attn.layers.transformer_decoder",
    "TransformerEncoderLayer": "keras_attn.layers.transformer_encoder",
    "causal_mask": "keras_attn.attention",
    "combine_masks": "keras_attn.attention",
    "empty_cache": "keras_attn.cache",
    "generate": "keras_attn.generation",
    "observe_paths": "keras_attn._observe",
    "padding_mask": "keras_attn.attention",
    "rotary_embedding": "keras_attn.rotary",
    "scaled_dot_product_attention": "keras_attn.attention",
    "sliding_window_mask": "keras_attn.attention",
}
_SUBMODULES = ("cache", "config", "convert", "distribution", "generation", "layers", "models",
               "options", "rope")

__all__ = [  # a literal list, for tools that read it statically (the names below)
    "AttentionOptions",
    "CausalLM",
    "GatedDeltaNet",
    "KVCache",
    "MixtureOfExperts",
    "MultiHeadAttention",
    "MultiHeadLatentAttention",
    "ParallelMixtureOfExperts",
    "PositionwiseFeedForward",
    "RecurrentCache",
    "RopeSpec",
    "RotaryEmbedding",
    "TransformerDecoderLayer",
    "TransformerEncoderLayer",
    "cache",
    "causal_mask",
    "chunk_gated_delta_rule",
    "combine_masks",
    "config",
    "convert",
    "distribution",
    "empty_cache",
    "generate",
    "generation",
    "layers",
    "models",
    "observe_paths",
    "options",
    "padding_mask",
    "recurrent_gated_delta_rule",
    "register",
    "rope",
    "rotary_embedding",
    "scaled_dot_product_attention",
    "sliding_window_mask",
]
assert sorted(__all__) == sorted([*_NAMES, *_SUBMODULES, "register"])


def __getattr__(name):
    if name in _NAMES:
        value = getattr(importlib.import_module(_NAMES[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # looked up once
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))


def register():
    """Import every layer and model, registering them for Keras deserialisation.

    Needed only to load a `.keras` file before any keras_attn name was used in a
    process that imported keras_attn before Keras; returns None.
    """
    importlib.import_module("keras_attn.layers")
    importlib.import_module("keras_attn.models")
    importlib.import_module("keras_attn.rotary")


if sys.modules.get("keras") is not None:  # Keras (and its backend) is loaded already: nothing to save
    register()
