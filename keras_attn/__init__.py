"""keras_attn: attention and Transformer layers written once against keras.ops.

They run unchanged on the TensorFlow, JAX and PyTorch backends of Keras 3
(and on the NumPy backend for inference), chosen by `KERAS_BACKEND`.

The top level holds what a model is built and run with, as keras-hub's does:
the layers, the functional core and its masks, `AttentionOptions`, the cache
(`empty_cache`) and `generate`. Tools live in submodules: `config` (the
settings a user sets), `convert` (weights in), `distribution` (layout maps for
`keras.distribution`), `cache`, `generation`, `options`.
"""

from keras_attn import cache, config, convert, distribution, generation, options
from keras_attn.attention import (
    causal_mask,
    combine_masks,
    padding_mask,
    scaled_dot_product_attention,
    sliding_window_mask,
)
from keras_attn.cache import KVCache, empty_cache
from keras_attn.generation import generate
from keras_attn.layers import (
    CausalLM,
    MultiHeadAttention,
    PositionwiseFeedForward,
    TransformerDecoderLayer,
    TransformerEncoderLayer,
)
from keras_attn.options import AttentionOptions
from keras_attn.rotary import RotaryEmbedding, rotary_embedding

# `implementation="auto"` picks its row by how TensorFlow runs the call (eager, a
# plain tf.function, XLA); the probe lives at the backend boundary, and the policy
# takes it from here so that neither it nor the layers import backend code.
from keras_attn import _device, _policy  # noqa: E402  (isort: skip)

_policy.set_execution_probe(_device.execution_mode)
# `CausalLM.generate` on PyTorch replays its decoding step from a traced graph; the
# tracer is backend code too.
from keras_attn.layers import causal_lm as _causal_lm  # noqa: E402  (isort: skip)

_causal_lm.set_step_tracer(_device.trace_step)
# Eager attention calls on JAX (and the blockwise kernel's loops), compiled once per
# shape and settings instead of op by op.
from keras_attn._kernels import compiled as _compiled  # noqa: E402  (isort: skip)

_compiled.set_eager_compiler(_device.eager_compiler)

__version__ = "0.1.0"

__all__ = [
    "AttentionOptions",
    "CausalLM",
    "KVCache",
    "MultiHeadAttention",
    "PositionwiseFeedForward",
    "RotaryEmbedding",
    "TransformerDecoderLayer",
    "TransformerEncoderLayer",
    "cache",
    "causal_mask",
    "combine_masks",
    "config",
    "convert",
    "distribution",
    "empty_cache",
    "generate",
    "generation",
    "options",
    "padding_mask",
    "rotary_embedding",
    "scaled_dot_product_attention",
    "sliding_window_mask",
]
