"""Attention sinks (gpt-oss's `sinks`): one logit per query head in every softmax's
denominator. Each path against the float64 reference (outputs and gradients, sinks
included; the blockwise one in small blocks, grouped heads, with rows that see no key),
`MultiHeadAttention`'s `sinks` weight with and without a cache, and transformers'
`GptOssAttention`."""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn import _device
from keras_attn._policy import observe_paths
from keras_attn.testing.weights import randomize_weights, reference_params

from .. import reference
from ..helpers import assert_close, randn, rng, to_numpy

B, H, H_KV, T, S, D = 2, 4, 2, 5, 7, 8
SINKS = np.array([1.5, -0.5, 3.0, 0.2], "float32")  # far from each other and from 0


def _problem(seed=0):
    g = rng(seed)
    return randn(g, B, H, T, D), randn(g, B, H_KV, S, D), randn(g, B, H_KV, S, D)


PATHS = ["explicit", "fused", "blockwise"]


@pytest.fixture
def small_blocks():
    """Blocks of 2 (several query and key blocks at these shapes), restored after."""
    keras_attn.config.set_attention_block_size(2)
    yield
    keras_attn.config.set_attention_block_size(None)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("options", [dict(is_causal=True), dict(sliding_window=3),
                                     dict(is_causal=True, bias=True)])
def test_each_path_matches_reference(path, options, small_blocks):
    q, k, v = _problem()
    options = dict(options)
    if options.pop("bias", False):
        options["bias"] = randn(rng(5), B, H, T, S)
    expected, _ = reference.scaled_dot_product_attention(q, k, v, sinks=SINKS, **options)
    plain, _ = reference.scaled_dot_product_attention(q, k, v, **options)
    assert np.abs(expected - plain).max() > 0.05  # sinks move the numbers
    with observe_paths() as taken:
        out = keras_attn.scaled_dot_product_attention(q, k, v, sinks=SINKS, implementation=path,
                                                      **options)
    assert taken == {path: 1}
    assert_close(out, expected)


@pytest.mark.parametrize("path", PATHS)
def test_gradients_match_reference(path, small_blocks):
    if keras.backend.backend() == "numpy":
        pytest.skip("the NumPy backend cannot differentiate")
    q, k, v = _problem(1)
    probe = randn(rng(2), B, H, T, D)

    def loss(q, k, v, sinks):
        out = keras_attn.scaled_dot_product_attention(q, k, v, sinks=sinks, is_causal=True,
                                                      implementation=path)
        return keras.ops.sum(out * keras.ops.convert_to_tensor(probe))

    _, grads = _device.value_and_grad(loss, [q, k, v, SINKS])
    args = [a.astype(np.float64) for a in (q, k, v, SINKS)]
    for which, grad in enumerate(grads):
        def f(x, which=which):
            xs = list(args)
            xs[which] = x
            out, _ = reference.scaled_dot_product_attention(*xs[:3], sinks=xs[3], is_causal=True)
            return float((out * probe).sum())
        assert_close(grad, reference.numerical_gradient(f, args[which]),
                     what=f"{path} gradient {which}", quantity="gradient")


def test_a_row_with_no_allowed_key_gives_zeros(small_blocks):
    """A padding mask that hides every key from batch 1: its rows are zero on every path
    (the sink takes all the weight), batch 0 unchanged."""
    q, k, v = _problem(3)
    mask = np.ones((B, 1, 1, S), bool)
    mask[1] = False
    expected, _ = reference.scaled_dot_product_attention(q, k, v, mask=mask, sinks=SINKS)
    for path in PATHS:
        out = to_numpy(keras_attn.scaled_dot_product_attention(
            q, k, v, mask=mask, sinks=SINKS, implementation=path))
        assert_close(out, expected, what=path)
        assert np.abs(out[1]).max() == 0.0


def test_bad_sinks_are_refused_by_name():
    q, k, v = _problem()
    with pytest.raises(ValueError, match=r"Received: sinks.shape=\(3,\)"):
        keras_attn.scaled_dot_product_attention(q, k, v, sinks=SINKS[:3])


