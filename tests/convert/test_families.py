"""`keras_attn.convert.causal_lm_from_transformers` against transformers' own models, per family.

Needs torch and `transformers`: the torch tox environment installs both (`transformers` is a
test-only dependency there); elsewhere the whole module is skipped, as tests/convert/test_convert_llama.py
(tests/convert/test_family_fixtures.py checks the same models on every backend from stored outputs).
The models are built from tiny random configs (tests/family_cases.py): nothing is downloaded.
"""

import json

import keras
import numpy as np
import pytest

from keras_attn import CausalLM, convert, observe_paths
from keras_attn.convert import _transformers_config as tables
from keras_attn.layers._common import gelu_approximate
from keras_attn.layers.causal_lm import traced_step_of

from .. import family_cases as fc

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

NAMES = sorted(fc.CASES)
# The HF greedy tokens are compared exactly: every step's top-1 must lead the top-2 by far
# more than the logits' error (~1e-5 absolute here), or a near-tie could flip a token.
MIN_MARGIN = 1e-3


@pytest.fixture(scope="module")
def converted():
    """name -> (hf model, ids, hf logits, hf tokens, margin, CausalLM), built once."""
    cache = {}

    def get(name):
        if name not in cache:
            model = fc.build_hf(name)
            ids = fc.token_ids(name)
            logits, tokens, margin = fc.hf_reference(model, ids)
            cache[name] = (model, ids, logits, tokens, margin,
                           convert.causal_lm_from_transformers(model))
        return cache[name]

    return get


def _logits(lm, ids):
    return keras.ops.convert_to_numpy(lm(ids))


@pytest.mark.parametrize("name", NAMES)
def test_logits_and_greedy_tokens_match_transformers(converted, name):
    _, ids, logits, tokens, margin, lm = converted(name)
    error = fc.relative_error(_logits(lm, ids), logits)
    assert error <= fc.TOLERANCE, f"{name}: relative error {error:.3g}"
    assert margin > MIN_MARGIN, f"{name}: greedy margin {margin:.3g} (pick another seed)"
    ours = keras.ops.convert_to_numpy(lm.generate(ids[:, :fc.P], max_length=fc.P + fc.NEW))
    np.testing.assert_array_equal(ours, tokens)
    if keras.backend.backend() == "torch":  # decoded through the traced step, none refused
        step = traced_step_of(lm)
        assert step.graph_calls > 0 and None not in step.graphs.values()


@pytest.mark.parametrize("name", NAMES)
def test_ablation_moves_the_logits(converted, name):
    """Each family's ablation (CASES) is far beyond the tolerance: the comparison can fail."""
    _, ids, logits, _, _, lm = converted(name)
    error = fc.relative_error(_logits(fc.ablate(lm, name), ids), logits)
    assert error > 100 * fc.TOLERANCE, f"{name}: ablation {fc.CASES[name][3][0]!r}: {error:.3g}"


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe", "gpt_oss", "llama4_text",
                                  "gemma4_text_moe"])
def test_mixtures_sparse_path_matches_transformers(converted, name):
    """The cases' 4 experts take the dense path ("auto"); the sparse one (what gpt-oss's
    32 and 128 experts take) gives transformers' logits too, observed running."""
    _, ids, logits, _, _, lm = converted(name)
    config = lm.get_config()
    for block in config["blocks"]:
        if block["config"].get("feed_forward") is not None:
            block["config"]["feed_forward"]["config"]["implementation"] = "sparse"
    sparse = CausalLM.from_config(config)
    sparse.set_weights(lm.get_weights())
    with observe_paths() as taken:
        error = fc.relative_error(_logits(sparse, ids), logits)
    assert taken.get("moe_sparse", 0) > 0 and "moe_dense" not in taken, taken
    assert error <= fc.TOLERANCE, f"{name}: relative error {error:.3g}"


