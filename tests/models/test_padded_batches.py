"""Padded batches in `CausalLM` (issue 38 item 2): `generate(padding_mask=...)` and
`lm(ids, padding_mask=...)`, left and right padded, row by row against each prompt alone.

One batch of 8 prompts of lengths 3 to 40 (P = 40, L = 48), shared by every test so
that JAX compiles few shapes. "Alone": the uncached forward's greedy argmax over each
row's own tokens (the forward is causal, so one call over the right-padded result gives
every step's logits of every row), and the shortest row through `generate` by itself.
On PyTorch, also transformers' left-padded `generate(input_ids, attention_mask=...)`
(Llama; GPT-2 for learned absolute positions).
"""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn.models._generate_loop import loops_of
from keras_attn.testing.weights import randomize_weights

from ..helpers import to_numpy

V, D, P, L = 32, 16, 40, 48
LENGTHS = (3, 40, 9, 17, 25, 5, 33, 12)
OTHER_LENGTHS = (40, 4, 21, 8, 30, 6, 13, 39)  # the same shape, other lengths
PAD = 0


def _rows(lengths, seed=0, vocabulary=V):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, vocabulary, n).astype("int32") for n in lengths]


def _batch(rows, side, length=P):
    """`(ids, mask)` `(B, P)`: the rows padded with PAD on `side`."""
    ids = np.full((len(rows), length), PAD, "int32")
    mask = np.zeros((len(rows), length), bool)
    for i, row in enumerate(rows):
        where = slice(0, len(row)) if side == "right" else slice(length - len(row), length)
        ids[i, where], mask[i, where] = row, True
    return ids, mask


def _block(**kwargs):
    return keras_attn.TransformerDecoderLayer(
        intermediate_dim=24, num_heads=2, num_key_value_heads=1, normalize_first=True,
        normalization="rms", **kwargs)


def _lm(blocks, seed=3, **kwargs):
    lm = keras_attn.CausalLM(V, D, blocks, **kwargs)
    randomize_weights(lm, seed=seed, scale=0.35)
    return lm


@pytest.fixture(scope="module")
def lm():
    """RoPE, a sliding window of 6 in the second block, learned positions too."""
    return _lm([_block(rope_max_wavelength=100.0), _block(rope_max_wavelength=100.0,
                                                          sliding_window=6)],
               max_position_embeddings=64)


def _right_layout(tokens, rows, side):
    """Each row's real tokens from position 0: the row's prompt, then what it generated."""
    if side == "right":
        return tokens
    return np.stack([np.concatenate([row, tokens[i, P:], np.full(P - len(row), PAD)])
                     for i, row in enumerate(rows)]).astype("int32")


def _assert_rows_alone(lm, tokens, rows, side):
    """Every generated token of every row is the argmax of the uncached forward over that
    row's tokens before it (the row alone: right padding only follows the real tokens)."""
    right = _right_layout(tokens, rows, side)
    logits = to_numpy(lm(right))
    for i, row in enumerate(rows):
        np.testing.assert_array_equal(right[i, :len(row)], row)
        end = L if side == "right" else L - P + len(row)
        np.testing.assert_array_equal(
            right[i, len(row):end], logits[i, len(row) - 1:end - 1].argmax(-1),
            err_msg=f"row {i} (length {len(row)}, {side} padded)")


@pytest.mark.parametrize("side", ["left", "right"])
def test_each_row_is_decoded_as_if_alone(lm, side):
    rows = _rows(LENGTHS)
    ids, mask = _batch(rows, side)
    tokens = to_numpy(lm.generate(ids, L, padding_mask=mask))
    assert tokens.shape == (len(rows), L)
    if side == "left":  # transformers' layout: the same pads, the prompt, L - P new tokens
        np.testing.assert_array_equal(tokens[:, :P], ids)
    _assert_rows_alone(lm, tokens, rows, side)
    alone = to_numpy(lm.generate(rows[0][None], L))[0]  # the shortest row by itself
    end = L if side == "right" else L - P + len(rows[0])
    np.testing.assert_array_equal(_right_layout(tokens, rows, side)[0, :end], alone[:end])


def test_attention_mask_is_the_same_argument(lm):
    rows = _rows(LENGTHS)
    ids, mask = _batch(rows, "left")
    np.testing.assert_array_equal(to_numpy(lm.generate(ids, L, attention_mask=mask.astype(
        "int32"))), to_numpy(lm.generate(ids, L, padding_mask=mask)))


