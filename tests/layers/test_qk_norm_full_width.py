"""`qk_norm_full_width=True`: OLMo 2's and OLMo 3's q/k norm over the whole projection.

`q_norm = RMSNorm(H * d)` and `k_norm = RMSNorm(H_kv * d)` on the projected queries
and keys, before they are split into heads and before RoPE (transformers'
`Olmo2Attention`, `Olmo3Attention`). Against the float64 reference (RMS and layer
norm, grouped heads), over a cache (the keys are normalised before they are cached),
in the config, and against transformers' `Olmo2Attention` and `Olmo3Attention` (a
sliding layer) with the weights copied by hand. The ablation: the same weights with
the norms' statistics over each head's d instead of the whole width.
"""

import numpy as np
import pytest

import keras_attn
from keras_attn.options import AttentionOptions
from keras_attn.testing.weights import randomize_weights, reference_params

from .. import reference
from ..helpers import UNCACHED, assert_close, randn, rng, to_numpy

B, T, D, H, H_KV, D_HEAD = 2, 7, 16, 4, 2, 4


def _mha(seed=0, **options):
    layer = keras_attn.MultiHeadAttention(H, D_HEAD, **options)
    layer.build((B, T, D))
    randomize_weights(layer, seed=seed)
    return layer


def _per_head(x, scale, epsilon, heads):
    """The ablation in NumPy: RMS statistics over each head's d, the full-width scale."""
    B_, L, width = x.shape
    h = x.reshape(B_, L, heads, width // heads)
    h = h / np.sqrt((h ** 2).mean(-1, keepdims=True) + epsilon)
    return h.reshape(B_, L, width) * scale


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_matches_reference_with_grouped_heads_and_a_cache(kind):
    options = dict(num_key_value_heads=H_KV, rope_max_wavelength=100.0, qk_norm=kind,
                   qk_norm_full_width=True)
    layer = _mha(seed=1, **options)
    norms = {w.path.split("/")[-2] + "/" + w.path.split("/")[-1]: tuple(w.shape)
             for w in layer.weights if "norm" in w.path}
    assert norms[f"query_norm/{'scale' if kind == 'rms' else 'gamma'}"] == (H * D_HEAD,)
    assert norms[f"key_norm/{'scale' if kind == 'rms' else 'gamma'}"] == (H_KV * D_HEAD,)
    x = randn(rng(2), B, T, D)
    params = reference_params(layer)
    expected, _ = reference.multi_head_attention(params, x, x, num_heads=H, is_causal=True,
                                                 **options)
    full = to_numpy(layer(x, use_causal_mask=True))
    assert_close(full, expected)
    # Keys normalised over H_kv * d before they are written: a prefill and one-token steps.
    cache = layer.empty_cache(B, T)
    outs, start = [], 0
    for length in (3, 1, 1, 2):
        out, cache = layer(x[:, start:start + length], cache=cache, cache_update_index=start,
                           use_causal_mask=True)
        outs.append(to_numpy(out))
        start += length
    assert_close(np.concatenate(outs, axis=1), full, against=UNCACHED)
    # The ablation: unit scales (zero shifts), where the two norms differ only in their
    # statistics: over H * d here, over each head's d in the per-head reference.
    for norm in (layer.query_norm, layer.key_norm):
        for weight in norm.weights:
            weight.assign(np.full(tuple(weight.shape), float(weight.path.endswith(
                ("scale", "gamma"))), "float32"))
    unit = to_numpy(layer(x, use_causal_mask=True))
    params = reference_params(layer)
    for name in ("query_norm", "key_norm"):
        params[name] = {k: v[:D_HEAD] for k, v in params[name].items()}  # (d,) per head
    per_head, _ = reference.multi_head_attention(
        params, x, x, num_heads=H, is_causal=True, **dict(options, qk_norm_full_width=False))
    gap = float(np.abs(unit - per_head).max())
    assert gap > 0.05, f"per-head statistics moved the output by {gap} only"


def test_config_round_trip_and_errors():
    layer = keras_attn.MultiHeadAttention(H, D_HEAD, qk_norm="rms", qk_norm_full_width=True)
    assert layer.get_config()["qk_norm_full_width"] is True
    assert keras_attn.MultiHeadAttention.from_config(layer.get_config()).qk_norm_full_width
    with pytest.raises(ValueError, match=r"Received: qk_norm_full_width=True, qk_norm=None"):
        AttentionOptions(qk_norm_full_width=True)
    block = keras_attn.TransformerDecoderLayer(2, intermediate_dim=8, qk_norm="rms",
                                               qk_norm_full_width=True)
    block.build((1, 3, 8))
    assert tuple(block.self_attention.query_norm.scale.shape) == (8,)  # H * d = 2 * 4


def _olmo(torch, family, **config):
    transformers = pytest.importorskip("transformers")
    rope = {"rope_type": "default", "rope_theta": 100.0}
    if family == "olmo3":  # one RoPE per layer type
        rope = {kind: dict(rope) for kind in ("full_attention", "sliding_attention")}
    modeling = __import__(f"transformers.models.{family}.modeling_{family}", fromlist=["x"])
    config_class = getattr(transformers, f"{family.capitalize()}Config")
    config = config_class(hidden_size=D, num_attention_heads=H, num_key_value_heads=H_KV,
                          num_hidden_layers=1, rms_norm_eps=1e-6, attention_bias=True,
                          rope_parameters=rope, **config)
    config._attn_implementation = "eager"
    attention = getattr(modeling, f"{family.capitalize()}Attention")(config, layer_idx=0).eval()
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, parameter in attention.named_parameters():
            noise = 0.35 * torch.randn(parameter.shape, generator=generator)
            parameter.copy_(1.0 + noise if name.endswith("norm.weight") else noise)
    return modeling, config, attention


def _run_olmo(torch, modeling, family, config, attention, x, window=None):
    from transformers import masking_utils

    positions = torch.arange(x.shape[1])
    rule = (masking_utils.causal_mask_function if window is None
            else masking_utils.sliding_window_causal_mask_function(window))
    allowed = rule(0, 0, positions[:, None], positions[None, :])
    mask = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))[None, None]
    rotary = getattr(modeling, f"{family.capitalize()}RotaryEmbedding")(config)
    extra = () if family == "olmo2" else (config.layer_types[0],)
    cos_sin = rotary(torch.from_numpy(x), positions[None], *extra)
    with torch.no_grad():
        return attention(torch.from_numpy(x), cos_sin, mask)[0].numpy()


