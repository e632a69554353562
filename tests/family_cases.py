"""The transformers model families compared with `keras_attn.convert.causal_lm_from_transformers`.

Shared by tests/test_families.py (torch env, live against transformers),
tools/make_family_fixtures.py (writes tests/assets/families/) and
tools/family_report.py. Needs torch and transformers only in `build_hf` and
`hf_reference`; `CASES`, `relative_error` and the ablations' configs are plain data.

Tiny random configs: V=128, D=64, H=4, H_kv=2, T=24 tokens (windows smaller
than T so they matter), every parameter re-drawn with std 0.35 so that norm
weights and biases are far from 1 and 0. float32, eager attention.
"""

import numpy as np

V, D, H, H_KV, F = 128, 64, 4, 2, 96
B, T, NEW = 2, 24, 16  # the logits over T tokens; 16 greedy tokens after a prompt of P
P = 8
STD = 0.35
TOLERANCE = 1e-4  # max |keras - hf| / max |hf|

_COMMON = dict(vocab_size=V, hidden_size=D, intermediate_size=F, num_attention_heads=H,
               num_key_value_heads=H_KV, max_position_embeddings=64, rms_norm_eps=1e-6,
               bos_token_id=None, eos_token_id=None, pad_token_id=None)

# name: (transformers config class, config kwargs, seed, ablation)
# An ablation: (what, config changes) -> the logits of the converted model under the changed
# config must move far beyond the tolerance; or a name of a weight-level ablation.
CASES = {
    "llama": ("LlamaConfig", dict(num_hidden_layers=2, tie_word_embeddings=False,
                                  rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
              0, ("rope_theta 1e4 -> 1e2", {"rope_parameters": {"rope_type": "default",
                                                                "rope_theta": 100.0}})),
    "llama3": ("LlamaConfig", dict(num_hidden_layers=2, tie_word_embeddings=False,
                                   rope_parameters={"rope_type": "llama3", "rope_theta": 1e4,
                                                    "factor": 8.0, "low_freq_factor": 1.0,
                                                    "high_freq_factor": 4.0,
                                                    "original_max_position_embeddings": 16}),
               1, ("rope_type llama3 -> default", {"rope_parameters": {
                   "rope_type": "default", "rope_theta": 1e4}})),
    "yarn": ("LlamaConfig", dict(num_hidden_layers=2, tie_word_embeddings=True,
                                 rope_parameters={"rope_type": "yarn", "rope_theta": 1e4,
                                                  "factor": 4.0,
                                                  "original_max_position_embeddings": 16}),
             2, ("rope_type yarn -> linear", {"rope_parameters": {
                 "rope_type": "linear", "rope_theta": 1e4, "factor": 4.0}})),
    "mistral": ("MistralConfig", dict(num_hidden_layers=2, sliding_window=6,
                                      tie_word_embeddings=False),
                3, ("sliding_window 6 -> None", {"sliding_window": None})),
    "qwen2": ("Qwen2Config", dict(num_hidden_layers=2, use_sliding_window=True,
                                  sliding_window=6, max_window_layers=1,
                                  tie_word_embeddings=True),
              4, ("use_sliding_window True -> False", {"use_sliding_window": False,
                                                       "layer_types": None})),
    "qwen3": ("Qwen3Config", dict(num_hidden_layers=2, head_dim=24, tie_word_embeddings=False),
              5, ("q_norm/k_norm weights -> 1", "qk_norm_ones")),
    "gemma2": ("Gemma2Config", dict(num_hidden_layers=4, head_dim=16, sliding_window=6,
                                    query_pre_attn_scalar=24, attn_logit_softcapping=3.0,
                                    final_logit_softcapping=5.0),
               6, ("RMSNorm weights w, not 1 + w", "norm_offset")),
    "gemma3_text": ("Gemma3TextConfig", dict(
        num_hidden_layers=4, head_dim=16, sliding_window=6, query_pre_attn_scalar=16,
        layer_types=["sliding_attention", "full_attention", "sliding_attention",
                     "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                         "full_attention": {"rope_type": "linear", "factor": 4.0,
                                            "rope_theta": 1e5}}),
        7, ("sliding layers' RoPE base 1e4 -> the full layers' 1e5", {"rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e5},
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e5}}})),
}


def token_ids(seed):
    return np.random.default_rng(seed).integers(0, V, size=(B, T)).astype("int32")


def relative_error(actual, expected):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float(np.abs(actual - expected).max() / np.abs(expected).max())


def build_hf(name):
    """The transformers `*ForCausalLM` of case `name`, with its random weights (torch only)."""
    import torch
    import transformers

    config_class, kwargs, seed, _ = CASES[name]
    config = getattr(transformers, config_class)(**_COMMON, **kwargs)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, parameter in model.named_parameters():
            value = STD * torch.randn(parameter.shape, generator=generator)
            if parameter.ndim == 1 and "norm" in _ and not name.startswith("gemma"):
                value = value + 1.0  # Llama-style norms multiply by w: around 1, not 0
            parameter.copy_(value)
    return model.float().eval()


def hf_reference(model, ids):
    """transformers' logits over `ids` `(B, T)`, 16 greedy tokens after the first P, and the
    smallest greedy margin (top-1 minus top-2 logit) over those steps."""
    import torch

    with torch.no_grad():
        logits = model(torch.from_numpy(ids).long()).logits.numpy()
        prompt = torch.from_numpy(ids[:, :P]).long()
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                             max_new_tokens=NEW, min_new_tokens=NEW, return_dict_in_generate=True,
                             output_logits=True, pad_token_id=0)
    steps = np.stack([s.float().numpy() for s in out.logits])  # (NEW, B, V)
    top = np.sort(steps, axis=-1)
    margin = float((top[..., -1] - top[..., -2]).min())
    return logits, out.sequences.numpy().astype("int32"), margin