@pytest.mark.parametrize("name, overrides", [
    ("llama", {"attention_bias": True, "mlp_bias": True}),
    ("qwen3", {"attention_bias": True, "tie_word_embeddings": True}),
    ("gemma2", {"attention_bias": True, "attn_logit_softcapping": None,
                "final_logit_softcapping": None}),
    ("phi3", {"partial_rotary_factor": 0.5}),  # Phi-4-mini's partial rotary (0.75 there)
    ("qwen3_5_text", {"attention_bias": True}),  # the gate's bias: q_proj.bias's second rows
    # Ministral 3's query scale over default RoPE: n read for the scale alone.
    ("ministral3", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                        "original_max_position_embeddings": 4,
                                        "llama_4_scaling_beta": 0.3}}),
])
def test_config_variants_match_transformers(name, overrides):
    """Biases on every projection, a tied head, no soft-caps, partial rotary: the logits
    still match (and the 16 greedy tokens, for partial rotary, with its ablation)."""
    model = fc.build_hf(name, **overrides)
    ids = fc.token_ids(name)
    logits, tokens, margin = fc.hf_reference(model, ids, generate="partial_rotary_factor" in overrides)
    lm = convert.causal_lm_from_transformers(model)
    assert fc.relative_error(_logits(lm, ids), logits) <= fc.TOLERANCE
    if tokens is not None:
        assert margin > MIN_MARGIN
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(lm.generate(ids[:, :fc.P], max_length=fc.P + fc.NEW)),
            tokens)
        config = lm.get_config()
        for block in config["blocks"]:  # the ablation: RoPE over the whole head
            block["config"]["rope_partial_rotary_factor"] = 1.0
        whole = CausalLM.from_config(config)
        whole.set_weights(lm.get_weights())
        assert fc.relative_error(_logits(whole, ids), logits) > 100 * fc.TOLERANCE


@pytest.mark.parametrize("name", ["qwen2", "gemma2"])
def test_dict_config_and_numpy_state_dict(converted, name):
    """A config.json dict and a state dict of numpy arrays give the same model (no torch)."""
    model, ids, logits, _, _, lm = converted(name)
    config = json.loads(model.config.to_json_string())
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    again = convert.causal_lm_from_transformers(config, state)
    np.testing.assert_array_equal(_logits(again, ids), _logits(lm, ids))


@pytest.mark.parametrize("name", ["qwen2", "gemma3_text"])
def test_layer_converters(converted, name):
    """The layer-level converters build the whole model's blocks."""
    model, _, _, _, _, lm = converted(name)
    x = np.random.default_rng(0).standard_normal((fc.B, 5, fc.D)).astype("float32")
    for i, hf_layer in enumerate(model.model.layers):
        block = convert.transformer_decoder_layer_from_transformers(hf_layer, model.config, i)
        expected = lm.blocks[i]
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(block(x)),
                                      keras.ops.convert_to_numpy(expected(x)))
        attention = convert.multi_head_attention_from_transformers(
            hf_layer.self_attn.state_dict(), model.config, layer_index=i)
        assert attention.options == expected.self_attention.options
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(attention(x, use_causal_mask=True)),
            keras.ops.convert_to_numpy(expected.self_attention(x, use_causal_mask=True)))


@pytest.mark.parametrize("name", ["qwen2", "gemma2"])
def test_keras_round_trip(converted, tmp_path, name):
    _, ids, logits, tokens, _, lm = converted(name)
    path = str(tmp_path / f"{name}.keras")
    lm.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, CausalLM)
    np.testing.assert_array_equal(_logits(loaded, ids), _logits(lm, ids))
    ours = keras.ops.convert_to_numpy(loaded.generate(ids[:, :fc.P], max_length=fc.P + fc.NEW))
    np.testing.assert_array_equal(ours, tokens)


def _hf_config(name):
    return json.loads(fc.hf_config(name).to_json_string())


