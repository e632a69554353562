"""`keras_attn.convert.multi_head_latent_attention_from_transformers` against transformers'
`DeepseekV3Attention` (random weights std 0.35, float32, eager attention), and the
deepseek_v3 family's refusals.

Needs torch and transformers (skipped elsewhere; tests/convert/test_latent_attention_fixture.py
checks the stored conversion on every backend).
"""

import keras
import numpy as np
import pytest

from keras_attn import convert, observe_paths
from keras_attn.convert import families

from .. import latent_cases as lc

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def converted():
    cache = {}

    def get(name):
        if name not in cache:
            config, attention = lc.build_hf(name)
            x = lc.inputs()
            cache[name] = (config, attention, x, lc.hf_output(config, attention, x),
                           convert.multi_head_latent_attention_from_transformers(attention, config))
        return cache[name]

    return get


@pytest.mark.parametrize("name", sorted(lc.CASES))
def test_the_converted_layer_matches_transformers(converted, name):
    config, _, x, expected, layer = converted(name)
    with observe_paths() as taken:
        out = keras.ops.convert_to_numpy(layer(x, use_causal_mask=True))
    assert taken["latent_expanded"] == 1
    error = lc.relative_error(out, expected)
    assert error <= lc.TOLERANCE, f"{name}: relative error {error:.3g}"


@pytest.mark.parametrize("name", sorted(lc.CASES))
def test_cached_absorbed_decoding_matches_transformers(converted, name):
    """A prefill of 5, then one token per call, all in the absorbed form (`decode="auto"`
    absorbs calls of up to 8 queries over a cache): transformers' rows."""
    _, _, x, expected, layer = converted(name)
    cache = layer.empty_cache(lc.B, lc.T)
    rows = []
    with observe_paths() as taken:
        for start, stop in [(0, 5)] + [(t, t + 1) for t in range(5, lc.T)]:
            out, cache = layer(x[:, start:stop], use_causal_mask=True, cache=cache,
                               cache_update_index=start)
            rows.append(keras.ops.convert_to_numpy(out))
    assert taken["latent_absorbed"] == lc.T - 4 and taken["latent_expanded"] == 0, dict(taken)
    assert lc.relative_error(np.concatenate(rows, 1), expected) <= lc.TOLERANCE


@pytest.mark.parametrize("ablation", lc.ABLATIONS)
def test_ablations_move_the_output_far_past_the_tolerance(converted, ablation):
    _, _, x, expected, layer = converted(lc.FIXTURE)
    wrong = keras.ops.convert_to_numpy(lc.ablate(layer, ablation)(x, use_causal_mask=True))
    assert lc.relative_error(wrong, expected) > 100 * lc.TOLERANCE, ablation


def test_a_state_dict_of_numpy_arrays_and_a_dict_config(converted):
    config, attention, x, expected, _ = converted(lc.FIXTURE)
    state = {k: v.numpy() for k, v in attention.state_dict().items()}
    layer = convert.multi_head_latent_attention_from_transformers(state, config.to_dict(), 1)
    out = keras.ops.convert_to_numpy(layer(x, use_causal_mask=True))
    assert lc.relative_error(out, expected) <= lc.TOLERANCE


def test_the_yarn_scale_is_mscale_squared(converted):
    config, attention, _, _, layer = converted(lc.FIXTURE)
    assert layer.scale == pytest.approx(attention.scaling, rel=1e-12)
    assert layer.scale != pytest.approx(10 ** -0.5)  # qk_head_dim 10, mscale(8, 1) ** 2 > 1


def test_weights_disagreeing_with_the_config_are_refused_by_field(converted):
    config, attention, _, _, _ = converted(lc.FIXTURE)
    state = dict(attention.state_dict())
    wrong = dict(config.to_dict(), kv_lora_rank=7)
    with pytest.raises(ValueError, match=r"kv_lora_rank=7.*kv_a_proj_with_mqa.weight"):
        convert.multi_head_latent_attention_from_transformers(state, wrong)
    with pytest.raises(ValueError, match="q_proj.weight"):
        convert.multi_head_latent_attention_from_transformers(
            state, dict(config.to_dict(), q_lora_rank=None))
    with pytest.raises(ValueError, match="attention_bias=False.*o_proj.bias"):
        convert.multi_head_latent_attention_from_transformers(
            {**state, "o_proj.bias": torch.zeros(lc.D)}, config)
    with pytest.raises(ValueError, match="unexpected entries.*extra"):
        convert.multi_head_latent_attention_from_transformers(
            {**state, "extra": torch.zeros(1)}, config)
    with pytest.raises(ValueError, match="layer_index"):
        convert.multi_head_latent_attention_from_transformers(state, config, 2)


@pytest.mark.parametrize("changes, field", [
    ({"num_key_value_heads": 2}, "num_key_value_heads"),
    ({"num_key_value_heads": 128}, "num_key_value_heads"),  # the class default, H = 4
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}, "rope_type"),
    ({"rope_interleave": "yes"}, "rope_interleave"),
    ({"qk_head_dim": 11}, "qk_head_dim"),
    ({"pretraining_tp": 2}, "pretraining_tp"),
    ({"a_new_field": 1}, "a_new_field"),
])
def test_fields_it_cannot_reproduce_are_refused_by_name(changes, field):
    config = dict(lc.skip_without("DeepseekV3Config")(**lc.config_dict(lc.FIXTURE)).to_dict(), **changes)
    with pytest.raises(ValueError, match=rf"`{field}`|{field}"):
        convert.multi_head_latent_attention_from_transformers({}, config)


def test_the_whole_model_converts_and_the_attention_converter_says_which_one():
    """Issue 34: the whole model converts (tests/convert/test_families.py compares it with
    transformers); the MultiHeadAttention converter refuses the latent attention by name."""
    config = lc.skip_without("DeepseekV3Config")(**lc.config_dict(lc.FIXTURE))
    with pytest.raises(ValueError, match=r"`kv_lora_rank`.*multi_head_latent_attention"):
        convert.multi_head_attention_from_transformers({}, config)
    with pytest.raises(ValueError, match=r"model\.embed_tokens\.weight"):  # the weights' turn
        convert.causal_lm_from_transformers(config, {})


def test_families_without_latent_attention_and_the_sparse_deepseeks_are_refused():
    llama = transformers.LlamaConfig(hidden_size=8, num_attention_heads=2, num_hidden_layers=1,
                                     intermediate_size=8, vocab_size=8)
    with pytest.raises(ValueError, match="model_type.*multi_head_attention_from_transformers"):
        convert.multi_head_latent_attention_from_transformers({}, llama)
    for model_type, words in (("deepseek_v32", "not prefix-consistent"),
                              ("deepseek_v4", "compressed sparse")):
        with pytest.raises(ValueError, match=rf"{words}.*Received: model_type='{model_type}'"):
            convert.causal_lm_from_transformers({"model_type": model_type}, {})
        with pytest.raises(ValueError, match=words):
            convert.multi_head_latent_attention_from_transformers({}, {"model_type": model_type})
    assert "deepseek_v32" not in families.model_types()


def test_the_family_table_classifies_every_field_of_the_default_config():
    table = convert.family_table()["deepseek_v3"]
    config = lc.skip_without("DeepseekV3Config")().to_dict()
    unknown = set(config) - set(table["read"]) - set(table["neutral"]) - set(table["ignored"])
    assert not unknown
    # DeepSeek V3's real attention (the defaults: H=128, r=512).
    _, hidden, arguments = families.family("deepseek_v3").latent_attention(config)
    assert hidden == 7168 and arguments["num_heads"] == 128 and arguments["kv_lora_rank"] == 512
