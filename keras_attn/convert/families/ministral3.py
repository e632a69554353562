"""`model_type="ministral3"` (Ministral 3, the text model of Mistral 3): Mistral's layout
(no biases, `sliding_window` the window of every block when set) with yarn RoPE by
default, and Llama 4's attention scaling: the queries at absolute position p, after RoPE,
times `1 + beta * log(1 + floor(p / n))` (transformers' `get_llama_4_attn_scale`), beta
`rope_parameters["llama_4_scaling_beta"]` and n `rope_parameters[
"original_max_position_embeddings"]`: keras_attn's `query_scale_beta` and
`query_scale_length`.

Both keys are read from `rope_parameters` (transformers keeps them there, outside
RoPE's validation); `original_max_position_embeddings` is also yarn's, which reads it
too. `rope_parameters["max_position_embeddings"]` (the config's, copied there by
`Ministral3Config`) is read by neither the RoPE nor the attention of transformers'
modeling (its `ignore_keys_at_rope_validation`), so it is dropped.
"""

import numbers
from collections.abc import Mapping

from keras_attn.convert._transformers_config import ModelSpec
from keras_attn.convert.families import _shared
from keras_attn.rope import ROPE_TYPES

MODEL_TYPE = "ministral3"
ARCHITECTURES = ("Ministral3ForCausalLM", "Ministral3Model")  # transformers' classes (`architectures`)
FIELDS = {
    "read": _shared.CORE_FIELDS + ("hidden_act", "rms_norm_eps", "sliding_window"),
    "neutral": {},
    "ignored": {},
}


def _default_rope(config):
    """`Ministral3Config`'s `rope_parameters` when none is given (its `__post_init__`)."""
    return {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 16.0,
            "original_max_position_embeddings": 16384,
            "max_position_embeddings": config.get("max_position_embeddings", 262144),
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0,
            "llama_4_scaling_beta": 0.1}


def query_scale(params):
    """`(query_scale options, the RoPE parameters without the scale's keys)` of one
    `rope_parameters` dict."""
    params = dict(params)
    where = "rope_parameters['llama_4_scaling_beta']"
    beta = params.pop("llama_4_scaling_beta", None)
    params.pop("max_position_embeddings", None)  # read by neither RoPE nor attention
    if isinstance(beta, bool) or not isinstance(beta, numbers.Real) or not beta >= 0:
        _shared.refuse(where, beta, "Ministral 3's attention multiplies the queries by "
                       "1 + beta * log(1 + floor(p / n)): a number >= 0 is needed")
    length_key = "original_max_position_embeddings"
    length = params.get(length_key)
    if isinstance(length, bool) or not isinstance(length, numbers.Integral) or length <= 0:
        _shared.refuse(f"rope_parameters[{length_key!r}]", length,
                       "the query scale's n: a positive integer is needed")
    rope_type = params.get("rope_type", params.get("type", "default"))
    kind = ROPE_TYPES.get(rope_type)
    if kind is not None and length_key not in kind.parameters:
        params.pop(length_key)  # the query scale's only (yarn and llama3 read it too)
    if beta == 0:  # the scale is 1 everywhere
        return {}, params
    return {"query_scale_beta": float(beta), "query_scale_length": int(length)}, params


# Ministral3Config's defaults where they differ from what `_shared.core` assumes of a
# field left out (a config.json written by transformers holds every field anyway).
_DEFAULTS = {"head_dim": 128, "num_key_value_heads": 8, "rms_norm_eps": 1e-5}


def spec(config):
    config = {**_DEFAULTS, **config}
    core = _shared.core(config)
    n = core["num_layers"]
    params = config.get("rope_parameters")
    if params is None:
        params = _default_rope(config)
    if not isinstance(params, Mapping):
        _shared.refuse("rope_parameters", params,
                       "Ministral 3 reads llama_4_scaling_beta from a rope_parameters dict")
    scale, params = query_scale(params)
    rope = _shared.rope_of({**config, "rope_parameters": params})
    window = _shared.window_of(config)
    return ModelSpec(
        **core, qkv_bias=False, output_bias=False, mlp_bias=False, qk_norm=False,
        final_logit_soft_cap=None,
        layers=_shared.layer_specs(n, rope, windows=[window] * n, **scale))
