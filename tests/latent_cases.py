"""Tiny DeepSeek V3 attention configs and random modules for the latent-attention converter
tests (tests/convert/test_latent_attention.py, live; the stored fixture of
tools/make_latent_attention_fixture.py, tests/convert/test_latent_attention_fixture.py).

Needs torch and transformers only in the functions that build modules; the ablations and
the tolerance are plain.
"""

import numpy as np

from .family_cases import skip_without  # noqa: F401 (the tests' guard, re-exported)

TOLERANCE = 1e-4  # max |keras - hf| / max |hf|, float32
B, T, D = 2, 9, 32
YARN = {"rope_type": "yarn", "rope_theta": 100.0, "factor": 8.0,
        "original_max_position_embeddings": 4, "mscale": 0.707, "mscale_all_dim": 1.0,
        "beta_fast": 32.0, "beta_slow": 1.0}
# name -> DeepseekV3Config overrides of `config_dict`'s.
CASES = {
    "q_lora_yarn_interleaved": dict(q_lora_rank=12, rope_parameters=YARN),
    "plain_q_default_rope_bias": dict(q_lora_rank=None, attention_bias=True),
    "q_lora_half_split_rope": dict(q_lora_rank=12, rope_interleave=False,
                                   rope_parameters={"rope_type": "default", "rope_theta": 50.0}),
}
FIXTURE = "q_lora_yarn_interleaved"
ABLATIONS = ("rope_interleaved", "mscale_ignored", "no_kv_a_layernorm", "no_q_a_layernorm")


def config_dict(name):
    """The config of case `name` as a DeepseekV3Config's keyword arguments."""
    return dict(
        num_hidden_layers=2, hidden_size=D, num_attention_heads=4, num_key_value_heads=4,
        kv_lora_rank=8, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5,
        vocab_size=50, intermediate_size=20, moe_intermediate_size=10, n_routed_experts=4,
        num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1,
        max_position_embeddings=32,  # yarn: factor 8 x original 4
        **{"rope_parameters": {"rope_type": "default", "rope_theta": 100.0}, **CASES[name]})


def build_hf(name, seed=0):
    """`(config, DeepseekV3Attention)` with random weights far from identity (std 0.35;
    the RMSNorm weights 1 + N(0, 0.35)), float32, eager attention."""
    import torch

    DeepseekV3Config = skip_without("DeepseekV3Config")  # noqa: N806 (the class)
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (  # noqa: E402
        DeepseekV3Attention,
    )

    torch.manual_seed(seed)
    config = DeepseekV3Config(**config_dict(name))
    config._attn_implementation = "eager"
    attention = DeepseekV3Attention(config, layer_idx=0).eval()
    with torch.no_grad():
        for key, p in attention.named_parameters():
            p.copy_(torch.randn_like(p) * 0.35 + (1.0 if "layernorm" in key else 0.0))
    return config, attention


def hf_output(config, attention, x):
    """transformers' causal attention output `(B, T, D)` of `x` at positions 0 .. T - 1."""
    import torch
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding

    x = torch.as_tensor(x)
    length = x.shape[1]
    positions = torch.arange(length)[None].expand(x.shape[0], length)
    cos_sin = DeepseekV3RotaryEmbedding(config)(x, positions)
    mask = torch.full((length, length), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        return attention(x, cos_sin, mask)[0].numpy()


def inputs(seed=1):
    return np.random.default_rng(seed).standard_normal((B, T, D)).astype("float32")


def ablate(layer, ablation):
    """A copy of the converted layer with one thing wrong (its weights the same)."""
    config = layer.get_config()
    if ablation == "rope_interleaved":
        config["rope_interleaved"] = not config["rope_interleaved"]
    elif ablation == "mscale_ignored":
        config["scale"] = None  # qk_head_dim ** -0.5 without yarn's mscale ** 2
    copy = type(layer).from_config(config)
    copy.build((None, None, D))
    copy.set_weights(layer.get_weights())
    if ablation in ("no_kv_a_layernorm", "no_q_a_layernorm"):
        name = "key_value_a_norm" if ablation == "no_kv_a_layernorm" else "query_a_norm"
        getattr(copy, name).call = lambda x: x  # the norm skipped (a built layer takes no new sublayer)
    return copy


def relative_error(actual, expected):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float(np.abs(actual - expected).max() / np.abs(expected).max())
