"""The family registry: one module per `model_type`, none importing another's."""

import ast
import pathlib

import keras
import numpy as np
import pytest

from keras_attn.convert import families
from keras_attn.convert.transformers import causal_lm_from_transformers

FOLDER = pathlib.Path(families.__file__).parent
TINY = dict(vocab_size=16, hidden_size=8, intermediate_size=12, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=1)


def test_every_model_type_has_its_module():
    for name in families.model_types():
        module = families.family(name)
        assert module.MODEL_TYPE == name and callable(module.spec)
        assert set(module.FIELDS) <= {"read", "neutral", "ignored"}


def test_each_family_registers_its_classes_under_one_prefix_of_its_own():
    prefixes = {}
    for name in families.model_types():
        module = families.family(name)
        assert module.ARCHITECTURES and all(isinstance(a, str) for a in module.ARCHITECTURES)
        own = {families.class_prefix(a) for a in module.ARCHITECTURES}
        assert len(own) == 1 and None not in own, (name, own)
        prefixes.setdefault(own.pop(), []).append(name)
    assert all(len(names) == 1 for names in prefixes.values()), prefixes
    assert families.class_prefix("GPT2LMHeadModel") == "GPT2"
    assert families.class_prefix("Gemma3TextModel") == "Gemma3"
    assert families.class_prefix("LLaMAForCausalLM") == "LLaMA"  # no registered family's
    assert families.class_prefix("Model") is None and families.class_prefix("Foo") is None


@pytest.mark.parametrize("model_type, architectures, other", [
    ("llama", ["Gemma3ForCausalLM"], "gemma3_text"),
    ("gemma3_text", ["LlamaForCausalLM"], "llama"),  # the other direction
    ("qwen3", ["Qwen3MoeForCausalLM"], "qwen3_moe"),  # a prefix of the other's prefix
    ("qwen3_moe", ["Qwen3ForCausalLM"], "qwen3"),
    ("gpt2", ["GPT2LMHeadModel", "MistralModel"], "mistral"),  # any entry of the list
])
def test_architectures_of_another_family_are_refused_naming_both_fields(
        model_type, architectures, other):
    config = {"model_type": model_type, **TINY, "architectures": architectures}
    with pytest.raises(ValueError, match=rf"`architectures` and `model_type` disagree.*"
                                         rf"model_type '{other}', not of '{model_type}'.*"
                                         rf"Received: architectures=.*model_type="):
        causal_lm_from_transformers(config, {})


@pytest.mark.parametrize("architectures", [
    None, [], ["LlamaForCausalLM"], ["LlamaModel"], ["LlamaForSequenceClassification"],
    ["LLaMAForCausalLM"], ["MyLlamaVariant"]])
def test_architectures_of_the_family_or_of_none_are_metadata(architectures):
    from keras_attn.convert._transformers_config import read_config

    config = {"model_type": "llama", **TINY, "architectures": architectures}
    assert read_config(config).family == "llama"


def test_architectures_must_be_a_list_of_names():
    with pytest.raises(ValueError, match=r"`architectures`.*Received: architectures="
                                         r"'LlamaForCausalLM'"):
        causal_lm_from_transformers({"model_type": "llama", **TINY,
                                     "architectures": "LlamaForCausalLM"}, {})


def test_an_unknown_model_type_is_refused_by_name():
    with pytest.raises(ValueError, match=r"model_type.*Received: model_type='bert'"):
        families.family("bert")
    with pytest.raises(ValueError, match="model_type"):
        causal_lm_from_transformers({"model_type": "bert"}, {})


def test_no_family_module_imports_another():
    names = set(families.model_types())
    for path in FOLDER.glob("*.py"):
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported |= {node.module.rsplit(".", 1)[-1]} | {a.name for a in node.names}
            elif isinstance(node, ast.Import):
                imported |= {a.name.rsplit(".", 1)[-1] for a in node.names}
        others = (imported & names) - {path.stem}
        assert not others, f"{path.name} imports the family module(s) {sorted(others)}"


