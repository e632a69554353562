"""`model_type="llama"` (Llama 2, 3, 3.x): pre-norm RMSNorm, SwiGLU (`hidden_act`),
grouped-query attention, full attention in every block (no window), RoPE of the
types `default`, `linear`, `llama3` and `yarn`; `attention_bias` puts biases on the
four attention projections, `mlp_bias` on the three MLP ones."""

from keras_attn.convert._transformers_config import ModelSpec
from keras_attn.convert.families import _shared

MODEL_TYPE = "llama"
ARCHITECTURES = ("LlamaForCausalLM", "LlamaModel")  # transformers' classes (`architectures`)
FIELDS = {
    "read": _shared.CORE_FIELDS + ("hidden_act", "rms_norm_eps", "attention_bias", "mlp_bias"),
    "neutral": {},
    "ignored": {"pretraining_tp": "transformers 5 ignores it (an exact split of the "
                                  "matmuls in older versions)"},
}


def spec(config):
    core = _shared.core(config)
    bias = bool(config.get("attention_bias", False))
    return ModelSpec(
        **core, qkv_bias=bias, output_bias=bias, mlp_bias=bool(config.get("mlp_bias", False)),
        qk_norm=False, final_logit_soft_cap=None,
        layers=_shared.layer_specs(core["num_layers"], _shared.rope_of(config),
                                   logit_soft_cap=None, scale=None))
