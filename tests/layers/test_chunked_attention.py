"""`MultiHeadAttention(attention_chunk_size=C)`: Llama 4's chunked attention in a layer.

Against the float64 reference (with grouped heads, RoPE, a window, sinks), over a
cache (prefill in chunks and decode one token at a time equal the uncached forward,
with a traced index too: the chunks follow the absolute positions), through Keras's
`_compute_attention` hook, saved in the config, and against transformers'
`Llama4TextAttention` on a chunked (RoPE) layer and a full (no-RoPE) one. Each
comparison has its ablation: the layer without chunks is far from the chunked result.
"""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn._policy import observe_paths
from keras_attn.testing.weights import randomize_weights, reference_params

from .. import reference
from ..helpers import UNCACHED, assert_close, randn, rng, to_numpy

BACKEND = keras.backend.backend()
B, T, D, H, H_KV, D_HEAD, C = 2, 11, 16, 4, 2, 4, 4
OPTIONS = {
    "gqa_rope": dict(num_key_value_heads=H_KV, rope_max_wavelength=100.0),
    "window_sinks": dict(num_key_value_heads=H_KV, rope_max_wavelength=100.0, sliding_window=3,
                         use_sinks=True),
}


def _mha(seed=0, **options):
    layer = keras_attn.MultiHeadAttention(H, D_HEAD, **options)
    layer.build((B, T, D))
    randomize_weights(layer, seed=seed)
    return layer


def _far(a, b, floor=0.05):
    gap = float(np.abs(np.asarray(to_numpy(a), np.float64) - np.asarray(b, np.float64)).max())
    assert gap > floor, f"the ablation moved the output by {gap} only"
    return gap


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_layer_matches_reference_and_its_cached_decoding(name):
    options = OPTIONS[name]
    x = randn(rng(1), B, T, D)
    layer = _mha(seed=2, attention_chunk_size=C, **options)
    expected, _ = reference.multi_head_attention(
        reference_params(layer), x, x, num_heads=H, is_causal=True, attention_chunk_size=C,
        **options)
    full = to_numpy(layer(x, use_causal_mask=True))
    assert_close(full, expected)
    unchunked, _ = reference.multi_head_attention(
        reference_params(layer), x, x, num_heads=H, is_causal=True, **options)
    _far(full, unchunked)  # the ablation
    # Prefill one chunk and a half (6 = C + 2: the next call starts inside a chunk), then
    # decode one token at a time, then the last 3 at once: every row equals the forward.
    cache = layer.empty_cache(B, 12)
    outs, start = [], 0
    with observe_paths() as taken:
        for length in (6, 1, 1, 3):
            out, cache = layer(x[:, start:start + length], cache=cache, cache_update_index=start,
                               use_causal_mask=True)
            outs.append(to_numpy(out))
            start += length
    assert taken["cached"] == 4
    assert_close(np.concatenate(outs, axis=1), full, against=UNCACHED)


def test_decode_step_with_a_traced_index():
    """One traced step serves every `cache_update_index`: the chunk of each query is
    computed from the traced position, not from a Python int."""
    x = randn(rng(3), B, T, D)
    layer = _mha(seed=4, attention_chunk_size=C, **OPTIONS["gqa_rope"])
    full = to_numpy(layer(x, use_causal_mask=True))
    _, cache = layer(x[:, :3], cache=layer.empty_cache(B, 12), cache_update_index=0,
                     use_causal_mask=True)
    traces = []

    def step(token, cache, index):
        traces.append(1)
        return layer(token, cache=cache, cache_update_index=index, use_causal_mask=True)

    if BACKEND == "jax":
        import jax

        step = jax.jit(step)
    elif BACKEND == "tensorflow":
        import tensorflow as tf

        step = tf.function(step, jit_compile=True)
    for i in range(3, T):
        index = keras.ops.convert_to_tensor(i, dtype="int32")
        out, cache = step(keras.ops.convert_to_tensor(x[:, i:i + 1]), cache, index)
        assert_close(out, full[:, i:i + 1], what=f"step {i}", against=UNCACHED)
    assert len(traces) == (1 if BACKEND in ("jax", "tensorflow") else T - 3)


