"""`use_attention_input_norm=False`: no norm before the self-attention, the norm before
the feed-forward kept, `x + attn(x)` then `x + ffn(N(x))` (ModernBERT's layer 0, whose
`attn_norm` is `nn.Identity()`)."""

import os
import tempfile

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn.testing import reference
from keras_attn.testing.weights import randomize_weights, reference_params

from ..helpers import assert_close, randn, rng, to_numpy
from ..shapes import B, D, H, S, T

BACKEND = keras.backend.backend()
BLOCK = dict(normalize_first=True, use_attention_input_norm=False)
OPTIONS = {"rope_max_wavelength": 1e4}


def _far(a, b):
    return float(np.abs(np.asarray(a) - np.asarray(b)).max())


def test_encoder_matches_the_reference_without_its_attention_norm():
    x = randn(rng(3), B, T, D)
    real = np.arange(T) < np.array([[T], [3]])
    layer = keras_attn.TransformerEncoderLayer(H, intermediate_dim=16, **BLOCK, **OPTIONS)
    layer.build(x.shape)
    randomize_weights(layer, seed=4)
    # The path: no `self_attention_norm` weights; the feed-forward's norm is there.
    names = {w.path.split("/")[1] for w in layer.weights}
    assert "self_attention_norm" not in names and "feed_forward_norm" in names, names
    assert layer.self_attention_norm is None
    out = to_numpy(layer(x, padding_mask=real))
    params = reference_params(layer)
    assert "self_attention_norm" not in params
    expected = reference.encoder_layer(params, x, num_heads=H, padding_mask=real,
                                       normalize_first=True, attention_options=OPTIONS)
    assert_close(out, expected)
    # Ablation: the norm put back before the attention (the feed-forward's weights) is far.
    normed = reference.encoder_layer({**params, "self_attention_norm": params["feed_forward_norm"]},
                                     x, num_heads=H, padding_mask=real, normalize_first=True,
                                     attention_options=OPTIONS)
    assert _far(normed, out) > 0.1, _far(normed, out)


def test_decoder_keeps_its_cross_attention_and_feed_forward_norms():
    g = rng(7)
    x, memory = randn(g, B, T, D), randn(g, B, S, D)
    layer = keras_attn.TransformerDecoderLayer(H, intermediate_dim=16, **BLOCK, **OPTIONS)
    layer.build(x.shape, memory.shape)
    randomize_weights(layer, seed=8)
    names = {w.path.split("/")[1] for w in layer.weights}
    assert "self_attention_norm" not in names, names
    assert {"cross_attention_norm", "feed_forward_norm"} <= names, names
    out = to_numpy(layer(x, memory))
    params = reference_params(layer)
    expected = reference.decoder_layer(params, x, num_heads=H, memory=memory,
                                       normalize_first=True, attention_options=OPTIONS)
    assert_close(out, expected)


