"""Gemma 3's `rope_theta` / `rope_local_base_freq` beside `rope_parameters` (keras-hub's
exporter writes both): accepted where they agree, refused naming both where they do not."""

import pytest

from keras_attn.convert.families import gemma3_text

PARAMS = {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
          "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}


def test_agreeing_bases_beside_rope_parameters_are_accepted():
    alone = gemma3_text.rope_by_layer_type({"rope_parameters": PARAMS})
    both = gemma3_text.rope_by_layer_type({"rope_parameters": PARAMS, "rope_theta": 1e6,
                                           "rope_local_base_freq": 1e4})
    assert both == alone
    assert alone["full_attention"]["rope_max_wavelength"] == 1e6


@pytest.mark.parametrize("field, kind", [("rope_theta", "full_attention"),
                                         ("rope_local_base_freq", "sliding_attention")])
def test_disagreeing_bases_are_refused_naming_both(field, kind):
    with pytest.raises(ValueError, match=rf"`{field}` and `rope_parameters` disagree.*"
                                         rf"Received: {field}=500.0 and "
                                         rf"rope_parameters\['{kind}'\]\['rope_theta'\]="):
        gemma3_text.rope_by_layer_type({"rope_parameters": PARAMS, field: 500.0})