def test_keras_compute_attention_hook_gets_the_chunks_in_its_mask():
    """A subclass overriding Keras's `_compute_attention` gets every rule in its mask."""
    class Hooked(keras_attn.MultiHeadAttention):
        def _compute_attention(self, query, key, value, attention_mask=None, **kwargs):
            return super()._compute_attention(query, key, value, attention_mask, **kwargs)

    x = randn(rng(5), B, T, D)
    layer = Hooked(H, D_HEAD, attention_chunk_size=C)
    layer.build((B, T, D))
    plain = _mha(seed=6, attention_chunk_size=C)
    layer.set_weights(plain.get_weights())
    params = reference_params(plain)
    expected, _ = reference.multi_head_attention(
        params, x, x, num_heads=H, is_causal=True, attention_chunk_size=C)
    hooked = to_numpy(layer(x, use_causal_mask=True))
    assert_close(hooked, expected)
    unchunked, _ = reference.multi_head_attention(params, x, x, num_heads=H, is_causal=True)
    _far(hooked, unchunked)


def test_config_round_trip():
    layer = keras_attn.MultiHeadAttention(H, D_HEAD, attention_chunk_size=C)
    assert layer.get_config()["attention_chunk_size"] == C
    again = keras_attn.MultiHeadAttention.from_config(layer.get_config())
    assert again.attention_chunk_size == C
    assert keras_attn.MultiHeadAttention(H, D_HEAD).get_config()["attention_chunk_size"] is None