REFUSED = [
    ("llama", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}},
     "rope_type"),
    ("llama", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}, "rope_type"),
    ("llama", {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4,
                                   "low_freq_factor": 1.0}}, "low_freq_factor"),
    ("llama", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                   "partial_rotary_factor": 0.5}}, "partial_rotary_factor"),
    ("llama", {"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ("llama", {"hidden_act": "relu"}, "hidden_act"),
    ("llama", {"model_type": "bert"}, "model_type"),
    ("llama", {"some_new_field": 1}, "some_new_field"),
    ("llama", {"quantization_config": {"quant_method": "bitsandbytes"}}, "quantization_config"),
    ("llama", {"is_encoder_decoder": True}, "is_encoder_decoder"),
    # transformers 4's PretrainedConfig field that would describe a cross-attention.
    ("llama", {"cross_attention_hidden_size": 8}, "cross_attention_hidden_size"),
    ("mistral", {"layer_types": ["full_attention"] * 2}, "layer_types"),
    ("qwen2", {"layer_types": ["full_attention", "chunked_attention"]}, "layer_types"),
    ("qwen3", {"layer_types": ["sliding_attention"] * 2, "use_sliding_window": False},
     "sliding_window"),
    ("gemma2", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ("gemma2", {"hidden_activation": "relu"}, "hidden_activation"),
    ("gemma3_text", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ("gemma3_text", {"rope_parameters": {"full_attention": {"rope_type": "linear",
                                                            "rope_theta": 1e6}}},
     "rope_parameters['full_attention']['factor']"),
    ("llama", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0,
                                   "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 16}},
     "rope_parameters['low_freq_factor']"),
    ("gemma3_text", {"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
    ("gemma2", {"attn_logit_softcapping": -1.0}, "attn_logit_softcapping"),
    ("gemma3_text", {"rope_parameters": {"global": {"rope_type": "default",
                                                    "rope_theta": 1e6}}}, "rope_parameters"),
    # Ministral 3's query scale needs both of its keys (transformers' attention fails
    # without either) and a beta >= 0.
    ("ministral3", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 8.0,
                                        "original_max_position_embeddings": 4}},
     "rope_parameters['llama_4_scaling_beta']"),
    ("ministral3", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                        "llama_4_scaling_beta": 0.1}},
     "rope_parameters['original_max_position_embeddings']"),
    ("ministral3", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                        "original_max_position_embeddings": 4,
                                        "llama_4_scaling_beta": -0.1}},
     "rope_parameters['llama_4_scaling_beta']"),
    ("ministral3", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                        "original_max_position_embeddings": 4,
                                        "llama_4_scaling_beta": 0.1, "factor": 2.0}},
     "rope_parameters['factor']"),
    # Cohere 2's head width is D / H (transformers' config sets it so).
    ("cohere2", {"head_dim": 8}, "head_dim"),
    ("cohere2", {"layer_types": ["full_attention"]}, "layer_types"),
    # Issue 34: the mixtures' schedule and sizes.
    ("mixtral", {"num_experts_per_tok": 5}, "num_experts_per_tok"),
    ("qwen3_moe", {"mlp_only_layers": [2]}, "mlp_only_layers"),
    ("qwen3_moe", {"decoder_sparse_step": 0}, "decoder_sparse_step"),
    ("qwen3_moe", {"num_experts": 3, "num_local_experts": 4}, "num_experts"),
    ("qwen3_moe", {"norm_topk_prob": None}, "norm_topk_prob"),
    ("gpt_oss", {"num_experts_per_tok": 5}, "num_experts_per_tok"),
    ("gpt_oss", {"swiglu_limit": 0.0}, "swiglu_limit"),
    ("gpt_oss", {"swiglu_alpha": None}, "swiglu_alpha"),
    # The released gpt-oss checkpoints store the experts in MXFP4 (`*_blocks`, `*_scales`).
    ("gpt_oss", {"quantization_config": {"quant_method": "mxfp4"}}, "quantization_config"),
    # DeepSeek V3's router: the rule it reproduces, and groups that exist.
    ("deepseek_v3", {"topk_method": "greedy"}, "topk_method"),
    ("deepseek_v3", {"scoring_func": "softmax"}, "scoring_func"),
    ("deepseek_v3", {"n_group": 3}, "n_group"),
    ("deepseek_v3", {"n_group": 8}, "n_group"),  # groups of one expert: no top 2
    ("deepseek_v3", {"topk_group": 5}, "topk_group"),
    ("deepseek_v3", {"topk_group": 1, "num_experts_per_tok": 3}, "num_experts_per_tok"),
    ("deepseek_v3", {"n_shared_experts": 0}, "n_shared_experts"),
    ("deepseek_v3", {"first_k_dense_replace": -1}, "first_k_dense_replace"),
    ("deepseek_v3", {"norm_topk_prob": None}, "norm_topk_prob"),
    ("deepseek_v3", {"num_key_value_heads": 2}, "num_key_value_heads"),
    # Issue 35: Qwen 3.5's hybrid stack.
    ("qwen3_5_text", {"layer_types": ["linear_attention", "sliding_attention"] * 2},
     "layer_types"),
    ("qwen3_5_text", {"layer_types": ["linear_attention"] * 3}, "layer_types"),
    ("qwen3_5_text", {"hidden_act": "gelu"}, "hidden_act"),
    ("qwen3_5_text", {"linear_num_value_heads": 3}, "linear_num_value_heads"),
    ("qwen3_5_text", {"linear_conv_kernel_dim": 0}, "linear_conv_kernel_dim"),
    ("qwen3_5_text", {"attn_output_gate": False}, "attn_output_gate"),
    ("qwen3_5_text", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                          "partial_rotary_factor": 0.5,
                                          "mrope_section": "2,1,1"}},
     "rope_parameters['mrope_section']"),
    ("qwen3_5_text", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                          "partial_rotary_factor": 0.4375}},
     "rope_parameters"),
    # Qwen3-Next: the hybrid stack's and the mixture's fields.
    ("qwen3_next", {"layer_types": ["linear_attention", "sliding_attention"] * 2},
     "layer_types"),
    ("qwen3_next", {"hidden_act": "gelu"}, "hidden_act"),
    ("qwen3_next", {"linear_num_value_heads": 3}, "linear_num_value_heads"),
    ("qwen3_next", {"num_experts_per_tok": 5}, "num_experts_per_tok"),
    ("qwen3_next", {"num_experts": -1}, "num_experts"),
    ("qwen3_next", {"norm_topk_prob": None}, "norm_topk_prob"),
    ("qwen3_next", {"shared_expert_intermediate_size": 0}, "shared_expert_intermediate_size"),
    ("qwen3_next", {"mlp_only_layers": [4]}, "mlp_only_layers"),
    ("qwen3_next", {"decoder_sparse_step": 0}, "decoder_sparse_step"),
    ("qwen3_next", {"attn_output_gate": False}, "attn_output_gate"),
    # Gemma 4's mixture of experts (26B-A4B): its sizes.
    ("gemma4_text_moe", {"top_k_experts": 5}, "top_k_experts"),
    ("gemma4_text_moe", {"num_experts": None}, "num_experts"),
    ("gemma4_text_moe", {"moe_intermediate_size": 0}, "moe_intermediate_size"),
]


