"""`keras_attn.convert` from torch.nn layers, against torch's own outputs.

Needs torch: the torch tox environment runs this file (torch is installed there); the other
environments do not have torch, and the whole module is skipped. The Keras converter is tested
in `test_convert.py` on every backend.
"""

import re

import numpy as np
import pytest

import keras_attn
from keras_attn import convert

from ..helpers import assert_close, randn, rng, to_numpy

torch = pytest.importorskip("torch")

B, T, S, D, H, F = 2, 5, 7, 8, 2, 16


def _randomize(module, seed):
    """Random values for every parameter: torch starts biases at 0 and norms at identity."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            value = 0.5 * torch.randn(parameter.shape, generator=generator)
            if name.startswith("norm") and name.endswith("weight"):
                value = value + 1.0
            parameter.copy_(value)
    return module.eval()


def _torch(x):
    return torch.from_numpy(np.asarray(x))


def _key_padding(lengths, length):
    """torch's key_padding_mask (True = ignore) and ours (True = may attend)."""
    keep = np.arange(length)[None, :] < np.asarray(lengths)[:, None]
    return _torch(~keep), keep


# ----------------------------------------------------------------------------
# MultiheadAttention

MHA_VARIANTS = {
    "packed": {},
    "kdim_vdim": {"kdim": 5, "vdim": 6},
    "no_bias": {"bias": False},
}


@pytest.mark.parametrize("padding", [False, True])
@pytest.mark.parametrize("variant", sorted(MHA_VARIANTS))
def test_multi_head_attention(variant, padding):
    options = MHA_VARIANTS[variant]
    module = _randomize(torch.nn.MultiheadAttention(D, H, batch_first=True, **options), seed=1)
    layer = convert.multi_head_attention_from_torch(module.state_dict(), H)
    assert isinstance(layer, keras_attn.MultiHeadAttention)
    assert layer.use_bias == options.get("bias", True)

    g = rng(2)
    query = randn(g, B, T, D)
    key = randn(g, B, S, options.get("kdim", D))
    value = randn(g, B, S, options.get("vdim", D))
    torch_mask, keep = _key_padding([S, 4], S) if padding else (None, None)
    with torch.no_grad():
        expected, _ = module(_torch(query), _torch(key), _torch(value),
                             key_padding_mask=torch_mask, need_weights=False)
    assert_close(layer(query=query, value=value, key=key, key_mask=keep), expected.numpy(),
                 what=f"{variant}, key_mask")
    if padding:  # the same padding as a (B, T, S) attention_mask
        attention_mask = np.broadcast_to(keep[:, None, :], (B, T, S))
        assert_close(layer(query=query, value=value, key=key, attention_mask=attention_mask),
                     expected.numpy(), what=f"{variant}, attention_mask")


def test_multi_head_attention_self_attention_causal():
    module = _randomize(torch.nn.MultiheadAttention(D, H, batch_first=True), seed=3)
    layer = convert.multi_head_attention_from_torch(module.state_dict(), H)
    x = randn(rng(4), B, T, D)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(T)
    with torch.no_grad():
        expected, _ = module(_torch(x), _torch(x), _torch(x), attn_mask=causal, is_causal=True,
                             need_weights=False)
    assert_close(layer(query=x, value=x, key=x, use_causal_mask=True), expected.numpy())


def test_multi_head_attention_with_prefix_module_and_grad_tensors():
    """A nested state dict with `prefix`, tensors that require grad, and the module itself."""
    module = _randomize(torch.nn.MultiheadAttention(D, H, batch_first=True), seed=5)
    nested = {"encoder.attn." + name: p for name, p in module.named_parameters()}
    nested["encoder.other.weight"] = torch.zeros(3)  # outside the prefix: ignored
    assert next(iter(nested.values())).requires_grad
    x = randn(rng(6), B, T, D)
    with torch.no_grad():
        expected, _ = module(_torch(x), _torch(x), _torch(x), need_weights=False)
    for layer in (convert.multi_head_attention_from_torch(nested, H, prefix="encoder.attn."),
                  convert.multi_head_attention_from_torch(nested, H, prefix="encoder.attn"),
                  convert.multi_head_attention_from_torch(module, H, name="converted")):
        assert_close(layer(query=x, value=x, key=x), expected.numpy())


def test_multi_head_attention_bfloat16_weights():
    module = _randomize(torch.nn.MultiheadAttention(D, H, batch_first=True), seed=7)
    state = {name: value.to(torch.bfloat16) for name, value in module.state_dict().items()}
    layer = convert.multi_head_attention_from_torch(state, H)
    expected = state["out_proj.weight"].float().numpy().T
    np.testing.assert_array_equal(to_numpy(layer.output_dense.kernel), expected)


# ----------------------------------------------------------------------------
# Encoder and decoder layers


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_encoder_layer(norm_first, activation):
    module = _randomize(torch.nn.TransformerEncoderLayer(
        d_model=D, nhead=H, dim_feedforward=F, dropout=0.0, batch_first=True,
        norm_first=norm_first, activation=activation), seed=8)
    layer = convert.transformer_encoder_layer_from_torch(
        module.state_dict(), H, norm_first=norm_first, activation=activation)
    assert isinstance(layer, keras_attn.TransformerEncoderLayer)
    assert (layer.intermediate_dim, layer.normalize_first) == (F, norm_first)

    x = randn(rng(9), B, T, D)
    with torch.no_grad():
        expected = module(_torch(x)).numpy()
    assert_close(layer(x), expected, what="no mask")

    # Padding: compare the real positions only (torch may zero the padded ones).
    torch_mask, keep = _key_padding([T, 3], T)
    with torch.no_grad():
        expected = module(_torch(x), src_key_padding_mask=torch_mask).numpy()
    actual = to_numpy(layer(x, padding_mask=keep))
    assert_close(actual[keep], expected[keep], what="padding")


