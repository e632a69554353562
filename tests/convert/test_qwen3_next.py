"""Qwen3-Next (`qwen3_next`, issue 35) beyond tests/convert/test_families.py's comparison
with transformers: the case's routers are far from ties, the fused `in_proj_qkvz` /
`in_proj_ba` split per key head as transformers' `fix_query_key_value_ordering` reads
them, generate's cached greedy tokens are the uncached forwards' argmax (the chunked rule,
the recurrent one, the KV cache and the mixtures observed running), the layer converters,
and a config.json with numpy weights.

Torch and transformers only (a tiny random transformers model, tests/family_cases.py).
"""

import json

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn import convert
from keras_attn.convert import families
from keras_attn.convert._transformers_config import read_config

from .. import family_cases as fc
from ..helpers import assert_greedy_over_uncached

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

NAME = "qwen3_next"


@pytest.fixture(scope="module")
def converted():
    model = fc.build_hf(NAME)
    return model, fc.token_ids(NAME), convert.causal_lm_from_transformers(model)


def test_routers_are_far_from_ties(converted):
    """Every router's second and third logits differ by more than 1e-2 on the case's
    tokens (the logits' error is ~1e-5): no expert choice can flip."""
    model, ids, _ = converted
    margins = []

    def record(module, inputs, output):
        top = torch.sort(output[0].float(), dim=-1, descending=True).values
        margins.append(float((top[:, 1] - top[:, 2]).min()))

    hooks = [layer.mlp.gate.register_forward_hook(record) for layer in model.model.layers
             if hasattr(layer.mlp, "gate")]
    with torch.no_grad():
        model(torch.from_numpy(ids).long())
    for hook in hooks:
        hook.remove()
    assert len(margins) == 3 and min(margins) > 1e-2, margins


def test_fused_projections_split_as_transformers_orders_them(converted):
    """in_proj_qkvz / in_proj_ba's rows, split by the family, give transformers' q, k, v,
    z, b and a (its `fix_query_key_value_ordering`) for the same input."""
    model, _, _ = converted
    hf = model.model.layers[0].linear_attn
    x = torch.randn(1, 3, fc.D, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        q, k, v, z, b, a = hf.fix_query_key_value_ordering(hf.in_proj_qkvz(x), hf.in_proj_ba(x))
    entries = {k_: w.detach().numpy() for k_, w in hf.state_dict().items()}
    spec = read_config(model.config.to_dict())
    split = families.family(NAME).canonical_state_dict(entries, spec)
    xs = x.numpy()[0]
    qkv = xs @ split["in_proj_qkv.weight"].T
    H_k, d_k = hf.num_k_heads, hf.head_k_dim
    for ours, theirs in [(qkv[:, :H_k * d_k], q), (qkv[:, H_k * d_k:2 * H_k * d_k], k),
                         (qkv[:, 2 * H_k * d_k:], v), (xs @ split["in_proj_z.weight"].T, z),
                         (xs @ split["in_proj_b.weight"].T, b),
                         (xs @ split["in_proj_a.weight"].T, a)]:
        np.testing.assert_allclose(ours, theirs.numpy()[0].reshape(3, -1), atol=1e-5)


def test_in_proj_ba_rows_are_cross_checked(converted):
    model, _, _ = converted
    config = json.loads(model.config.to_json_string())
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    key = "model.layers.1.linear_attn.in_proj_ba.weight"
    state[key] = state[key][:-2]
    with pytest.raises(ValueError, match=r"linear_num_value_heads=4.*\(2 H = 8\).*"
                                         r"in_proj_ba\.weight.*\(6, 64\)"):
        convert.causal_lm_from_transformers(config, state)


def test_generate_is_greedy_over_the_uncached_forwards(converted):
    _, ids, lm = converted
    assert [type(b.self_attention).__name__ for b in lm.blocks] == (
        ["GatedDeltaNet"] * 3 + ["MultiHeadAttention"])
    assert [isinstance(b.feed_forward, keras_attn.MixtureOfExperts) for b in lm.blocks] == [
        False, True, True, True]  # layer 0 in mlp_only_layers
    with keras_attn.observe_paths() as paths:
        tokens = keras.ops.convert_to_numpy(lm.generate(ids[:, :fc.P], max_length=fc.P + fc.NEW))
    assert paths["chunked"] == 3 and paths["recurrent"] >= 3 and paths["cached"], paths
    assert paths.get("moe_dense", 0) + paths.get("moe_sparse", 0) >= 3, paths
    assert_greedy_over_uncached(lm, tokens, fc.P)


def test_layer_converters_build_the_models_blocks(converted):
    model, _, lm = converted
    x = np.random.default_rng(0).standard_normal((fc.B, 5, fc.D)).astype("float32")
    for i, hf_layer in enumerate(model.model.layers):
        block = convert.transformer_decoder_layer_from_transformers(hf_layer, model.config, i)
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(block(x)),
                                      keras.ops.convert_to_numpy(lm.blocks[i](x)))
    attention = convert.multi_head_attention_from_transformers(
        model.model.layers[3].self_attn, model.config, layer_index=3)
    assert attention.use_gate
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(attention(x, use_causal_mask=True)),
        keras.ops.convert_to_numpy(lm.blocks[3].self_attention(x, use_causal_mask=True)))


def test_config_json_and_numpy_state_dict(converted):
    model, ids, lm = converted
    config = json.loads(model.config.to_json_string())
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    again = convert.causal_lm_from_transformers(config, state)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(again(ids)),
                                  keras.ops.convert_to_numpy(lm(ids)))
    # Without layer_types, transformers' derivation (every 4th layer full) is read; the
    # released config.json's older RoPE fields (rope_theta, a top-level
    # partial_rotary_factor, rope_scaling null) are read as rope_parameters.
    del config["layer_types"]
    rope = config.pop("rope_parameters")
    config.update(rope_theta=rope["rope_theta"], rope_scaling=None,
                  partial_rotary_factor=rope["partial_rotary_factor"])
    derived = convert.causal_lm_from_transformers(config, state)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(derived(ids)),
                                  keras.ops.convert_to_numpy(lm(ids)))