@pytest.mark.parametrize("name, changes, field", REFUSED,
                         ids=[f"{n}-{f}" for n, _, f in REFUSED])
def test_refused_fields(name, changes, field):
    config = _hf_config(name)
    if "rope_scaling" in config:  # a transformers 4 config: the RoPE under 4.x's names
        changes = fc.as_transformers_4(changes)
        field = field.replace("rope_parameters", "rope_scaling")
    config = {**config, **changes}
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
        convert.causal_lm_from_transformers(config, {})


CROSS = [
    ("qwen3", {"num_attention_heads": 2}, ["num_attention_heads=2", "q_proj.weight"]),
    ("qwen3", {"head_dim": 16}, ["head_dim=16", "q_proj.weight"]),
    ("llama", {"num_key_value_heads": 1}, ["num_key_value_heads=1", "k_proj.weight"]),
    ("llama", {"intermediate_size": 64}, ["intermediate_size=64", "gate_proj.weight"]),
    ("mistral", {"vocab_size": 100}, ["vocab_size=100", "embed_tokens.weight"]),
    ("qwen2", {"tie_word_embeddings": False, "drop": "lm_head.weight"},
     ["tie_word_embeddings=False", "lm_head.weight"]),
    ("llama", {"tie_word_embeddings": True}, ["tie_word_embeddings=True", "lm_head.weight"]),
    ("llama", {"attention_bias": True}, ["q_proj.bias"]),
    ("llama", {"num_hidden_layers": 1}, ["model.layers.1."]),
    ("mixtral", {"num_local_experts": 3}, ["num_experts=3", "mlp.gate.weight"]),
    ("qwen3_moe", {"moe_intermediate_size": 32}, ["moe_intermediate_size", "F=32", "gate_up_proj"]),
    ("qwen3_moe", {"mlp_only_layers": []}, ["model.layers.0.mlp.gate.weight"]),
    ("gpt_oss", {"intermediate_size": 32}, ["intermediate_size=32", "(E, D, 2F)",
                                            "mlp.experts.gate_up_proj"]),
    ("gpt_oss", {"num_local_experts": 3}, ["num_local_experts=3", "gate_up_proj"]),
    ("deepseek_v3", {"n_shared_experts": 2}, ["S=48", "shared_experts.gate_proj.weight"]),
    ("deepseek_v3", {"first_k_dense_replace": 0}, ["model.layers.0.mlp.gate.weight"]),
    ("deepseek_v3", {"kv_lora_rank": 8}, ["kv_lora_rank=8", "kv_a_proj_with_mqa.weight"]),
    ("deepseek_v3", {"drop": "model.layers.1.mlp.gate.e_score_correction_bias"},
     ["state_dict is missing", "model.layers.1.mlp.gate.e_score_correction_bias"]),
    ("qwen3_5_text", {"linear_num_value_heads": 8},
     ["linear_num_value_heads=8", "in_proj_qkv.weight"]),
    ("qwen3_5_text", {"linear_conv_kernel_dim": 3},
     ["linear_conv_kernel_dim=3", "conv1d.weight"]),
    ("qwen3_5_text", {"head_dim": 8}, ["head_dim=8", "a query and a gate per head",
                                       "q_proj.weight"]),
    ("qwen3_5_text", {"layer_types": ["full_attention"] + ["linear_attention"] * 3},
     ["model.layers.0.linear_attn"]),
    ("qwen3_next", {"linear_num_value_heads": 8},
     ["linear_num_value_heads=8", "in_proj_qkvz.weight"]),
    ("qwen3_next", {"linear_num_key_heads": 4},
     ["linear_num_key_heads=4", "H_k (2 d_k + 2 r d_v) = 160", "in_proj_qkvz.weight"]),
    ("qwen3_next", {"head_dim": 8}, ["head_dim=8", "a query and a gate per head",
                                     "q_proj.weight"]),
    ("qwen3_next", {"shared_expert_intermediate_size": 16},
     ["S=16", "shared_expert_intermediate_size", "mlp.shared_expert.gate_proj.weight"]),
    ("qwen3_next", {"moe_intermediate_size": 32}, ["F=32", "gate_up_proj"]),
    ("qwen3_next", {"mlp_only_layers": []}, ["model.layers.0.mlp.gate.weight"]),
    ("qwen3_next", {"layer_types": ["full_attention"] * 4}, ["model.layers.0.self_attn"]),
]


