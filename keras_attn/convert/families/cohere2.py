"""`model_type="cohere2"` (Cohere 2, Command R7B / Command A): the parallel block
`x + attn(N(x)) + mlp(N(x))` with one norm (`input_layernorm`), Cohere's LayerNorm (mean
and variance, a weight and no bias), interleaved RoPE (`repeat_interleave` of the
frequencies: the GPT-J pairing) on the "sliding_attention" blocks only (the
"full_attention" ones have no RoPE), without `layer_types` every
`sliding_window_pattern`-th block full (4 by default, as transformers derives it), tied
embeddings by default and the logits times `logit_scale`.

Cohere's LayerNorm has no bias: a zero bias is given to keras_attn's LayerNormalization
(exact), so the converted model's norms have a trainable bias that starts at zero. Writing
a checkpoint (`checkpoint_state_dict`) drops those biases again, and refuses a model whose
biases are no longer zero (trained): Cohere's checkpoint has no place for them.
"""

import numpy as np

from keras_attn.convert._transformers_config import ModelSpec, _number
from keras_attn.convert.families import _shared

MODEL_TYPE = "cohere2"
ARCHITECTURES = ("Cohere2ForCausalLM", "Cohere2Model")  # transformers' classes (`architectures`)
FIELDS = {
    "read": _shared.CORE_FIELDS + ("hidden_act", "layer_norm_eps", "attention_bias",
                                   "logit_scale", "sliding_window", "layer_types",
                                   "sliding_window_pattern"),
    "neutral": {},
    "ignored": {"_sliding_window_pattern": ("a private attribute transformers writes and "
                                            "does not read back: without `layer_types` it derives them "
                                            "from `sliding_window_pattern` (4 by default), as here")},
}


def spec(config):
    core = _shared.core(config, epsilon_field="layer_norm_eps", default_epsilon=1e-5,
                        tie_default=True)
    if core["head_dim"] * core["num_heads"] != core["hidden_dim"]:
        # transformers' Cohere2Config sets head_dim = hidden_size // num_attention_heads.
        _shared.refuse("head_dim", core["head_dim"], "Cohere 2's is hidden_size // "
                       f"num_attention_heads = {core['hidden_dim'] // core['num_heads']}")
    n = core["num_layers"]
    window = _shared.window_of(config)
    types = config.get("layer_types")
    if types is None:
        pattern = config.get("sliding_window_pattern", 4)
        types = _shared.every_nth_full(n, pattern)
    types = _shared.checked_layer_types(types, n, window)
    scale = _number(config, "logit_scale", 0.0625)
    bias = bool(config.get("attention_bias", False))
    rope = {**_shared.rope_of(config), "rope_interleaved": True}
    return ModelSpec(
        **core, qkv_bias=bias, output_bias=bias, mlp_bias=False, qk_norm=False,
        final_logit_soft_cap=None, normalization="layer", parallel_residual=True,
        # logits * logit_scale as logits / (1 / logit_scale): exact for powers of two
        logits_scaling=1.0 / scale,
        layers=_shared.layer_specs(n, rope, windows=_shared.sliding_windows(types, window),
                                   uses_rope=[t == "sliding_attention" for t in types]))


def canonical_state_dict(entries, spec):
    """A zero bias beside every LayerNorm weight (Cohere's LayerNorm has none), refused
    where the state dict has one already."""
    for key in [k for k in entries if isinstance(k, str)]:
        if key.endswith(("input_layernorm.weight", "model.norm.weight")):
            bias = key[:-len("weight")] + "bias"
            if bias in entries:
                raise ValueError(f"The config and the weights disagree: Cohere's LayerNorm has "
                                 f"no bias, but state_dict has {bias!r}.")
            entries[bias] = np.zeros((spec.hidden_dim,), "float32")
    return entries


def checkpoint_state_dict(tensors, spec):
    """The inverse of `canonical_state_dict` (for writing a checkpoint): the LayerNorms'
    biases dropped, each checked to be zero (a trained nonzero bias is refused, by name:
    Cohere's LayerNorm has none, and dropping it would change the model)."""
    out = {}
    for key, value in tensors.items():
        if key.endswith(("input_layernorm.bias", "model.norm.bias")):
            if np.any(value != 0):
                raise ValueError(
                    f"Cohere's LayerNorm has no bias, but the model's {key!r} is not zero "
                    f"(trained?): a Cohere 2 checkpoint cannot hold it. Received: "
                    f"max |bias|={float(np.max(np.abs(value)))}")
            continue
        out[key] = value
    return out