def test_one_compile_per_prompt_shape(lm):
    """Two batches of one shape, other lengths: one kept loop, traced once (a tensor start
    index, not a constant), on JAX and TensorFlow; PyTorch runs it eagerly (its `traces`
    counts the calls)."""
    for lengths, seed in ((LENGTHS, 0), (OTHER_LENGTHS, 1)):
        rows = _rows(lengths, seed)
        ids, mask = _batch(rows, "right")
        tokens = to_numpy(lm.generate(ids, L, padding_mask=mask, end_token_id=[1, 2]))
        for i, row in enumerate(rows):
            np.testing.assert_array_equal(tokens[i, :len(row)], row)
    if keras.backend.backend() == "numpy":
        return  # no kept loop: the loop runs as it is
    new = [loop for key, loop in loops_of(lm).items()
           if key[0] == (len(LENGTHS), P) and key[2] == (1, 2)]
    assert len(new) == 1
    if keras.backend.backend() in ("jax", "tensorflow"):
        assert new[0].traces == 1


@pytest.mark.parametrize("side", ["left", "right"])
def test_stops_pad_token_id_and_lengths(lm, side):
    rows = _rows(LENGTHS)
    ids, mask = _batch(rows, side)
    free = _right_layout(to_numpy(lm.generate(ids, L, padding_mask=mask)), rows, side)
    stop = int(free[2, len(rows[2]) + 1])  # row 2 stops at its second new token
    tokens, lengths = lm.generate(ids, L, padding_mask=mask, end_token_id=stop,
                                  pad_token_id=PAD, return_lengths=True)
    tokens, lengths = to_numpy(tokens), to_numpy(lengths)
    assert lengths.dtype == np.int32 and lengths.shape == (len(rows),)
    right = _right_layout(tokens, rows, side)
    stopped = 0
    for i, row in enumerate(rows):
        end = L if side == "right" else L - P + len(row)
        hits = np.flatnonzero(free[i, len(row):end] == stop)
        total = len(row) + hits[0] + 1 if hits.size else end
        stopped += bool(hits.size)
        assert lengths[i] == total, (i, lengths[i], total)
        np.testing.assert_array_equal(right[i, :total], free[i, :total])
        assert (right[i, total:end] == PAD).all()
    assert 0 < stopped < len(rows), "some rows stop, some do not"
    # Without pad_token_id: the stop id after the stop (generate's rule).
    plain = _right_layout(to_numpy(lm.generate(ids, L, padding_mask=mask, end_token_id=stop)),
                          rows, side)
    end = L if side == "right" else L - P + len(rows[2])
    assert (plain[2, len(rows[2]) + 2:end] == stop).all()


def test_unpadded_prompt_with_lengths_and_a_full_mask(lm):
    ids = np.stack(_rows((P, P)))
    tokens = to_numpy(lm.generate(ids, L))
    same, lengths = lm.generate(ids, L, padding_mask=np.ones_like(ids), return_lengths=True)
    np.testing.assert_array_equal(to_numpy(same), tokens)
    np.testing.assert_array_equal(to_numpy(lengths), [L, L])


@pytest.mark.parametrize("side", ["left", "right"])
def test_call_with_a_padding_mask_is_each_row_alone(lm, side):
    rows = _rows(LENGTHS)
    ids, mask = _batch(rows, side)
    logits = to_numpy(lm(ids, padding_mask=mask))
    right = _right_layout(np.concatenate([ids, np.zeros((len(rows), L - P), "int32")], 1),
                          rows, side)[:, :P]
    alone = to_numpy(lm(right))  # right padding follows the real tokens: rows alone
    for i, row in enumerate(rows):
        where = mask[i]
        np.testing.assert_allclose(logits[i, where], alone[i, :len(row)], atol=1e-5, rtol=1e-5)
        assert (logits[i, ~where] == 0).all()
    # keras-hub's dict input: what fit and predict pass (traced on JAX and TensorFlow).
    predicted = lm.predict({"token_ids": ids, "padding_mask": mask}, batch_size=len(rows),
                           verbose=0)
    np.testing.assert_allclose(predicted, logits, atol=1e-5, rtol=1e-5)


def test_a_recurrent_state_prefills_the_shortest_row():
    """Gated DeltaNet: pads would fold into the state, so the prefill is the shortest
    row's tokens and the steps feed the rest (its length in the kept loop's key)."""
    linear = keras_attn.TransformerDecoderLayer(
        attention=lambda name, dtype: keras_attn.GatedDeltaNet(
            1, 2, 4, 3, linear_conv_kernel_dim=3, chunk_size=3, name=name, dtype=dtype),
        intermediate_dim=24, normalize_first=True, normalization="rms")
    lm = _lm([linear, _block(rope_max_wavelength=100.0)])
    rows = _rows(LENGTHS[:4])  # 3, 40, 9, 17
    ids, mask = _batch(rows, "left")
    _assert_rows_alone(lm, to_numpy(lm.generate(ids, L, padding_mask=mask)), rows, "left")
    if keras.backend.backend() != "numpy":
        assert [key[-1] for key in loops_of(lm)] == [min(LENGTHS)]


