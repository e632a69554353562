"""Llama 4's text model (`llama4_text`, issue 34) beyond tests/convert/test_families.py's
comparison with transformers: the case's routers are far from ties, the converted layers'
options (NoPE / RoPE, chunks, L2 qk-norm, temperature), config variants against
transformers (explicit `moe_layers` and `no_rope_layers`, no qk-norm, no chunks, top-2,
llama3 RoPE), the weights' layout, and the fields refused by name.

Torch and transformers only (a tiny random transformers model, tests/family_cases.py).
"""

import json

import keras
import numpy as np
import pytest

from keras_attn import convert
from keras_attn.convert import families
from keras_attn.convert._transformers_config import read_config

from .. import family_cases as fc

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

NAME = "llama4_text"


@pytest.fixture(scope="module")
def converted():
    model = fc.build_hf(NAME)
    return model, fc.token_ids(NAME), convert.causal_lm_from_transformers(model)


def test_routers_are_far_from_ties(converted):
    """Every router's top two logits differ by more than 1e-2 on the case's tokens (the
    logits' error is ~1e-5): no top-1 choice can flip."""
    model, ids, _ = converted
    margins = []

    def record(module, inputs, output):
        top = torch.sort(output[1].float(), dim=-1, descending=True).values  # the logits
        margins.append(float((top[:, 0] - top[:, 1]).min()))

    hooks = [layer.feed_forward.router.register_forward_hook(record)
             for layer in model.model.layers if layer.is_moe_layer]
    with torch.no_grad():
        model(torch.from_numpy(ids).long())
    for hook in hooks:
        hook.remove()
    assert len(margins) == 2 and min(margins) > 1e-2, margins


def test_the_layers_options(converted):
    _, _, lm = converted
    rope, nope = lm.blocks[0].self_attention.options, lm.blocks[1].self_attention.options
    assert (rope.rope_max_wavelength, rope.rope_interleaved, rope.qk_norm,
            rope.attention_chunk_size, rope.query_scale_beta) == (1e4, True, "l2", 8, None)
    assert (nope.rope_max_wavelength, nope.qk_norm, nope.attention_chunk_size,
            nope.query_scale_beta, nope.query_scale_length, nope.query_scale_offset) == (
        None, None, None, 0.5, 4, 1)
    assert lm.blocks[0].intermediate_dim == 96  # intermediate_size_mlp
    moe = lm.blocks[1].feed_forward
    assert (moe.routing, moe.num_experts, moe.num_experts_per_tok, moe.intermediate_dim,
            moe.shared_intermediate_dim) == ("llama4_sigmoid_topk", 4, 1, 48, 48)


@pytest.mark.parametrize("overrides", [
    {"moe_layers": [0, 3], "no_rope_layers": [0, 1, 1, 0], "use_qk_norm": False},
    {"attention_chunk_size": None, "num_experts_per_tok": 2, "attn_temperature_tuning": False,
     "rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8}},
], ids=["moe-and-nope-layers-no-qk-norm", "no-chunks-top2-llama3"])
def test_config_variants_match_transformers(overrides):
    model = fc.build_hf(NAME, **overrides)
    ids = fc.token_ids(NAME)
    logits, _, _ = fc.hf_reference(model, ids, generate=False)
    lm = convert.causal_lm_from_transformers(model)
    error = fc.relative_error(keras.ops.convert_to_numpy(lm(ids)), logits)
    assert error <= fc.TOLERANCE, error


def test_dict_config_and_numpy_weights(converted):
    """A config.json dict and numpy arrays, the experts in Llama 4's stacked layout
    `(E, D, 2F)` / `(E, F, D)`: the same model."""
    model, ids, lm = converted
    config = json.loads(model.config.to_json_string())
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    assert state["model.layers.1.feed_forward.experts.gate_up_proj"].shape == (4, fc.D, 96)
    again = convert.causal_lm_from_transformers(config, state)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(again(ids)),
                                  keras.ops.convert_to_numpy(lm(ids)))
    # A dense MLP of the wrong width: refused, naming intermediate_size_mlp.
    bad = dict(state, **{"model.layers.0.feed_forward.up_proj.weight":
                         state["model.layers.0.feed_forward.up_proj.weight"][:48]})
    with pytest.raises(ValueError, match=r"intermediate_size_mlp=96"):
        convert.causal_lm_from_transformers(config, bad)
    # A stack of experts that disagrees with the config: refused by shape, named.
    key = "model.layers.1.feed_forward.experts.down_proj"
    state[key] = state[key][:, :, :40]
    with pytest.raises(ValueError, match="experts.down_proj"):
        convert.causal_lm_from_transformers(config, state)


def _config(**changes):
    return {**fc.config_kwargs(NAME), "model_type": NAME, **changes}


@pytest.mark.parametrize("field, value", [
    ("no_rope_layers", [1, 0]),  # shorter than the layers
    ("no_rope_layers", [1, 2, 1, 0]),
    ("layer_types", ["sliding_attention"] * 4),
    ("moe_layers", [0, 4]),
    ("attn_scale", -0.1),
    ("floor_scale", 0),
    ("use_qk_norm", 1),
    ("num_experts_per_tok", 5),
    ("interleave_moe_layer_step", 0),
])
def test_refusals_name_the_field(field, value):
    with pytest.raises(ValueError, match=rf"`{field}`"):
        read_config(_config(**{field: value}))


def test_chunked_layers_need_a_chunk_size_and_the_multimodal_model_is_refused():
    with pytest.raises(ValueError, match=r"`attention_chunk_size`"):
        read_config(_config(attention_chunk_size=None,
                            layer_types=["chunked_attention", "full_attention"] * 2))
    with pytest.raises(ValueError, match=r"model_type.*multimodal.*'llama4_text'"):
        read_config({"model_type": "llama4", "text_config": _config()})
    assert "llama4" in families.REFUSED and NAME in families.model_types()