def _llama4(torch, use_rope, **config):
    """A tiny Llama4TextAttention (eager, float32) with random weights (std 0.35)."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama4 import modeling_llama4 as modeling

    config = transformers.Llama4TextConfig(
        hidden_size=D, num_attention_heads=H, num_key_value_heads=H_KV, head_dim=D_HEAD,
        num_hidden_layers=1, no_rope_layers=[int(use_rope)], attention_chunk_size=C,
        use_qk_norm=True, rms_norm_eps=1e-5, attention_bias=True,
        rope_parameters={"rope_type": "default", "rope_theta": 100.0}, **config)
    config._attn_implementation = "eager"
    hf = modeling.Llama4TextAttention(config, layer_idx=0).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in hf.parameters():
            parameter.copy_(0.35 * torch.randn(parameter.shape, generator=generator))
    return modeling, config, hf


def _run_llama4(torch, modeling, config, hf, x, layer_type):
    from transformers import masking_utils

    positions = torch.arange(x.shape[1])
    if layer_type == "chunked_attention":
        rule = masking_utils.chunked_causal_mask_function(C, torch.zeros(1, dtype=torch.long))
    else:
        rule = masking_utils.causal_mask_function
    allowed = rule(0, 0, positions[:, None], positions[None, :])
    mask = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))[None, None]
    freqs_cis = modeling.Llama4TextRotaryEmbedding(config)(torch.from_numpy(x), positions[None])
    with torch.no_grad():
        return hf(torch.from_numpy(x), freqs_cis, mask)[0].numpy()


def _copy_llama4_weights(layer, hf):
    state = {n: p.detach().numpy() for n, p in hf.named_parameters()}
    for ours, theirs in (("query_dense", "q_proj"), ("key_dense", "k_proj"),
                         ("value_dense", "v_proj"), ("output_dense", "o_proj")):
        dense = getattr(layer, ours)
        dense.kernel.assign(state[f"{theirs}.weight"].T)
        dense.bias.assign(state[f"{theirs}.bias"])


def test_matches_transformers_llama4_chunked_layer():
    """A chunked (RoPE) layer of Llama 4: complex RoPE over interleaved pairs is
    `rope_interleaved=True`; its weight-free L2 norm after RoPE is `qk_norm="rms"` with
    unit scales before RoPE (a rotation keeps each head's norm); the chunks are
    `attention_chunk_size`."""
    torch = pytest.importorskip("torch")
    modeling, config, hf = _llama4(torch, use_rope=True)
    assert config.layer_types == ["chunked_attention"]
    x = randn(rng(7), 1, T, D)
    expected = _run_llama4(torch, modeling, config, hf, x, "chunked_attention")
    options = dict(num_key_value_heads=H_KV, rope_max_wavelength=100.0, rope_interleaved=True,
                   qk_norm="rms", qk_norm_epsilon=1e-5, use_bias=True)
    layer = keras_attn.MultiHeadAttention(H, D_HEAD, attention_chunk_size=C, **options)
    layer.build((1, T, D))
    _copy_llama4_weights(layer, hf)  # the norms keep their unit scales
    assert_close(layer(x, use_causal_mask=True), expected, against="transformers")
    cache = layer.empty_cache(1, T)
    outs = []
    for start, stop in ((0, 5), (5, 6), (6, 7), (7, 11)):
        out, cache = layer(x[:, start:stop], cache=cache, cache_update_index=start,
                           use_causal_mask=True)
        outs.append(to_numpy(out))
    assert_close(np.concatenate(outs, axis=1), expected, against="transformers")
    # The ablations: no chunks; and RoPE over half-split pairs instead of interleaved ones.
    for wrong in (dict(options), dict(options, rope_interleaved=False, attention_chunk_size=C)):
        other = keras_attn.MultiHeadAttention(H, D_HEAD, **wrong)
        other.build((1, T, D))
        _copy_llama4_weights(other, hf)
        _far(other(x, use_causal_mask=True), expected)


def test_matches_transformers_llama4_no_rope_layer():
    """A full (no-RoPE) layer of Llama 4: no RoPE, no qk-norm, no chunks, and its
    temperature tuning `1 + attn_scale * log(1 + floor((p + 1) / floor_scale))` is 1
    while `p + 1 < floor_scale`. Past that it is `query_scale_*`'s curve one position
    later, which the options do not express (the last assertion shows the gap)."""
    torch = pytest.importorskip("torch")
    modeling, config, hf = _llama4(torch, use_rope=False)
    assert config.layer_types == ["full_attention"] and not hasattr(hf, "qk_norm")
    x = randn(rng(8), 1, T, D)
    expected = _run_llama4(torch, modeling, config, hf, x, "full_attention")
    layer = keras_attn.MultiHeadAttention(H, D_HEAD, num_key_value_heads=H_KV, use_bias=True)
    layer.build((1, T, D))
    _copy_llama4_weights(layer, hf)
    assert_close(layer(x, use_causal_mask=True), expected, against="transformers")
    chunked = keras_attn.MultiHeadAttention(H, D_HEAD, num_key_value_heads=H_KV, use_bias=True,
                                            attention_chunk_size=C)
    chunked.build((1, T, D))
    _copy_llama4_weights(chunked, hf)
    _far(chunked(x, use_causal_mask=True), expected)  # the ablation: chunks where there are none
    # floor_scale = 4: transformers' scale steps at p = 3, 7; `query_scale_length=4` at 4, 8.
    modeling, config, hf = _llama4(torch, use_rope=False, floor_scale=4, attn_scale=0.5)
    tuned = _run_llama4(torch, modeling, config, hf, x, "full_attention")
    scaled = keras_attn.MultiHeadAttention(H, D_HEAD, num_key_value_heads=H_KV, use_bias=True,
                                           query_scale_beta=0.5, query_scale_length=4)
    scaled.build((1, T, D))
    _copy_llama4_weights(scaled, hf)
    ours = to_numpy(scaled(x, use_causal_mask=True))
    assert_close(ours[:, :3], tuned[:, :3], against="transformers")  # before the first step
    _far(ours[:, 3:4], tuned[:, 3:4], floor=1e-3)  # p = 3: theirs stepped, ours not yet


def test_a_decoder_block_takes_the_chunks_as_a_keyword():
    """An AttentionOptions field is a block keyword too: the block's self-attention."""
    x = randn(rng(9), B, T, D)
    block = keras_attn.TransformerDecoderLayer(H, intermediate_dim=8, attention_chunk_size=C,
                                               normalize_first=True)
    block.build((B, T, D))
    randomize_weights(block, seed=10)
    assert block.get_config()["attention_chunk_size"] == C
    params = reference_params(block)
    expected = reference.decoder_layer(params, x, H, normalize_first=True,
                                       attention_options={"attention_chunk_size": C})
    ours = to_numpy(block(x))
    assert_close(ours, expected)
    _far(ours, reference.decoder_layer(params, x, H, normalize_first=True))
