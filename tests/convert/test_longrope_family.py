"""The phi3 converter's longrope from a config.json-style dict: the older `rope_scaling`
with type "su" (transformers maps it to longrope), the top-level
`original_max_position_embeddings` winning over the RoPE dict's own (Phi3Config's rule),
and its refusals by name. Live against transformers (torch)."""

import pytest

from .. import family_cases as fc

pytest.importorskip("torch")
pytest.importorskip("transformers")

import keras  # noqa: E402

from keras_attn import convert  # noqa: E402


def _dict_config(model):
    config = model.config.to_dict()
    if "rope_parameters" in config:  # transformers 5
        params = dict(config.pop("rope_parameters"))
        config["rope_theta"] = params.pop("rope_theta")
    else:  # transformers 4 wrote `rope_scaling` (longrope's under `type`) and `rope_theta`
        params = dict(config["rope_scaling"])
    # An older config.json: `rope_scaling` with type "su", its own (ignored) context length.
    params.pop("rope_type", None)
    params.pop("type", None)
    params.pop("partial_rotary_factor", None)
    config["rope_scaling"] = {**params, "type": "su", "original_max_position_embeddings": 4096}
    return config


def test_older_rope_scaling_su_matches_transformers():
    model = fc.build_hf("phi3_longrope")
    ids = fc.token_ids("phi3_longrope")
    logits, _, _ = fc.hf_reference(model, ids, generate=False)
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    config = _dict_config(model)
    lm = convert.causal_lm_from_transformers(config, state)
    rope = lm.blocks[0].self_attention.options.rope
    assert rope.rope_type == "longrope" and rope.original_max_position_embeddings == 16
    assert fc.relative_error(keras.ops.convert_to_numpy(lm(ids)), logits) <= fc.TOLERANCE
    # The ablation: the RoPE dict's own context length (4096) read instead: never long.
    inner = convert.causal_lm_from_transformers(
        {**config, "original_max_position_embeddings": 4096}, state)
    assert fc.relative_error(keras.ops.convert_to_numpy(inner(ids)), logits) > 100 * fc.TOLERANCE


def test_longrope_refusals_name_the_field():
    model = fc.build_hf("phi3_longrope")
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    config = _dict_config(model)
    short = config["rope_scaling"]["short_factor"]
    with pytest.raises(ValueError, match=r"config field `rope_scaling` is not supported: "
                                         r"`rope_short_factor` holds one factor per rotated "
                                         r"frequency: 8 .*Received: rope_short_factor of length 7"):
        convert.causal_lm_from_transformers(
            {**config, "rope_scaling": {**config["rope_scaling"], "short_factor": short[:7]}},
            state)
    without = {k: v for k, v in config["rope_scaling"].items() if k != "long_factor"}
    with pytest.raises(ValueError, match=r"rope_scaling\['long_factor'\]"):
        convert.causal_lm_from_transformers({**config, "rope_scaling": without}, state)
    with pytest.raises(ValueError, match=r"rope_scaling\['rope_type'\].*dynamic"):
        convert.causal_lm_from_transformers(
            {**config, "rope_scaling": {"type": "dynamic", "factor": 2.0}}, state)
