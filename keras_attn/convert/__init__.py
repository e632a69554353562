"""Weights from Keras, `torch.nn` and Hugging Face Llama layers into keras_attn layers.

Numpy in, built layers out: every function takes arrays (anything
`numpy.asarray` accepts; torch tensors too, read through
`.detach().cpu().numpy()` without importing torch) and returns a new, built
keras_attn layer whose weights are set. Everything is checked (missing
entries, shapes, unsupported options) before any weight is assigned, and a
problem raises a `ValueError` naming the entry and what was received.

Shapes: B batch, T query (target) length, S key (source, memory) length,
D model width (torch's `embed_dim` / `d_model`), D_k, D_v the key and value
widths (torch's `kdim`, `vdim`), D_m memory width, H heads, d head width
(d = D // H for torch), F feed-forward width (`dim_feedforward`), H_kv
key/value heads (grouped-query attention; Llama's `num_key_value_heads`).

Layouts: `torch.nn.Linear` stores `weight` as `(out, in)`; a Keras `Dense`
kernel is `(in, out)`, so `kernel = weight.T`. Head `h` owns columns
`[h * d, (h + 1) * d)` of a keras_attn projection kernel and rows
`[h * d, (h + 1) * d)` of the torch weight, so no head reordering is needed.

One module per source: `keras_attn.convert.keras` (`keras.layers.MultiHeadAttention`),
`keras_attn.convert.torch` (`torch.nn` state dicts),
`keras_attn.convert.keras_hub` (keras-hub's Llama 3, Mistral, Qwen 2 and Gemma 3 models,
through the transformers families) and
`keras_attn.convert.huggingface` (Llama state dicts), and
`keras_attn.convert.transformers` (whole transformers LMs and their layers,
read from the config, one module per family in `keras_attn.convert.families`:
llama, mistral, qwen2, qwen3, gemma2, gemma3_text, starcoder2, gemma, phi3, granite,
ministral, smollm3); the checks and the weight assignment they share are in
`keras_attn.convert._common`. Import the converters from `keras_attn.convert` itself.
"""

from keras_attn.convert.huggingface import (
    multi_head_attention_from_llama,
    transformer_decoder_layer_from_llama,
)
from keras_attn.convert.keras import multi_head_attention_from_keras
from keras_attn.convert.keras_hub import causal_lm_from_keras_hub
from keras_attn.convert.latent_attention import multi_head_latent_attention_from_transformers
from keras_attn.convert.pretrained import causal_lm_from_pretrained, causal_lm_to_pretrained
from keras_attn.convert.torch import (
    multi_head_attention_from_torch,
    transformer_decoder_layer_from_torch,
    transformer_encoder_layer_from_torch,
)
from keras_attn.convert.transformers import (
    causal_lm_from_transformers,
    family_table,
    multi_head_attention_from_transformers,
    transformer_decoder_layer_from_transformers,
)

__all__ = [
    "causal_lm_from_keras_hub",
    "causal_lm_from_pretrained",
    "causal_lm_from_transformers",
    "causal_lm_to_pretrained",
    "family_table",
    "multi_head_attention_from_keras",
    "multi_head_attention_from_llama",
    "multi_head_attention_from_torch",
    "multi_head_attention_from_transformers",
    "multi_head_latent_attention_from_transformers",
    "transformer_decoder_layer_from_llama",
    "transformer_decoder_layer_from_torch",
    "transformer_decoder_layer_from_transformers",
    "transformer_encoder_layer_from_torch",
]
