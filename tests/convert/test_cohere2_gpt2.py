"""cohere2 and gpt2 beyond the family cases: config variants against transformers, the
layer converters, the weights cross-checked (torch + transformers, live)."""

import json

import numpy as np
import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import keras  # noqa: E402

from keras_attn import convert  # noqa: E402

from .. import family_cases as fc  # noqa: E402


def _logits(lm, ids):
    return keras.ops.convert_to_numpy(lm(ids))


@pytest.mark.parametrize("overrides", [{"scale_attn_by_inverse_layer_idx": True},
                                       {"scale_attn_weights": False}])
def test_gpt2_attention_scales_match_transformers(overrides):
    # Four blocks of D=64: smaller, the inverse-layer scale moves the logits < 1e-2.
    model = fc.build_hf("gpt2", num_hidden_layers=4, **overrides)
    ids = fc.token_ids("gpt2")
    logits, _, _ = fc.hf_reference(model, ids, generate=False)
    lm = convert.causal_lm_from_transformers(model)
    assert fc.relative_error(_logits(lm, ids), logits) <= fc.TOLERANCE
    # Ablation: the default scale (the field ignored) is far away.
    plain = convert.causal_lm_from_transformers(
        fc.build_hf("gpt2", num_hidden_layers=4))
    assert fc.relative_error(_logits(plain, ids), logits) > 100 * fc.TOLERANCE


@pytest.mark.parametrize("name", ["gpt2", "cohere2"])
def test_layer_converters_build_the_models_blocks(name):
    model = fc.build_hf(name, small=True)
    lm = convert.causal_lm_from_transformers(model)
    layers = model.transformer.h if name == "gpt2" else model.model.layers
    x = np.random.default_rng(0).standard_normal((fc.B, 5, 16)).astype("float32")
    for i, hf_layer in enumerate(layers):
        block = convert.transformer_decoder_layer_from_transformers(hf_layer, model.config, i)
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(block(x)),
                                      keras.ops.convert_to_numpy(lm.blocks[i](x)))
        attention = hf_layer.attn if name == "gpt2" else hf_layer.self_attn
        attention = convert.multi_head_attention_from_transformers(
            attention.state_dict(), model.config, layer_index=i)
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(attention(x, use_causal_mask=True)),
            keras.ops.convert_to_numpy(lm.blocks[i].self_attention(x, use_causal_mask=True)))


def test_weights_are_cross_checked():
    model = fc.build_hf("gpt2", small=True)
    config = json.loads(model.config.to_json_string())
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    bad = dict(state, **{"transformer.h.0.attn.c_attn.weight": np.zeros((16, 32), "float32")})
    with pytest.raises(ValueError, match=r"n_embd=16.*c_attn.weight"):
        convert.causal_lm_from_transformers(config, bad)
    short = dict(state, **{"transformer.wpe.weight": state["transformer.wpe.weight"][:8]})
    with pytest.raises(ValueError, match=r"max_position_embeddings=64.*embed_positions"):
        convert.causal_lm_from_transformers(config, short)
    model = fc.build_hf("cohere2", small=True)
    config = json.loads(model.config.to_json_string())
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    state["model.norm.bias"] = np.zeros((16,), "float32")
    with pytest.raises(ValueError, match=r"no bias.*model.norm.bias"):
        convert.causal_lm_from_transformers(config, state)


@pytest.mark.parametrize("changes, field", [
    ({"activation_function": "relu"}, "activation_function"),
    ({"n_head": 3}, "n_head"),
    ({"some_new_field": 1}, "some_new_field"),
])
def test_gpt2_refuses_fields_by_name(changes, field):
    config = transformers.GPT2Config(**fc.config_kwargs("gpt2", small=True))
    config = {**json.loads(config.to_json_string()), **changes}
    with pytest.raises(ValueError, match=field):
        convert.causal_lm_from_transformers(config, {})
