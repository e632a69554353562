"""`keras-attn demo`: data, greedy decoding, options, and a tiny end-to-end run."""

import numpy as np
import pytest

from keras_attn.cli import main
from keras_attn.demo.data import END, PAD, START, VOCAB_SIZE, decode_tokens, make_split
from keras_attn.demo.decode import cached_decode, exact_match, greedy_decode

TINY = ["--epochs", "1", "--num-train", "256", "--num-test", "32", "--max-length", "4",
        "--model-dim", "16", "--num-layers", "1", "--batch-size", "32", "--examples", "2"]


@pytest.mark.parametrize("task", ["reverse", "sort", "copy"])
def test_data_layout_and_held_out_split(task):
    (src, dec, tgt), (test_src, _, _) = make_split(task, 300, 50, 2, 6, seed=1)
    assert src.shape == (300, 6) and dec.shape == tgt.shape == (300, 7)
    for s, d, t in zip(src, dec, tgt, strict=True):
        digits = decode_tokens(s)
        expected = {"reverse": digits[::-1], "sort": "".join(sorted(digits)),
                    "copy": digits}[task]
        assert 2 <= len(digits) <= 6
        assert decode_tokens(t) == expected
        n = len(digits)
        assert t[n] == END and not t[n + 1:].any() and not s[n:].any()
        assert d[0] == START and (d[1:n + 1] == t[:n]).all() and not d[n + 1:].any()
    train = {tuple(s) for s in src}
    assert not any(tuple(s) in train for s in test_src)


class _Oracle:
    """A stand-in model whose logits at step t are the right next token,
    provided the decoder inputs so far are right (so errors would compound)."""

    def __init__(self, sources, targets):
        self.sources = sources
        self.targets = targets
        self.calls = 0

    def predict_on_batch(self, inputs):
        src, dec = inputs
        self.calls += 1
        n, length = dec.shape
        logits = np.zeros((n, length, VOCAB_SIZE), "float32")
        logits[:, :, PAD] = 10.0  # never chosen: greedy decoding excludes padding
        rows = {tuple(s): i for i, s in enumerate(self.sources)}
        for b in range(n):
            t = self.targets[rows[tuple(src[b])]]
            for p in range(length):
                ok = (dec[b, 1:p + 1] == t[:p]).all()
                logits[b, p, t[p] if ok else 3] = 5.0
        return logits


def test_greedy_decode_feeds_its_own_predictions():
    _, (src, _, tgt) = make_split("reverse", 10, 20, 2, 5, seed=3)
    oracle = _Oracle(src, tgt)
    predicted = greedy_decode(oracle, src, tgt.shape[1], batch_size=8)
    assert exact_match(predicted, tgt).all()
    assert oracle.calls <= 3 * tgt.shape[1]  # 3 batches, at most T steps each
    wrong = predicted.copy()
    wrong[0, 0] = 3 if wrong[0, 0] != 3 else 4
    assert exact_match(wrong, tgt).tolist() == [False] + [True] * 19


def test_build_model_functional_shapes():
    from keras_attn.demo.model import build_model

    model = build_model(VOCAB_SIZE, 5, 6, model_dim=16, num_heads=2, intermediate_dim=32,
                        num_layers=1)
    src = np.array([[4, 5, 0, 0, 0]], "int32")
    dec = np.array([[START, 5, 4, END, 0, 0]], "int32")
    logits = np.asarray(model.predict_on_batch([src, dec]))
    assert logits.shape == (1, 6, VOCAB_SIZE) and np.isfinite(logits).all()
    # Causal: changing a later decoder token leaves earlier positions alone.
    dec2 = dec.copy()
    dec2[0, 3] = 7
    logits2 = np.asarray(model.predict_on_batch([src, dec2]))
    np.testing.assert_allclose(logits2[0, :3], logits[0, :3], rtol=1e-5, atol=1e-5)
    assert not np.allclose(logits2[0, 3], logits[0, 3])


def test_attention_scores_match_the_model_and_skip_padding():
    from keras_attn.demo.model import attention_scores, build_model

    model = build_model(VOCAB_SIZE, 5, 6, model_dim=16, num_heads=2, intermediate_dim=32,
                        num_layers=2)
    src = np.array([[4, 5, 6, 0, 0], [7, 8, 9, 10, 11]], "int32")
    dec = np.array([[START, 6, 5, 4, 0, 0], [START, 11, 10, 9, 8, 7]], "int32")
    maps = attention_scores(model, src, dec)
    np.testing.assert_allclose(maps["logits"], np.asarray(model.predict_on_batch([src, dec])),
                               rtol=1e-5, atol=1e-5)
    assert [m.shape for m in maps["encoder"]] == [(2, 2, 5, 5)] * 2
    assert [m.shape for m in maps["decoder_self"]] == [(2, 2, 6, 6)] * 2
    assert [m.shape for m in maps["decoder_cross"]] == [(2, 2, 6, 5)] * 2
    for cross in maps["decoder_cross"]:
        assert np.all(cross[0, :, :, 3:] == 0)  # padded memory is never attended
        np.testing.assert_allclose(cross[1].sum(-1), 1.0, rtol=1e-5)
    for self_scores in maps["decoder_self"]:
        assert np.all(np.triu(self_scores[1], k=1) == 0)  # causal