@pytest.mark.parametrize("name, changes, words", CROSS,
                         ids=[f"{n}-{next(iter(c))}" for n, c, _ in CROSS])
def test_config_is_cross_checked_against_the_weights(converted, name, changes, words):
    model = converted(name)[0]
    changes = dict(changes)
    state = dict(model.state_dict())
    state.pop(changes.pop("drop", None), None)  # an entry the config needs, removed
    config = {**json.loads(model.config.to_json_string()), **changes}
    if "num_hidden_layers" in changes:
        config.pop("layer_types", None)
    with pytest.raises(ValueError) as info:
        convert.causal_lm_from_transformers(config, state)
    for word in words:
        assert word in str(info.value), str(info.value)


@pytest.mark.parametrize("entry, flag", [("mlp.gate.bias", "use_router_bias"),
                                         ("mlp.experts.down_proj_bias", "use_expert_bias")])
def test_expert_biases_the_family_lacks_are_refused(converted, entry, flag):
    """Mixtral's experts have no biases: a state dict with one is refused, naming it."""
    model = converted("mixtral")[0]
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    state[f"model.layers.0.{entry}"] = np.zeros((4, fc.D) if "down" in entry else (4,))
    config = json.loads(model.config.to_json_string())
    with pytest.raises(ValueError, match=rf"{flag}=False.*model\.layers\.0\.{entry}"):
        convert.causal_lm_from_transformers(config, state)


def test_family_tables_classify_every_field_of_the_transformers_configs():
    """Every field of each family's default transformers config is read, neutral or ignored
    (transformers 4.x's too: its PretrainedConfig's generation defaults and legacy flags);
    the families the installed transformers lacks are left out."""
    table = tables.family_table()
    checked = []
    for name in NAMES:
        family = getattr(transformers, fc.CASES[name][0], None)
        if family is None:  # a family added after the installed transformers
            continue
        config = family().to_dict()
        entry = table[config["model_type"]]
        unknown = set(config) - set(entry["read"]) - set(entry["neutral"]) - set(entry["ignored"])
        assert not unknown, (name, unknown)
        checked.append(name)
    assert len(checked) >= 10, checked  # transformers 4.45 has 10 of the families


def test_layer_index_is_checked():
    with pytest.raises(ValueError, match="layer_index"):
        convert.transformer_decoder_layer_from_transformers({}, _hf_config("llama"), 2)


def test_gelu_approximate_serialises_by_name():
    config = keras.activations.serialize(gelu_approximate)
    assert keras.activations.get(config) is gelu_approximate
    x = np.linspace(-4, 4, 9).astype("float32")
    expected = torch.nn.functional.gelu(torch.from_numpy(x), approximate="tanh").numpy()
    np.testing.assert_allclose(keras.ops.convert_to_numpy(gelu_approximate(x)), expected,
                               atol=1e-6)


def test_family_architectures_are_transformers_class_names():
    """Each family's ARCHITECTURES are the installed transformers' `*ForCausalLM` and
    `*Model` classes of its model_type (the families it has)."""
    from transformers.models.auto import modeling_auto

    from keras_attn.convert import families

    checked = 0
    for model_type in families.model_types():
        causal = modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
        if causal is None:  # a family added after the installed transformers
            continue
        expected = (causal, modeling_auto.MODEL_MAPPING_NAMES[model_type])
        assert families.family(model_type).ARCHITECTURES == expected, model_type
        checked += 1
    assert checked >= 10, checked
