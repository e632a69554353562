"""`olmo2`, `olmo3`, `exaone4`: the block with its norms after the sublayers only.

The logits, tokens and the pre-norm ablation are in tests/convert/test_families.py (and
the fixtures' in test_family_fixtures.py); here what those do not show: the blocks'
shape as converted, EXAONE 4's RoPE-less full block, and the refusals.
"""

import keras
import numpy as np
import pytest

from keras_attn import CausalLM, convert

from .. import family_cases as fc

TINY = dict(vocab_size=16, hidden_size=8, intermediate_size=12, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1)


@pytest.mark.backend_independent
@pytest.mark.parametrize("config, field", [
    # transformers 5.24 derives layer_types from an int pattern only.
    ({"model_type": "exaone4", "sliding_window": 4, "sliding_window_pattern": "LLLG"},
     "sliding_window_pattern"),
    ({"model_type": "exaone4", "layer_types": ["sliding_attention"] * 2, "sliding_window": None},
     "sliding_window"),
    ({"model_type": "olmo3", "sliding_window": 4, "rope_parameters": {"full_attention": {"rope_theta": 1e4},
                                                 "chunked_attention": {}}}, "rope_parameters"),
    ({"model_type": "olmo3", "rope_theta": 1e4, "sliding_window": 4,
      "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, "rope_theta"),
    ({"model_type": "olmo2", "qk_layernorm": True}, "qk_layernorm"),  # unknown field
])
def test_a_config_field_it_cannot_reproduce_is_refused_by_name(config, field):
    with pytest.raises(ValueError, match=rf"`{field}`.*Received: {field}="):
        convert.causal_lm_from_transformers({**TINY, **config}, {})


@pytest.mark.backend_independent
def test_exaone4_layer_types_from_the_pattern_and_global_nope():
    from keras_attn.convert._transformers_config import read_config

    spec = read_config({**TINY, "num_hidden_layers": 4, "model_type": "exaone4",
                        "sliding_window": 4, "sliding_window_pattern": 2})
    windows = [layer.attention["sliding_window"] for layer in spec.layers]
    ropes = [layer.attention.get("rope_max_wavelength") for layer in spec.layers]
    assert windows == [4, None, 4, None] and ropes == [1e4, None, 1e4, None]
    assert spec.input_norms is False
    # Without a window every block is full and rotated (transformers: sliding_window=None).
    spec = read_config({**TINY, "model_type": "exaone4", "sliding_window": None})
    assert [layer.attention.get("rope_max_wavelength") for layer in spec.layers] == [1e4, 1e4]


torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def exaone4():
    model = fc.build_hf("exaone4")
    ids = fc.token_ids("exaone4")
    logits, _, _ = fc.hf_reference(model, ids, generate=False)
    return model, ids, logits, convert.causal_lm_from_transformers(model)


def test_the_converted_blocks_have_post_norms_only(exaone4):
    _, _, _, lm = exaone4
    for block in lm.blocks:
        assert not block.use_input_norm and block.self_attention_norm is None
        assert block.feed_forward_norm is None
        assert block.post_attention_norm is not None and block.post_feed_forward_norm is not None


def test_exaone4_rope_on_the_full_block_is_far(exaone4):
    """The ablation of EXAONE 4's global NoPE: RoPE on its full block too."""
    _, ids, logits, lm = exaone4
    config = lm.get_config()
    full = [b["config"] for b in config["blocks"] if b["config"]["sliding_window"] is None]
    assert len(full) == 1 and full[0]["rope_max_wavelength"] is None  # the converted: none
    full[0]["rope_max_wavelength"] = 1e4
    rotated = CausalLM.from_config(config)
    rotated.set_weights(lm.get_weights())
    error = fc.relative_error(keras.ops.convert_to_numpy(rotated(ids)), logits)
    assert error > 100 * fc.TOLERANCE, error


def test_weights_that_disagree_are_refused_by_name(exaone4):
    model = exaone4[0]
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    extra = {**state, "model.layers.0.input_layernorm.weight": np.ones(fc.CASES["exaone4"][1][
        "hidden_size"], "float32")}
    with pytest.raises(ValueError, match=r"input_layernorm"):
        convert.causal_lm_from_transformers(model.config, extra)
    missing = {k: v for k, v in state.items()
               if k != "model.layers.1.post_feedforward_layernorm.weight"}
    with pytest.raises(ValueError, match=r"post_feedforward_layernorm"):
        convert.causal_lm_from_transformers(model.config, missing)


def test_olmo2_full_width_qk_norm_is_cross_checked():
    config = {**TINY, "model_type": "olmo2"}
    pytest.importorskip("transformers")
    model_cls = fc.skip_without("Olmo2ForCausalLM")
    model = model_cls(pytest.importorskip("transformers").Olmo2Config(**TINY))
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    lm = convert.causal_lm_from_transformers(config, state)
    assert lm.blocks[0].self_attention.qk_norm_full_width
    d = TINY["hidden_size"] // TINY["num_attention_heads"]
    state["model.layers.0.self_attn.q_norm.weight"] = np.ones(d, "float32")  # per head
    with pytest.raises(ValueError, match=r"num_attention_heads=2, head_dim=4 \(H \* d = 8\)"):
        convert.causal_lm_from_transformers(config, state)