def test_cached_decode_matches_uncached_greedy_decode():
    """`generate` with self- and cross-attention caches, against the Functional model
    run on the whole decoder input at every step (no cache)."""
    from keras_attn.demo.model import build_model
    from keras_attn.testing.weights import randomize_weights

    model = build_model(VOCAB_SIZE, 5, 6, model_dim=16, num_heads=2, intermediate_dim=32,
                        num_layers=2)
    randomize_weights(model, seed=6, scale=0.3)  # varied outputs; biases, norms off defaults
    _, (src, _, _) = make_split("reverse", 10, 24, 2, 5, seed=3)
    expected = greedy_decode(model, src, 6)
    decoded = cached_decode(model, src, 6)
    assert decoded.shape == expected.shape
    assert exact_match(decoded, expected).all()
    assert len({tuple(row) for row in expected}) > 3, "near-constant outputs would test little"


@pytest.mark.parametrize("argv", [
    ["--task", "shuffle"], ["--epochs", "0"], ["--epochs", "two"], ["--num-train", "-5"],
    ["--learning-rate", "0"], ["--model-dim", "30"], ["--unknown"],
])
def test_bad_options_are_argparse_errors(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", *argv])
    assert exit_info.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_unwritable_output_fails_before_training(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    assert main(["demo", *TINY, "--output", str(blocker / "out")]) == 2
    captured = capsys.readouterr()
    assert "cannot write to --output" in captured.err
    assert "backend:" not in captured.out  # nothing started


@pytest.mark.requires_trainable_backend
def test_demo_smoke_saves_reloads_and_decodes_identically(tmp_path, capsys):
    assert main(["demo", *TINY, "--output", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "backend: " in out and "exact-sequence accuracy" in out
    assert "reloaded model decodes identically: yes" in out
    assert "gives the same sequences as uncached: yes" in out
    assert (tmp_path / "reverse.keras").stat().st_size > 0


# ---------------------------------------------------------------------------
# --task add: the decoder-only adder.


def test_addition_data_layout_answers_and_held_out_split():
    from keras_attn.demo.addition import EQUALS, PLUS, make_addition_split, render, teacher_forcing

    train, test = make_addition_split(300, 50, 3, seed=2)
    assert train.shape == (300, 12) and test.shape == (50, 12)
    for row in np.concatenate([train, test]):
        text = render(row, 3)
        a, rest = text.split("+")
        b, answer = rest.split("=")
        assert len(a) == len(b) == 3 and len(answer) == 4
        assert int(answer) == int(a) + int(b)
        # The stored answer is least significant digit first.
        assert "".join(map(str, row[8:])) == answer[::-1]
        assert row[3] == PLUS and row[7] == EQUALS
    assert not {tuple(r[:8]) for r in train} & {tuple(r[:8]) for r in test}
    inputs, targets, weights = teacher_forcing(train, 3)
    np.testing.assert_array_equal(inputs[:, 1:], targets[:, :-1])
    assert weights.shape == targets.shape
    assert (weights[:, 7:] == 1).all() and (weights[:, :7] == 0).all()  # answer tokens only
    with pytest.raises(ValueError, match=r"Received: digits=0"):
        make_addition_split(10, 10, 0, seed=0)
    with pytest.raises(ValueError, match=r"num_train=60, num_test=1"):
        make_addition_split(60, 1, 1, seed=0)


def test_add_generation_cached_matches_uncached_and_the_model():
    from keras_attn.demo.addition import build_language_model, generate_answers
    from keras_attn.testing.weights import randomize_weights

    digits, prompt_length = 2, 6
    model = build_language_model(8, model_dim=16, num_layers=2)
    randomize_weights(model, seed=1, scale=0.3)
    prompts = np.random.default_rng(0).integers(0, 10, (6, prompt_length)).astype("int32")
    cached = generate_answers(model, prompts, digits + 1)
    uncached = generate_answers(model, prompts, digits + 1, use_cache=False)
    np.testing.assert_array_equal(cached[:, :prompt_length], prompts)
    np.testing.assert_array_equal(cached, uncached)
    # Independently: one causal forward of the Functional model over each sequence.
    logits = np.asarray(model.predict_on_batch(cached[:, :-1]))
    np.testing.assert_array_equal(cached[:, prompt_length:],
                                  logits[:, prompt_length - 1:].argmax(-1))
    assert len(set(cached[:, prompt_length:].ravel())) > 2, "a constant output tests little"


@pytest.mark.requires_trainable_backend
def test_add_demo_smoke_generates_and_reloads_identically(tmp_path, capsys):
    argv = ["demo", "--task", "add", "--digits", "1", "--epochs", "1", "--num-train", "40",
            "--num-test", "8", "--model-dim", "16", "--num-layers", "1", "--batch-size", "20",
            "--examples", "1", "--output", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "exact answers" in out and "agrees with the uncached model: yes" in out
    # The header says in which digit order the answers are printed, and they are in it.
    assert "least significant digit first" in out and "printed most significant digit first" in out
    example = next(line for line in out.splitlines() if "(target " in line).split()
    a, rest = example[0].split("+")
    b, answer = rest.split("=")
    assert example[2].rstrip(")") == f"{int(a) + int(b):02d}"  # the target, usual order
    assert example[-1] != "ok" or int(answer) == int(a) + int(b)
    assert "reloaded model generates identically: yes" in out
    assert (tmp_path / "add.keras").stat().st_size > 0
