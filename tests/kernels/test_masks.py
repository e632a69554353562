"""One positional rule (`keras_attn._masks.may_attend`) behind every positional mask.

The public helpers, the cache's written-slots mask and the blockwise path's block
masks are all built from it; here each is checked against the float64 reference's
masks, and against the others.
"""

import itertools

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn._kernels.blockwise import _Blocks
from keras_attn._masks import may_attend, positional_mask
from keras_attn.cache import cached_positional_mask
from keras_attn.options import KernelSpec

from .. import reference


def _np(x):
    return None if x is None else keras.ops.convert_to_numpy(x)


def _reference(T, S, is_causal, window):
    if window is not None:
        return reference.sliding_window_mask(T, S, window, is_causal)
    return reference.causal_mask(T, S) if is_causal else np.ones((T, S), bool)


SHAPES = [(1, 1), (3, 5), (5, 5), (5, 3), (1, 9), (7, 12)]
RULES = [(True, None), (True, 1), (True, 3), (False, 2), (False, 4)]


@pytest.mark.parametrize("T, S", SHAPES)
def test_positional_mask_is_the_reference(T, S):
    for is_causal, window in RULES:
        np.testing.assert_array_equal(_np(positional_mask(T, S, is_causal, window)),
                                      _reference(T, S, is_causal, window))
    assert positional_mask(T, S) is None
    np.testing.assert_array_equal(_np(keras_attn.causal_mask(T, S)), reference.causal_mask(T, S))
    np.testing.assert_array_equal(_np(keras_attn.sliding_window_mask(T, S, 2, False)),
                                  reference.sliding_window_mask(T, S, 2, False))


def test_the_rule_with_key_end():
    keys = keras.ops.arange(6, dtype="int32")[None, :]
    np.testing.assert_array_equal(_np(may_attend(None, keys, key_end=4)), [[1, 1, 1, 1, 0, 0]])
    queries = keras.ops.convert_to_tensor(np.array([[2], [5]], "int32"))
    np.testing.assert_array_equal(
        _np(may_attend(queries, keys, is_causal=True, sliding_window=2, key_end=5)),
        [[0, 1, 1, 0, 0, 0], [0, 0, 0, 0, 1, 0]])
    assert may_attend(None, keys) is None


@pytest.mark.parametrize("is_causal, window", RULES + [(False, None)])
def test_cache_mask_is_the_rule_over_written_slots(is_causal, window):
    S_max = 10
    for start, new_length, T in [(0, 3, 3), (3, 1, 1), (4, 2, 2), (2, 4, 1), (0, 10, 10)]:
        end = start + new_length
        expected = np.zeros((T, S_max), bool)
        expected[:, :end] = _reference(T, end, is_causal, window)  # bottom-right over `end`
        got = _np(cached_positional_mask(T, S_max, start, new_length, is_causal, window))
        np.testing.assert_array_equal(np.ones((T, S_max), bool) if got is None else got,
                                      expected, err_msg=f"start={start}, S_new={new_length}")
    read_only = _np(cached_positional_mask(3, S_max, None, None, is_causal, window))
    expected = _reference(3, S_max, is_causal, window)
    np.testing.assert_array_equal(np.ones((3, S_max), bool) if read_only is None else read_only,
                                  expected)


@pytest.mark.parametrize("is_causal, window", RULES + [(False, None)])
@pytest.mark.parametrize("T, S, block, group", [(7, 7, 3, 1), (5, 9, 4, 1), (6, 4, 4, 2),
                                                 (3, 10, 4, 3)])
def test_blockwise_block_masks_tile_the_full_mask(is_causal, window, T, S, block, group):
    """Rows are positions repeated `group` times; the padding keys are never allowed."""
    rows = T * group
    g = _Blocks(rows, S, block, [1], group=group,
                spec=KernelSpec(is_causal=is_causal, sliding_window=window))
    expected = np.zeros((g.Tp, g.Sp), bool)
    expected[:rows, :S] = np.repeat(_reference(T, S, is_causal, window), group, axis=0)
    for i, j in itertools.product(range(g.nq), range(g.nk)):
        tile = _np(g.allowed(None, i, j))
        want = expected[i * g.bq:(i + 1) * g.bq, j * g.bk:(j + 1) * g.bk]
        got = np.ones_like(want) if tile is None else np.broadcast_to(tile, want.shape)
        live = min(g.bq, rows - i * g.bq)  # padded query rows are sliced off
        np.testing.assert_array_equal(got[:live], want[:live], err_msg=f"block ({i}, {j})")
