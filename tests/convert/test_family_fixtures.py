"""Converted transformers models, saved as `.keras`, against transformers' stored outputs, on every backend.

tests/assets/families/<family>.keras is a `keras_attn.CausalLM` converted by
`keras_attn.convert.causal_lm_from_transformers` from a tiny random transformers model
(tools/make_family_fixtures.py, run in the torch environment, wrote it); the `.npz` beside
it (arrays only, read without pickle) holds token ids, transformers' logits over them and
the tokens of transformers' greedy `generate`. No transformers or torch is needed here:
the files are loaded under the backend the tests run on and must reproduce both.
"""

import json
import os
import re
import zipfile

import keras
import numpy as np
import pytest

from keras_attn import CausalLM

from .. import family_cases as fc
from ..helpers import keras_version

HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets", "families")
NAMES = sorted(fc.CASES)


def _saved_by(name):
    with zipfile.ZipFile(os.path.join(HERE, name + ".keras")) as archive:
        text = json.loads(archive.read("metadata.json"))["keras_version"]
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3]), text


def load(name):
    """`(CausalLM, stored arrays)` of fixture `name`.

    Keras reads the files older Keras releases wrote, not those of newer ones (at the
    declared floor, Keras 3.9, GlorotUniform has no `input_axes`), as in
    tests/test_saved_files.py: under an older Keras than the one that saved it, a test
    that loads a fixture is skipped, saying so.
    """
    saved_by, text = _saved_by(name)
    if keras_version() < saved_by:
        pytest.skip(f"{name}.keras was saved by Keras {text}; Keras {keras.__version__} "
                    "cannot read a newer Keras's configs")
    lm = keras.saving.load_model(os.path.join(HERE, name + ".keras"))
    with np.load(os.path.join(HERE, name + ".npz"), allow_pickle=False) as stored:
        return lm, {key: stored[key] for key in stored.files}


def test_every_case_has_a_fixture():
    assert sorted(f[:-len(".keras")] for f in os.listdir(HERE) if f.endswith(".keras")) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_fixture_reproduces_transformers(name):
    lm, stored = load(name)
    assert isinstance(lm, CausalLM)
    ids = stored["token_ids"]
    logits = keras.ops.convert_to_numpy(lm(ids))
    error = fc.relative_error(logits, stored["logits"])
    assert error <= fc.TOLERANCE, f"{name}: relative error {error:.3g}"
    # The ablation moves the logits far beyond the tolerance on this backend too.
    ablated = keras.ops.convert_to_numpy(fc.ablate(lm, name)(ids))
    assert fc.relative_error(ablated, stored["logits"]) > 100 * fc.TOLERANCE
    P, expected = int(stored["prompt_length"]), stored["tokens"]
    tokens = keras.ops.convert_to_numpy(lm.generate(ids[:, :P], max_length=expected.shape[1]))
    np.testing.assert_array_equal(tokens, expected)


@pytest.mark.parametrize("name", ["gemma2", "qwen2"])
def test_save_and_load_again(tmp_path, name):
    """Saved under this backend, loaded again: the same logits."""
    lm, stored = load(name)
    path = str(tmp_path / f"{name}.keras")
    lm.save(path)
    again = keras.saving.load_model(path)
    ids = stored["token_ids"]
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(again(ids)),
                                  keras.ops.convert_to_numpy(lm(ids)))


def test_causal_lm_refuses_bad_inputs():
    lm, _ = load("llama")
    with pytest.raises(ValueError, match="token_ids"):
        lm(np.zeros((2, 3), "float32"))
    with pytest.raises(ValueError, match="token_ids"):
        lm(np.zeros((3,), "int32"))
    with pytest.raises(ValueError, match="max_length"):
        lm.generate(np.zeros((2, 4), "int32"), max_length=4)
    with pytest.raises(ValueError, match="prompt_ids"):
        lm.generate(np.zeros((2, 4), "float32"), max_length=6)
    with pytest.raises(ValueError, match="blocks"):
        CausalLM(10, 8, [])


def test_generate_compiles_once_and_matches_the_eager_loop(tmp_path):
    """The compiled loop (JAX, TensorFlow: XLA) is kept: a second call traces nothing.

    On PyTorch, "auto" decodes through the traced step (one graph per shape, kept).

    Greedy and sampled (int seed) tokens equal the loop run eagerly (`jit_compile=False`,
    on TensorFlow a plain tf.function), which the fixture test above checks against
    transformers' greedy tokens.
    """
    from keras_attn.layers.causal_lm import loops_of, traced_step_of

    lm, stored = load("llama")
    P, L = int(stored["prompt_length"]), stored["tokens"].shape[1]
    prompt = stored["token_ids"][:, :P]
    settings = [{}, {"temperature": 1.0, "top_k": 5, "seed": 3, "end_token_id": [1, 2]}]
    for kwargs in settings:
        first = keras.ops.convert_to_numpy(lm.generate(prompt, max_length=L, **kwargs))
        kept = set(map(id, loops_of(lm).values()))
        again = keras.ops.convert_to_numpy(lm.generate(np.asarray(prompt), max_length=L,
                                                       **kwargs))
        assert set(map(id, loops_of(lm).values())) == kept  # the same loop again
        plain = keras.ops.convert_to_numpy(lm.generate(prompt, max_length=L,
                                                       jit_compile=False, **kwargs))
        np.testing.assert_array_equal(first, again)
        # Sampled too, on TensorFlow with and without XLA: an int seed's noise is a hash in
        # keras.ops (keras_attn._sampling), not TensorFlow's stateless kernels, which differ.
        np.testing.assert_array_equal(first, plain)
    np.testing.assert_array_equal(first[:, :P], prompt)
    loops = [loop for loop in loops_of(lm).values() if loop.jit_compile]
    if keras.backend.backend() in ("jax", "tensorflow"):
        assert len(loops) == 2 and all(loop.traces == 1 for loop in loops), \
            [(loop.options, loop.traces) for loop in loops]
    elif keras.backend.backend() == "torch":  # eager: the loop model runs at every call
        traced = [loop for loop in loops_of(lm).values() if loop.step is not None]
        plain = [loop for loop in loops_of(lm).values() if loop.step is None]
        assert loops == [] and len(traced) == 2 and len(plain) == 2
        assert all(loop.traces == 2 for loop in traced)  # "auto": first, again
        assert all(loop.traces == 1 for loop in plain)  # jit_compile=False
        # Both settings decode one shape: one graph, which answered every step of the
        # greedy calls (the sampled ones may stop early) and none of the plain loops'.
        step = traced_step_of(lm)
        assert len(step.graphs) == 1 and step.graph_calls >= 2 * (L - 1 - P)
    else:  # NumPy: the loop runs as it is, no model
        assert loops_of(lm) == {}
    with pytest.raises(ValueError, match="jit_compile"):
        lm.generate(prompt, max_length=L, jit_compile="xla")
    # The kept loops are not part of the model: a file saved now loads as before.
    path = str(tmp_path / "llama.keras")
    lm.save(path)
    again = keras.saving.load_model(path)
    assert [w.path for w in again.weights] == [w.path for w in lm.weights]
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(again(prompt)),
                                  keras.ops.convert_to_numpy(lm(prompt)))