def test_transformer_encoder_layer_causal():
    module = _randomize(torch.nn.TransformerEncoderLayer(
        D, H, F, dropout=0.0, batch_first=True), seed=10)
    layer = convert.transformer_encoder_layer_from_torch(module, H, layer_norm_eps=1e-6)
    assert layer.layer_norm_epsilon == 1e-6
    module.norm1.eps = module.norm2.eps = 1e-6
    x = randn(rng(11), B, T, D)
    with torch.no_grad():
        expected = module(_torch(x), src_mask=torch.nn.Transformer.generate_square_subsequent_mask(T),
                          is_causal=True).numpy()
    assert_close(layer(x, use_causal_mask=True), expected)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_decoder_layer(norm_first, activation):
    module = _randomize(torch.nn.TransformerDecoderLayer(
        d_model=D, nhead=H, dim_feedforward=F, dropout=0.0, batch_first=True,
        norm_first=norm_first, activation=activation), seed=12)
    layer = convert.transformer_decoder_layer_from_torch(
        module.state_dict(), H, norm_first=norm_first, activation=activation)
    assert isinstance(layer, keras_attn.TransformerDecoderLayer) and layer.has_memory

    g = rng(13)
    x, memory = randn(g, B, T, D), randn(g, B, S, D)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(T)
    torch_memory_mask, memory_keep = _key_padding([S, 4], S)
    with torch.no_grad():
        expected = module(_torch(x), _torch(memory), tgt_mask=causal, tgt_is_causal=True).numpy()
        expected_padded = module(_torch(x), _torch(memory), tgt_mask=causal, tgt_is_causal=True,
                                 memory_key_padding_mask=torch_memory_mask).numpy()
    assert_close(layer(x, memory=memory), expected, what="causal")
    assert_close(layer(x, memory=memory, memory_padding_mask=memory_keep), expected_padded,
                 what="memory padding")


# ----------------------------------------------------------------------------
# Errors: raised before any weight is assigned, naming the entry


def _mha_state(**options):
    return dict(torch.nn.MultiheadAttention(D, H, batch_first=True, **options).state_dict())


def _encoder_state():
    return dict(torch.nn.TransformerEncoderLayer(D, H, F, batch_first=True).state_dict())


def test_error_missing_key():
    state = _encoder_state()
    del state["self_attn.in_proj_weight"]
    with pytest.raises(ValueError, match=r"state_dict is missing 'self_attn\.in_proj_weight'"):
        convert.transformer_encoder_layer_from_torch(state, H)
    state = _mha_state()
    del state["out_proj.weight"]
    with pytest.raises(ValueError, match=r"missing 'out_proj\.weight'"):
        convert.multi_head_attention_from_torch(state, H)


def test_error_missing_key_names_the_prefix():
    state = {"block." + k: v for k, v in _encoder_state().items()}
    del state["block.linear2.bias"]
    with pytest.raises(ValueError, match=r"missing 'block\.linear2\.bias'"):
        convert.transformer_encoder_layer_from_torch(state, H, prefix="block.")


def test_error_mis_shaped_entry():
    state = _encoder_state()
    state["linear1.weight"] = state["linear1.weight"].T
    with pytest.raises(ValueError, match=re.escape(
            "'linear1.weight' must have shape (F, D) = (16, 8). Received: shape (8, 16)")):
        convert.transformer_encoder_layer_from_torch(state, H)
    state = _mha_state()
    state["in_proj_bias"] = state["in_proj_bias"][:D]
    with pytest.raises(ValueError, match=re.escape("'in_proj_bias' must have shape (3D,) = (24,)")):
        convert.multi_head_attention_from_torch(state, H)


def test_error_bias_k():
    with pytest.raises(ValueError, match="bias_k"):
        convert.multi_head_attention_from_torch(_mha_state(add_bias_kv=True), H)


def test_error_unexpected_key():
    state = _mha_state()
    state["extra.weight"] = torch.zeros(2)
    with pytest.raises(ValueError, match=r"unexpected entries 'extra\.weight'"):
        convert.multi_head_attention_from_torch(state, H)


def test_error_torch_bias_false_transformer():
    state = dict(torch.nn.TransformerEncoderLayer(D, H, F, batch_first=True, bias=False).state_dict())
    with pytest.raises(ValueError, match=r"missing 'linear1\.bias'.*bias=False"):
        convert.transformer_encoder_layer_from_torch(state, H)


def test_error_heads_do_not_divide():
    with pytest.raises(ValueError, match="num_heads"):
        convert.multi_head_attention_from_torch(_mha_state(), 3)


def test_error_memory_dim_and_derived_kwargs():
    state = dict(torch.nn.TransformerDecoderLayer(D, H, F, batch_first=True).state_dict())
    with pytest.raises(ValueError, match="memory_dim"):
        convert.transformer_decoder_layer_from_torch(state, H, memory_dim=5)
    with pytest.raises(ValueError, match="intermediate_dim"):
        convert.transformer_decoder_layer_from_torch(state, H, intermediate_dim=4)
    with pytest.raises(ValueError, match="activation"):
        convert.transformer_decoder_layer_from_torch(state, H, activation="silu")


def test_error_in_the_last_entry():
    """Every entry is checked, up to the last norm."""
    state = _encoder_state()
    state["norm2.bias"] = torch.zeros(D + 1)
    with pytest.raises(ValueError, match=r"'norm2\.bias' must have shape \(D,\) = \(8,\)"):
        convert.transformer_encoder_layer_from_torch(state, H)