def test_multi_head_attention_sinks_weight_cached_and_uncached():
    x = randn(rng(3), B, 9, 16)
    layer = keras_attn.MultiHeadAttention(H, D, num_key_value_heads=H_KV, use_sinks=True,
                                          rope_max_wavelength=100.0)
    layer(x, x, use_causal_mask=True)
    randomize_weights(layer, seed=4)
    layer.sinks.assign(SINKS)
    assert "sinks" in [w.path.split("/")[-1] for w in layer.weights]
    params = reference_params(layer)
    expected, _ = reference.multi_head_attention(
        params, x, x, num_heads=H, num_key_value_heads=H_KV, is_causal=True,
        rope_max_wavelength=100.0, use_sinks=True)
    assert_close(to_numpy(layer(x, x, use_causal_mask=True)), expected)
    # Decoding over a cache: prefill 4, then one token at a time.
    cache = keras_attn.empty_cache(layer, batch_size=B, max_length=9, as_kv_cache=True)
    outs = []
    for start, stop in ((0, 4), (4, 5), (5, 6), (6, 7), (7, 8), (8, 9)):
        out, cache = layer(x[:, start:stop], x[:, start:stop], cache=cache,
                           cache_update_index=start, use_causal_mask=True)
        outs.append(to_numpy(out))
    assert_close(np.concatenate(outs, axis=1), expected, against="uncached forward")
    again = keras_attn.MultiHeadAttention.from_config(layer.get_config())
    assert again.use_sinks


def test_matches_transformers_gpt_oss_attention():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.gpt_oss import modeling_gpt_oss as modeling

    config = transformers.GptOssConfig(
        hidden_size=32, num_attention_heads=H, num_key_value_heads=H_KV, head_dim=D,
        num_hidden_layers=1, rope_parameters={"rope_type": "default", "rope_theta": 100.0},
        sliding_window=4, layer_types=["sliding_attention"], attention_bias=True)
    config._attn_implementation = "eager"
    hf = modeling.GptOssAttention(config, layer_idx=0).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in hf.parameters():
            parameter.copy_(0.5 * torch.randn(parameter.shape, generator=generator))
    x = randn(rng(6), 1, 9, 32)
    rotary = modeling.GptOssRotaryEmbedding(config)
    position_ids = torch.arange(9)[None]
    cos_sin = rotary(torch.from_numpy(x), position_ids)
    mask = torch.full((9, 9), float("-inf")).triu(1)
    mask = mask.masked_fill(torch.arange(9)[:, None] - torch.arange(9)[None] >= 4, float("-inf"))
    with torch.no_grad():
        expected = hf(torch.from_numpy(x), cos_sin, mask[None, None])[0].numpy()
    layer = keras_attn.MultiHeadAttention(H, D, num_key_value_heads=H_KV, use_sinks=True,
                                          rope_max_wavelength=100.0, sliding_window=4,
                                          use_bias=True)
    layer(x, x, use_causal_mask=True)
    state = {n: p.detach().numpy() for n, p in hf.named_parameters()}
    for ours, theirs in (("query_dense", "q_proj"), ("key_dense", "k_proj"),
                         ("value_dense", "v_proj")):
        dense = getattr(layer, ours)
        dense.kernel.assign(state[f"{theirs}.weight"].T.reshape(dense.kernel.shape))
        dense.bias.assign(state[f"{theirs}.bias"].reshape(dense.bias.shape))
    layer.output_dense.kernel.assign(state["o_proj.weight"].T.reshape(
        layer.output_dense.kernel.shape))
    layer.output_dense.bias.assign(state["o_proj.bias"])
    layer.sinks.assign(state["sinks"])
    ours = to_numpy(layer(x, x, use_causal_mask=True))
    assert_close(ours, expected, against="transformers")
    layer.sinks.assign(np.full((H,), -1e4, "float32"))  # the ablation: sinks that never win
    assert np.abs(to_numpy(layer(x, x, use_causal_mask=True)) - expected).max() > 0.05
