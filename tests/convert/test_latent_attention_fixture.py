"""The stored deepseek_v3 attention conversion, on every backend (no transformers needed).

tests/assets/deepseek_v3_attention.keras is a Functional model around the
`MultiHeadLatentAttention` that `multi_head_latent_attention_from_transformers` made from
a random `DeepseekV3Attention` (tools/make_latent_attention_fixture.py, in the torch
environment); the `.npz` beside it holds the input and transformers' output. Loaded
under the backend the tests run on, it must reproduce that output, uncached and in cached
decoding (both forms), and its ablations must not.
"""

import os

import keras
import numpy as np
import pytest

from keras_attn import MultiHeadLatentAttention, observe_paths

from .. import latent_cases as lc
from ..helpers import keras_version

PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets",
                    "deepseek_v3_attention")


@pytest.fixture(scope="module")
def stored():
    if keras_version() < (3, 15, 0):
        pytest.skip("deepseek_v3_attention.keras was saved by Keras 3.15")
    model = keras.saving.load_model(PATH + ".keras")
    (layer,) = [sub for sub in model.layers if isinstance(sub, MultiHeadLatentAttention)]
    with np.load(PATH + ".npz", allow_pickle=False) as arrays:
        return model, layer, arrays["x"], arrays["output"]


def test_the_stored_conversion_reproduces_transformers(stored):
    model, layer, x, expected = stored
    error = lc.relative_error(keras.ops.convert_to_numpy(model(x)), expected)
    assert error <= lc.TOLERANCE, f"relative error {error:.3g}"


@pytest.mark.parametrize("decode", ["absorbed", "expanded"])
def test_cached_decoding_of_the_stored_conversion(stored, decode):
    _, layer, x, expected = stored
    copy = MultiHeadLatentAttention.from_config({**layer.get_config(), "decode": decode})
    copy.build((None, None, lc.D))
    copy.set_weights(layer.get_weights())
    cache = copy.empty_cache(lc.B, lc.T)
    rows = []
    with observe_paths() as taken:
        for start, stop in [(0, 3), (3, 6)] + [(t, t + 1) for t in range(6, lc.T)]:
            out, cache = copy(x[:, start:stop], use_causal_mask=True, cache=cache,
                              cache_update_index=start)
            rows.append(keras.ops.convert_to_numpy(out))
    assert taken[f"latent_{decode}"] == len(rows), dict(taken)
    assert lc.relative_error(np.concatenate(rows, 1), expected) <= lc.TOLERANCE


@pytest.mark.parametrize("ablation", lc.ABLATIONS)
def test_ablations_of_the_stored_conversion(stored, ablation):
    _, layer, x, expected = stored
    wrong = keras.ops.convert_to_numpy(lc.ablate(layer, ablation)(x, use_causal_mask=True))
    assert lc.relative_error(wrong, expected) > 100 * lc.TOLERANCE, ablation