def _bad(*pattern):
    mask = np.ones((2, 5), bool)
    for row, columns in pattern:
        mask[row, columns] = False
    return mask


@pytest.mark.parametrize("mask, match", [
    (_bad((0, 2)), "row 0 = \\[1, 1, 0, 1, 1\\]"),  # a hole
    (_bad((0, slice(0, 5))), "row 0 = \\[0, 0, 0, 0, 0\\]"),  # no real token
    (_bad((0, 0), (1, 4)), "row 0 = \\[0, 1, 1, 1, 1\\]"),  # one row left, one right
])
def test_other_layouts_are_refused_by_name(lm, mask, match):
    ids = np.ones((2, 5), "int32")
    with pytest.raises(ValueError, match=f"`padding_mask` must pad every row.*{match}"):
        lm.generate(ids, 8, padding_mask=mask)
    with pytest.raises(ValueError, match=f"`padding_mask` must pad every row.*{match}"):
        lm(ids, padding_mask=mask)
    with pytest.raises(ValueError, match="`attention_mask` must pad every row"):
        lm.generate(ids, 8, attention_mask=mask)


def test_bad_arguments_are_refused_by_name(lm):
    ids, mask = np.ones((2, 5), "int32"), np.ones((2, 5), bool)
    with pytest.raises(ValueError, match="`padding_mask`.*or `attention_mask`.*not both"):
        lm.generate(ids, 8, padding_mask=mask, attention_mask=mask)
    with pytest.raises(ValueError, match=r"`padding_mask` must be bool or int of the token "
                                         r"ids' shape \(2, 5\).*shape=\(2, 4\)"):
        lm.generate(ids, 8, padding_mask=mask[:, :4])
    with pytest.raises(ValueError, match=r"`padding_mask` must be bool or int.*float32"):
        lm(ids, padding_mask=mask.astype("float32"))
    with pytest.raises(ValueError, match=r"`pad_token_id` must be None or an int id in "
                                         rf"\[0, vocabulary_size\).*pad_token_id={V}"):
        lm.generate(ids, 8, pad_token_id=V)
    with pytest.raises(ValueError, match="`return_lengths` must be a bool.*'yes'"):
        lm.generate(ids, 8, return_lengths="yes")
    with pytest.raises(ValueError, match="A dict input must hold 'token_ids'"):
        lm({"ids": ids})


# transformers' own left-padded generate (PyTorch only).
@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_left_padding_matches_transformers(name):
    if keras.backend.backend() != "torch":
        pytest.skip("transformers runs on PyTorch: the torch environment compares")
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from keras_attn import convert

    from .. import family_cases as fc

    hf = fc.build_hf(name)
    lm = convert.causal_lm_from_transformers(hf)
    vocabulary = fc.config_kwargs(name)["vocab_size"]
    rows = _rows(LENGTHS, seed=5, vocabulary=vocabulary)
    ids, mask = _batch(rows, "left")
    with torch.no_grad():
        out = hf.generate(torch.from_numpy(ids).long(),
                          attention_mask=torch.from_numpy(mask).long(), do_sample=False,
                          max_new_tokens=L - P, min_new_tokens=L - P, pad_token_id=PAD,
                          return_dict_in_generate=True, output_logits=True)
    top = np.sort(np.stack([s.float().numpy() for s in out.logits]), axis=-1)
    assert (top[..., -1] - top[..., -2]).min() > 1e-4, "a near-tie (pick another seed)"
    ours = to_numpy(lm.generate(ids, L, attention_mask=mask))
    np.testing.assert_array_equal(ours, out.sequences.numpy())


# The same comparison under every backend: transformers' tokens stored beside the converted
# model (tools/make_padded_fixtures.py, small shapes; llama's smallest top-2 margin 4.2e-3,
# GPT-2's 6.3e-4).
@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_left_padding_matches_stored_transformers_tokens(name):
    import os

    from ..helpers import keras_version

    here = os.path.join(os.path.dirname(os.path.dirname(__file__)), "assets", "padded")
    with np.load(os.path.join(here, name + ".npz"), allow_pickle=False) as stored:
        ids, mask, expected = stored["token_ids"], stored["mask"], stored["sequences"]
    if keras_version() < (3, 15):
        pytest.skip("the fixture was saved by Keras 3.15")
    lm = keras.saving.load_model(os.path.join(here, name + ".keras"), compile=False)
    np.testing.assert_array_equal(to_numpy(lm.generate(ids, L, attention_mask=mask)), expected)
    # The padding matters: the same ids without their mask decode other tokens.
    assert not np.array_equal(to_numpy(lm.generate(ids, L)), expected)
