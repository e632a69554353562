"""Configs as transformers 4.45.2 serialises them read as transformers 5's (issue 36).

tests/assets/transformers4/ holds the same three models' `to_dict()` under 4.45.2 and 5.24.0
(tools/make_transformers4_configs.py): 4.x's RoPE as `rope_theta` / `rope_scaling` and its
PretrainedConfig's 35 generation defaults and legacy flags
(`keras_attn.convert._transformers4_fields`). Plain JSON: no transformers needed, every
backend. tests/convert/test_families.py compares the logits with transformers 4.45 itself
(tox -e transformers-oldest).
"""

import dataclasses
import json
import pathlib

import pytest

from keras_attn.convert import _transformers4_fields
from keras_attn.convert._transformers_config import read_config

ASSETS = pathlib.Path(__file__).parent.parent / "assets" / "transformers4"
V4 = json.loads((ASSETS / "configs_4.45.2.json").read_text())
V5 = json.loads((ASSETS / "configs_5.24.0.json").read_text())


def _spec(config):
    return dataclasses.asdict(read_config(config))


@pytest.mark.parametrize("family", sorted(V4))
def test_a_transformers_4_config_reads_as_its_transformers_5_form(family):
    # Every 4.x field is there (the comparison would pass without them otherwise).
    assert set(_transformers4_fields.IGNORED_4) - {"_attn_implementation_autoset"} <= set(
        V4[family]), family
    assert "rope_parameters" not in V4[family] and "rope_parameters" in V5[family]
    assert _spec(V4[family]) == _spec(V5[family])


def test_generation_defaults_away_from_theirs_do_not_change_the_model():
    config = {**V4["llama"], "num_beams": 4, "do_sample": True, "temperature": 0.6,
              "max_length": 4096, "use_bfloat16": True, "is_decoder": True,
              "task_specific_params": {"text-generation": {"do_sample": True}}}
    assert _spec(config) == _spec(V5["llama"])


def test_a_4x_field_that_would_change_the_model_is_refused_by_name():
    with pytest.raises(ValueError, match=r"`cross_attention_hidden_size`.*Received: "
                                         r"cross_attention_hidden_size=8"):
        read_config({**V4["llama"], "cross_attention_hidden_size": 8})


@pytest.mark.parametrize("field", ["query_pre_attn_scalar", "num_key_value_heads"])
def test_a_field_whose_default_changed_left_out_of_a_4x_config_is_refused(field):
    """Gemma2Config's defaults changed (4.45: query_pre_attn_scalar 224, 16 key/value heads;
    5: 256, 4): a config.json 4.x wrote leaves out a field equal to 4.x's default, so its
    absence there is refused by name, not read as 5's default."""
    config = {k: v for k, v in V4["gemma2"].items() if k != field}
    with pytest.raises(ValueError, match=rf"`{field}`.*transformers 4\.45\.2"):
        read_config(config)
    # Without a 4.x transformers_version: transformers 5's default, as before.
    del config["transformers_version"]
    assert read_config(config).family == "gemma2"


def test_rope_parameters_in_a_4x_config_are_refused_not_read():
    """transformers 4.45 stores a `rope_parameters` it was given and reads rope_theta /
    rope_scaling (None): its model has no llama3 scaling, so reading rope_parameters
    would convert another model (the README's block under 4.45)."""
    llama3 = {"rope_type": "llama3", "rope_theta": V4["llama"]["rope_theta"], "factor": 8.0,
              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 16}
    config = {**V4["llama"], "rope_scaling": None, "rope_parameters": llama3}
    with pytest.raises(ValueError, match=r"`rope_parameters`.*rope_scaling=None"):
        read_config(config)
    # The default RoPE at the same base is what 4.45's model computes: read.
    plain = {"rope_type": "default", "rope_theta": V4["llama"]["rope_theta"]}
    assert read_config({**config, "rope_parameters": plain}).layers[0].attention[
        "rope_type"] == "default"