def test_a_field_a_family_cannot_reproduce_is_refused_by_name():
    with pytest.raises(ValueError, match=r"rope_parameters\['rope_type'\].*dynamic"):
        causal_lm_from_transformers(
            {"model_type": "phi3", **TINY,
             "rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4}}, {})
    with pytest.raises(ValueError, match=r"no_rope_layers"):
        causal_lm_from_transformers({"model_type": "smollm3", **TINY, "no_rope_layers": [2]}, {})
    with pytest.raises(ValueError, match=r"unknown.*Received: rms_norm_eps=1e-06"):
        causal_lm_from_transformers({"model_type": "starcoder2", **TINY, "rms_norm_eps": 1e-6}, {})


@pytest.mark.parametrize("config, field", [
    ({"model_type": "phi3", "rope_parameters": "x"}, "rope_parameters"),
    # One layer: two layer types, with and without a window (an IndexError before).
    ({"model_type": "smollm3", "layer_types": ["full_attention"] * 2}, "layer_types"),
    ({"model_type": "smollm3", "use_sliding_window": True, "sliding_window": 4,
      "layer_types": ["sliding_attention"] * 2}, "layer_types"),
    # Sliding layers while use_sliding_window is off: transformers' attention drops the
    # window there but its mask keeps it; refused rather than guessed.
    ({"model_type": "smollm3", "layer_types": ["sliding_attention"]}, "sliding_window"),
    ({"model_type": "llama", "rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4,
                                                 "factor": 8.0}},
     r"rope_parameters\['low_freq_factor'\]"),
    # Llama's modeling rotates the whole head: a partial factor there is refused.
    ({"model_type": "llama", "rope_parameters": {"rope_theta": 1e4,
                                                 "partial_rotary_factor": 0.5}},
     r"rope_parameters\['partial_rotary_factor'\]"),
])
def test_malformed_configs_are_refused_by_name(config, field):
    with pytest.raises(ValueError, match=rf"config field `{field}"):
        causal_lm_from_transformers({**TINY, **config}, {})


def test_phi3s_fused_projections_are_cross_checked_against_the_config():
    g = np.random.default_rng(0)
    config = {"model_type": "phi3", **TINY, "tie_word_embeddings": True}
    d = 4  # hidden_size / num_attention_heads
    state = {"model.embed_tokens.weight": g.normal(size=(16, 8)),
             "model.norm.weight": np.ones(8),
             "model.layers.0.input_layernorm.weight": np.ones(8),
             "model.layers.0.post_attention_layernorm.weight": np.ones(8),
             "model.layers.0.self_attn.qkv_proj.weight": g.normal(size=(2 * d + 2 * d + 1, 8)),
             "model.layers.0.self_attn.o_proj.weight": g.normal(size=(8, 2 * d)),
             "model.layers.0.mlp.gate_up_proj.weight": g.normal(size=(24, 8)),
             "model.layers.0.mlp.down_proj.weight": g.normal(size=(8, 12))}
    with pytest.raises(ValueError, match=r"num_key_value_heads=1.*qkv_proj.*\(17, 8\)"):
        causal_lm_from_transformers(config, state)
    state["model.layers.0.self_attn.qkv_proj.weight"] = g.normal(size=(4 * d, 8))
    lm = causal_lm_from_transformers(config, state)  # the right rows: split and loaded
    ff = lm.blocks[0].feed_forward
    fused = state["model.layers.0.mlp.gate_up_proj.weight"]  # (2F, D): gate rows, then up
    np.testing.assert_allclose(keras.ops.convert_to_numpy(ff.gate_dense.kernel), fused[:12].T,
                               rtol=1e-6)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(ff.intermediate_dense.kernel),
                               fused[12:].T, rtol=1e-6)


def test_ministral3_reads_the_query_scale_from_rope_parameters():
    from keras_attn.convert._transformers_config import read_config

    rope = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 16.0,
            "original_max_position_embeddings": 16384, "max_position_embeddings": 262144,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
            "llama_4_scaling_beta": 0.1}
    config = {"model_type": "ministral3", **TINY, "head_dim": 4}
    # Without rope_parameters: Ministral3Config's default (yarn, n = 16384, beta 0.1).
    for given in ({}, {"rope_parameters": rope}):
        attention = read_config({**config, **given}).layers[0].attention
        assert (attention["query_scale_beta"], attention["query_scale_length"]) == (0.1, 16384)
        assert attention["rope_type"] == "yarn"
        assert attention["rope_original_max_position_embeddings"] == 16384
    # beta 0: the scale is 1 everywhere, no option; n is not RoPE's for the default type.
    plain = {"rope_type": "default", "rope_theta": 1e4, "original_max_position_embeddings": 8,
             "llama_4_scaling_beta": 0.0}
    attention = read_config({**config, "rope_parameters": plain}).layers[0].attention
    assert "query_scale_beta" not in attention and attention["rope_type"] == "default"
    assert "rope_original_max_position_embeddings" not in attention
