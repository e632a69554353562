"""`keras_attn.convert` from Hugging Face Llama layers, against `transformers`' own outputs.

Needs torch and `transformers`: the torch tox environment installs both (`transformers` is a
test-only dependency there); elsewhere the whole module is skipped. The Llama modules are built
from a small `LlamaConfig` with random weights: nothing is downloaded.
"""

import re

import numpy as np
import pytest

from keras_attn import convert

from ..helpers import randn, rng, to_numpy

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
modeling_llama = pytest.importorskip("transformers.models.llama.modeling_llama")

B, T, D, H, F = 2, 7, 32, 4, 64
ATOL = 1e-5  # float32, worst absolute error against transformers
HEADS = {"gqa": 2, "mqa": 1}


def _config(num_key_value_heads, **extra):
    options = dict(hidden_size=D, intermediate_size=F, num_attention_heads=H,
                   num_key_value_heads=num_key_value_heads, num_hidden_layers=1,
                   max_position_embeddings=64, rope_theta=10000.0, rms_norm_eps=1e-6,
                   attention_bias=False)
    config = transformers.LlamaConfig(**{**options, **extra})
    config._attn_implementation = "eager"  # the plain matmul-softmax path, with our mask as given
    return config


def _randomize(module, seed):
    """Random values for every parameter (RMSNorm weights around 1 rather than exactly 1)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            value = 0.2 * torch.randn(parameter.shape, generator=generator)
            if "layernorm" in name:
                value = value + 1.0
            parameter.copy_(value)
    return module.float().eval()


def _torch_inputs(config, x):
    """`hidden_states`, RoPE `(cos, sin)` for positions 0..T-1, and the additive causal mask."""
    hidden = torch.from_numpy(x)
    batch, length = x.shape[:2]
    position_ids = torch.arange(length)[None].expand(batch, length)
    cos_sin = modeling_llama.LlamaRotaryEmbedding(config=config)(hidden, position_ids)
    causal = torch.full((length, length), float("-inf")).triu(1)  # 0 on and below the diagonal
    return hidden, cos_sin, causal[None, None].expand(batch, 1, length, length)


def _compare(actual, expected, what):
    actual = np.asarray(to_numpy(actual), np.float64)
    expected = np.asarray(expected.detach().numpy(), np.float64)
    assert actual.shape == expected.shape, f"{what}: {actual.shape} != {expected.shape}"
    worst = float(np.abs(actual - expected).max())
    assert worst <= ATOL, f"{what}: worst absolute error {worst:.3g} > {ATOL}"


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("heads", sorted(HEADS))
def test_attention_matches_transformers(heads, bias):
    config = _config(HEADS[heads], attention_bias=bias)
    module = _randomize(modeling_llama.LlamaAttention(config, layer_idx=0), seed=1)
    layer = convert.multi_head_attention_from_llama(
        module.state_dict(), H, HEADS[heads], rope_theta=10000.0)
    assert tuple(layer.key_dense.kernel.shape) == (D, HEADS[heads] * D // H)
    assert layer.use_bias == bias
    x = randn(rng(2), B, T, D)
    hidden, cos_sin, mask = _torch_inputs(config, x)
    with torch.no_grad():
        expected = module(hidden, position_embeddings=cos_sin, attention_mask=mask)[0]
    _compare(layer(x, use_causal_mask=True), expected, f"LlamaAttention {heads} bias={bias}")


@pytest.mark.parametrize("heads", sorted(HEADS))
def test_decoder_layer_matches_transformers(heads):
    config = _config(HEADS[heads])
    module = _randomize(modeling_llama.LlamaDecoderLayer(config, layer_idx=0), seed=3)
    layer = convert.transformer_decoder_layer_from_llama(
        module.state_dict(), H, HEADS[heads], rope_theta=10000.0, rms_norm_eps=1e-6)
    assert not layer.has_memory
    x = randn(rng(4), B, T, D)
    hidden, cos_sin, mask = _torch_inputs(config, x)
    with torch.no_grad():
        expected = module(hidden, attention_mask=mask, position_embeddings=cos_sin)
    if isinstance(expected, tuple):  # transformers < 4.54 returns (hidden_states, ...)
        expected = expected[0]
    _compare(layer(x), expected, f"LlamaDecoderLayer {heads}")


def test_decoder_layer_with_biases_and_head_dim_from_a_model():
    """`attention_bias` and `mlp_bias`, a `head_dim` other than D // H, read under a prefix."""
    config = _config(2, attention_bias=True, mlp_bias=True, head_dim=12)
    model = _randomize(transformers.LlamaForCausalLM(config), seed=5)
    layer = convert.transformer_decoder_layer_from_llama(
        model.state_dict(), H, 2, prefix="model.layers.0", name="block")
    assert (layer.self_attention.key_dim, layer.use_bias, layer.name) == (12, True, "block")
    module = model.model.layers[0]
    x = randn(rng(6), B, T, D)
    hidden, cos_sin, mask = _torch_inputs(config, x)
    with torch.no_grad():
        expected = module(hidden, attention_mask=mask, position_embeddings=cos_sin)
    if isinstance(expected, tuple):
        expected = expected[0]
    _compare(layer(x), expected, "LlamaDecoderLayer with biases, head_dim=12")


# ----------------------------------------------------------------------------
# Errors (state dicts of numpy arrays)