@pytest.fixture(scope="module")
def modernbert_layer_0():
    """transformers' ModernBertEncoderLayer 0 with random weights (std 0.35), its input and
    output (eager attention, float32); RoPE from its rotary embedding."""
    torch = pytest.importorskip("torch")
    modernbert = pytest.importorskip("transformers.models.modernbert.modeling_modernbert")
    from transformers import ModernBertConfig

    config = ModernBertConfig(hidden_size=32, num_attention_heads=4, intermediate_size=24,
                              num_hidden_layers=3, vocab_size=64, pad_token_id=0,
                              bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
    config._attn_implementation = "eager"
    assert config.layer_types[0] == "full_attention" and not config.norm_bias
    assert not config.attention_bias and not config.mlp_bias
    torch.manual_seed(0)
    module = modernbert.ModernBertEncoderLayer(config, layer_idx=0).eval()
    assert isinstance(module.attn_norm, torch.nn.Identity)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.normal_(0.0, 0.35)
            if parameter.ndim == 1:  # the feed-forward's LayerNorm weight: around 1
                parameter.add_(1.0)
    x = randn(rng(11), B, 7, 32)
    rotary = modernbert.ModernBertRotaryEmbedding(config)
    positions = torch.arange(7)[None].expand(B, -1)
    with torch.no_grad():
        cos_sin = rotary(torch.tensor(x), positions, "full_attention")
        expected = module(torch.tensor(x), position_embeddings=cos_sin).numpy()
    state = {k: v.detach().numpy() for k, v in module.state_dict().items()}
    return config, state, x, expected


def _from_modernbert(config, state, attention_norm):
    """Our encoder block with ModernBERT layer 0's weights, mapped by hand: `Wqkv` rows
    q | k | v, `Wi` rows input (activated: our gate) | gate (our up projection), LayerNorm
    without a bias (beta 0). `attention_norm`: the ablation, the norm put back."""
    D, F = config.hidden_size, config.intermediate_size
    layer = keras_attn.TransformerEncoderLayer(
        config.num_attention_heads, intermediate_dim=F, normalize_first=True, use_bias=False,
        gated_feed_forward=True, activation=config.hidden_activation,
        layer_norm_epsilon=config.norm_eps, use_attention_input_norm=attention_norm,
        rope_max_wavelength=config.rope_parameters["full_attention"]["rope_theta"])
    layer.build((None, None, D))
    q, k, v = np.split(state["attn.Wqkv.weight"], 3)
    attention = layer.self_attention
    for dense, weight in ((attention.query_dense, q), (attention.key_dense, k),
                          (attention.value_dense, v), (attention.output_dense,
                                                       state["attn.Wo.weight"])):
        dense.kernel.assign(weight.T.reshape(dense.kernel.shape))
    activated, up = np.split(state["mlp.Wi.weight"], 2)
    layer.feed_forward.gate_dense.kernel.assign(activated.T)
    layer.feed_forward.intermediate_dense.kernel.assign(up.T)
    layer.feed_forward.output_dense.kernel.assign(state["mlp.Wo.weight"].T)
    norms = [layer.feed_forward_norm] + ([layer.self_attention_norm] if attention_norm else [])
    for norm in norms:
        norm.gamma.assign(state["mlp_norm.weight"])
        norm.beta.assign(np.zeros_like(state["mlp_norm.weight"]))
    return layer


@pytest.mark.skipif(BACKEND != "torch", reason="against transformers on PyTorch")
def test_matches_modernbert_layer_0(modernbert_layer_0):
    config, state, x, expected = modernbert_layer_0
    layer = _from_modernbert(config, state, attention_norm=False)
    assert layer.self_attention_norm is None  # the path: no norm before the attention
    out = to_numpy(layer(x))
    relative = _far(out, expected) / float(np.abs(expected).max())
    assert relative < 1e-5, relative
    # Ablation: with the norm before the attention (as ModernBERT's other layers) it is far.
    normed = to_numpy(_from_modernbert(config, state, attention_norm=True)(x))
    moved = _far(normed, expected) / float(np.abs(expected).max())
    assert moved > 1e-2, moved


def test_config_and_keras_file_round_trip():
    cls = keras_attn.TransformerEncoderLayer
    assert "use_attention_input_norm" not in cls(H, intermediate_dim=16).get_config()
    x = randn(rng(9), B, T, D)
    layer = cls(H, intermediate_dim=16, **BLOCK)
    layer.build(x.shape)
    randomize_weights(layer, seed=10)
    config = layer.get_config()
    assert config["use_attention_input_norm"] is False
    again = cls.from_config(config)
    assert again.use_attention_input_norm is False and again.get_config() == config
    model = keras.Sequential([keras.Input((T, D)), layer])
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "block.keras")
        model.save(path)
        loaded = keras.saving.load_model(path)
    assert loaded.layers[0].self_attention_norm is None
    assert_close(to_numpy(loaded(x)), to_numpy(model(x)), against="the saved block")


@pytest.mark.backend_independent
@pytest.mark.parametrize("cls, arguments, message", [
    (keras_attn.TransformerEncoderLayer, {"use_attention_input_norm": 0},
     r"Received: use_attention_input_norm=0"),
    (keras_attn.TransformerEncoderLayer, {"use_attention_input_norm": False},
     r"Received: use_attention_input_norm=False, normalize_first=False"),
    (keras_attn.TransformerDecoderLayer,
     {"use_attention_input_norm": False, "normalize_first": True, "use_parallel_residual": True},
     r"Received: use_parallel_residual=True, use_attention_input_norm=False"),
])
def test_bad_arguments_are_refused_by_name(cls, arguments, message):
    with pytest.raises(ValueError, match=message):
        cls(H, intermediate_dim=16, **arguments)
