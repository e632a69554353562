"""Fixtures shared by the test modules: `keras_attn.config`'s settings for a test's duration.

Each module that needs small blocks (so that its sizes span several, partial
blocks) or the measured policy says so in one line:

    _small_blocks = attention_settings_fixture(block_size=4)
"""

import contextlib

import pytest

from keras_attn import config


@contextlib.contextmanager
def attention_settings(block_size=None, threshold=None):
    """`config.set_attention_block_size(block_size)` and `set_blockwise_threshold(threshold)`
    inside; both back to unset (the policy's own choices) after, whatever happened."""
    config.set_attention_block_size(block_size)
    config.set_blockwise_threshold(threshold)
    try:
        yield
    finally:
        config.set_attention_block_size(None)
        config.set_blockwise_threshold(None)


def attention_settings_fixture(block_size=None, threshold=None, scope="function"):
    """An autouse fixture holding `attention_settings(block_size, threshold)`; assign it to a
    module-level name of the test module (pytest finds fixtures by module attribute)."""

    @pytest.fixture(autouse=True, scope=scope)
    def _settings():
        with attention_settings(block_size, threshold):
            yield

    return _settings