@pytest.mark.parametrize("family", ["olmo2", "olmo3"])
def test_matches_transformers_olmo_attention(family):
    torch = pytest.importorskip("torch")
    window = None
    config = {}
    if family == "olmo3":  # a sliding layer (OLMo 3 has sliding and full ones)
        window = 3
        config = dict(sliding_window=window, layer_types=["sliding_attention"])
    modeling, hf_config, attention = _olmo(torch, family, **config)
    if family == "olmo3":
        assert attention.sliding_window == window
    x = randn(rng(4), 1, T, D)
    expected = _run_olmo(torch, modeling, family, hf_config, attention, x, window)
    layer = keras_attn.MultiHeadAttention(
        H, D // H, num_key_value_heads=H_KV, rope_max_wavelength=100.0, qk_norm="rms",
        qk_norm_epsilon=1e-6, qk_norm_full_width=True, sliding_window=window, use_bias=True)
    layer.build((1, T, D))
    state = {n: p.detach().numpy() for n, p in attention.named_parameters()}
    for ours, theirs in (("query_dense", "q_proj"), ("key_dense", "k_proj"),
                         ("value_dense", "v_proj"), ("output_dense", "o_proj")):
        dense = getattr(layer, ours)
        dense.kernel.assign(state[f"{theirs}.weight"].T)
        dense.bias.assign(state[f"{theirs}.bias"])
    layer.query_norm.scale.assign(state["q_norm.weight"])  # (H * d,)
    layer.key_norm.scale.assign(state["k_norm.weight"])  # (H_kv * d,)
    ours = to_numpy(layer(x, use_causal_mask=True))
    assert_close(ours, expected, against="transformers")
    # The ablation, on transformers' side: each norm's statistics over every head's d
    # (the per-head qk-norm of Qwen 3 and the others), its full-width weights kept.
    for norm, heads in ((attention.q_norm, H), (attention.k_norm, H_KV)):
        weight, eps = norm.weight.detach().numpy(), norm.variance_epsilon
        norm.forward = (lambda h, w=weight, e=eps, n=heads: torch.from_numpy(
            _per_head(h.numpy(), w, e, n).astype("float32")))
    ablated = _run_olmo(torch, modeling, family, hf_config, attention, x, window)
    gap = float(np.abs(ablated - expected).max())
    assert gap > 1e-2, f"per-head statistics moved the output by {gap} only"
