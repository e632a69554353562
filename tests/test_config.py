"""`keras_attn.config`: the two settings users set, and 0.1.0's other names still importable."""

import pytest

from keras_attn import _policy, config


def test_config_exports_only_the_two_settings():
    assert sorted(config.__all__) == ["attention_block_size", "blockwise_threshold",
                                      "set_attention_block_size", "set_blockwise_threshold"]


def test_release_0_1_0_names_still_import():
    assert config.DEFAULT_BLOCK_SIZE == 512 and config.DEFAULT_BLOCKWISE_THRESHOLD == 2**26
    try:
        config.set_attention_block_size(64)
        config.set_blockwise_threshold(1000)
        assert config.block_size_override() == 64 == config.attention_block_size()
        assert config.threshold_override() == 1000 == config.blockwise_threshold()
        assert _policy.block_size_override() == 64
    finally:
        config.set_attention_block_size(None)
        config.set_blockwise_threshold(None)
    assert config.block_size_override() is None and config.attention_block_size() == 512


def test_settings_name_the_argument():
    with pytest.raises(ValueError, match=r"Received: block_size=0"):
        config.set_attention_block_size(0)
    with pytest.raises(ValueError, match=r"Received: num_scores=-1"):
        config.set_blockwise_threshold(-1)
