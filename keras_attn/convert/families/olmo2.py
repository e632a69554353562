"""`model_type="olmo2"` (OLMo 2): Llama's projections and MLP in a block with no norm
before its sublayers, `x + post_attention_layernorm(attn(x))` then
`x + post_feedforward_layernorm(mlp(x))` (the block's `use_input_norm=False`), and a
qk-norm over all the heads' features at once (`q_norm` `(H * d,)`, `k_norm`
`(H_kv * d,)`: `qk_norm_full_width`) before RoPE; `attention_bias` on the four attention
projections."""

from keras_attn.convert._transformers_config import ModelSpec
from keras_attn.convert.families import _shared

MODEL_TYPE = "olmo2"
ARCHITECTURES = ("Olmo2ForCausalLM", "Olmo2Model")  # transformers' classes (`architectures`)
FIELDS = {
    "read": _shared.CORE_FIELDS + ("hidden_act", "rms_norm_eps", "attention_bias"),
    "neutral": {},
    "ignored": {},
}


def spec(config):
    core = _shared.core(config, default_epsilon=1e-5)
    n = core["num_layers"]
    bias = bool(config.get("attention_bias", False))
    return ModelSpec(
        **core, qkv_bias=bias, output_bias=bias, mlp_bias=False, qk_norm=True,
        final_logit_soft_cap=None, input_norms=False,
        layers=_shared.layer_specs(n, _shared.rope_of(config), qk_norm="rms",
                                   qk_norm_epsilon=core["epsilon"], qk_norm_full_width=True))