def _attention_dict(H_kv=2, d=8, bias=False):
    g = rng(7)
    entries = {"q_proj.weight": randn(g, H * d, D), "k_proj.weight": randn(g, H_kv * d, D),
               "v_proj.weight": randn(g, H_kv * d, D), "o_proj.weight": randn(g, D, H * d)}
    if bias:
        entries.update({"q_proj.bias": randn(g, H * d), "k_proj.bias": randn(g, H_kv * d),
                        "v_proj.bias": randn(g, H_kv * d), "o_proj.bias": randn(g, D)})
    return entries


def _decoder_dict():
    g = rng(8)
    entries = {"self_attn." + k: v for k, v in _attention_dict().items()}
    entries.update({"mlp.gate_proj.weight": randn(g, F, D), "mlp.up_proj.weight": randn(g, F, D),
                    "mlp.down_proj.weight": randn(g, D, F),
                    "input_layernorm.weight": randn(g, D),
                    "post_attention_layernorm.weight": randn(g, D)})
    return entries


def test_attention_errors():
    entries = _attention_dict()
    with pytest.raises(ValueError, match=re.escape(
            "'k_proj.weight' must have shape (H_kv * d, D) = (8, 32). Received: shape (16, 32)")):
        convert.multi_head_attention_from_llama(entries, H, 1)
    with pytest.raises(ValueError, match=r"num_heads=4, num_key_value_heads=3"):
        convert.multi_head_attention_from_llama(entries, H, 3)
    with pytest.raises(ValueError, match=r"missing 'o_proj.weight'"):
        convert.multi_head_attention_from_llama(
            {k: v for k, v in entries.items() if k != "o_proj.weight"}, H, 2)
    partial = dict(entries, **{"q_proj.bias": np.zeros(H * 8, "float32")})
    with pytest.raises(ValueError, match=r"has 'q_proj.bias' but is missing 'k_proj.bias', "
                                         r"'v_proj.bias', 'o_proj.bias'"):
        convert.multi_head_attention_from_llama(partial, H, 2)
    with pytest.raises(ValueError, match=r"`rope_max_wavelength` cannot be passed"):
        convert.multi_head_attention_from_llama(entries, H, 2, rope_max_wavelength=500.0)
    with pytest.raises(ValueError, match=r"unexpected entries 'rotary_emb.inv_freq'"):
        convert.multi_head_attention_from_llama(
            dict(entries, **{"rotary_emb.inv_freq": np.ones(4, "float32")}), H, 2)


def test_decoder_errors():
    entries = _decoder_dict()
    bad = dict(entries, **{"mlp.down_proj.weight": np.zeros((D, F + 1), "float32")})
    with pytest.raises(ValueError, match=re.escape(
            "'mlp.down_proj.weight' must have shape (D, F) = (32, 64). Received: shape (32, 65)")):
        convert.transformer_decoder_layer_from_llama(bad, H, 2)
    bad = dict(entries, **{"post_attention_layernorm.weight": np.ones(D + 1, "float32")})
    with pytest.raises(ValueError, match=re.escape(
            "'post_attention_layernorm.weight' must have shape (D,) = (32,). "
            "Received: shape (33,)")):
        convert.transformer_decoder_layer_from_llama(bad, H, 2)
    with pytest.raises(ValueError, match=r"missing 'input_layernorm.weight'"):
        convert.transformer_decoder_layer_from_llama(
            {k: v for k, v in entries.items() if k != "input_layernorm.weight"}, H, 2)
    mlp_bias = dict(entries, **{"mlp.gate_proj.bias": np.zeros(F, "float32"),
                                "mlp.up_proj.bias": np.zeros(F, "float32"),
                                "mlp.down_proj.bias": np.zeros(D, "float32")})
    with pytest.raises(ValueError, match=r"one `use_bias`.*self_attn biases absent, "
                                         r"'mlp.gate_proj.bias' present"):
        convert.transformer_decoder_layer_from_llama(mlp_bias, H, 2)
    with pytest.raises(ValueError, match=r"`activation` cannot be passed"):
        convert.transformer_decoder_layer_from_llama(entries, H, 2, activation="gelu")



def test_transformers_layer_converters_take_the_prefix_their_errors_advise():
    """Issue 38: from a whole model's state dict, the layer converters' error advised a
    `prefix=` that `*_from_transformers` did not accept; they take it now, and the layer
    read under it is the one read from the module."""
    config = _config(2, num_hidden_layers=2)
    model = _randomize(transformers.LlamaForCausalLM(config), seed=8)
    state = model.state_dict()
    cases = [(convert.multi_head_attention_from_transformers, "model.layers.1.self_attn.",
              model.model.layers[1].self_attn),
             (convert.transformer_decoder_layer_from_transformers, "model.layers.1.",
              model.model.layers[1])]
    x = randn(rng(9), B, T, D)
    for converter, prefix, module in cases:
        with pytest.raises(ValueError, match=re.escape(f"prefix={prefix!r}")):
            converter(state, config, 1, prefix="layers.1." + prefix[len("model.layers.1."):])
        from_prefix = converter(state, config, 1, prefix=prefix)
        from_module = converter(module, config, 1)
        np.testing.assert_array_equal(to_numpy(from_prefix(x, use_causal_mask=True)
                                               if "attention" in converter.__name__
                                               else from_prefix(x)),
                                      to_numpy(from_module(x, use_causal_mask=True)
                                               if "attention" in converter.__name__
                                               else from_module(x)))
