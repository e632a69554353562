"""Text in, text out: `keras_attn.text` and `keras-attn generate PATH --prompt ...`.

The folder is tests/assets/pretrained/llama (written by transformers' `save_pretrained`,
random weights) with a `tokenizer.json` made here by `tokenizers` (a word-level
vocabulary of the model's 32 ids, a BOS post-processor as Llama's), so nothing is
downloaded. Every backend runs it; torch and transformers are never imported.
"""

import json
import os
import shutil

import numpy as np
import pytest

from keras_attn import cli, text
from keras_attn.convert import causal_lm_from_pretrained

pytest.importorskip("safetensors")
tokenizers = pytest.importorskip("tokenizers")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMA = os.path.join(ROOT, "tests", "assets", "pretrained", "llama")
WORDS = ["<s>", "</s>"] + [f"w{i}" for i in range(30)]  # V = 32 ids
PROMPT = "w3 w7 w1 w12"
NEW = 12


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)},
                                           unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 0)])
    tokenizer.add_special_tokens(["<s>", "</s>"])
    return tokenizer


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama_text") / "llama"
    shutil.copytree(LLAMA, path)
    _tokenizer().save(str(path / "tokenizer.json"))
    return path


@pytest.fixture(scope="module")
def greedy(folder):
    """The prompt's ids and the model's NEW greedy tokens, without a streamer."""
    lm = causal_lm_from_pretrained(folder)
    ids = _tokenizer().encode(PROMPT).ids
    tokens = np.asarray(lm.generate(np.asarray([ids], "int32"), len(ids) + NEW))
    return lm, ids, tokens[0, len(ids):].tolist()


def test_the_prompt_is_encoded_with_the_folders_special_tokens(greedy):
    _, ids, _ = greedy
    assert ids == [0, 5, 9, 3, 14]  # <s> w3 w7 w1 w12


def test_generate_text_streams_the_greedy_tokens_as_text(greedy):
    lm, _, new = greedy
    tokenizer = _tokenizer()
    pieces = []
    result = text.generate_text(lm, tokenizer, PROMPT, NEW, on_text=pieces.append)
    assert result == tokenizer.decode(new, skip_special_tokens=True)
    assert "".join(pieces) == result
    assert len(pieces) > 1  # streamed, not printed once at the end


def test_a_stop_token_ends_the_text(greedy, tmp_path, folder):
    lm, _, new = greedy
    stop = next(t for t in new[2:] if t not in new[:2])  # a token first generated later
    cut = new.index(stop)
    shutil.copytree(folder, tmp_path / "with_stop")
    (tmp_path / "with_stop" / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [31, stop]}))
    assert text.stop_token_ids(tmp_path / "with_stop") == [31, stop]
    result = text.generate_text(lm, _tokenizer(), PROMPT, NEW,
                                end_token_id=text.stop_token_ids(tmp_path / "with_stop"))
    assert result == _tokenizer().decode(new[:cut], skip_special_tokens=True)


def test_the_command_prints_the_prompt_and_the_same_text(folder, greedy, capsys):
    _, _, new = greedy
    status = cli.main(["generate", str(folder), "--prompt", PROMPT,
                       "--max-new-tokens", str(NEW)])
    out, err = capsys.readouterr()
    assert status == 0, err
    assert out == PROMPT + _tokenizer().decode(new, skip_special_tokens=True) + "\n"
    assert "loading" in err and "loaded in" in err  # progress on stderr, not stdout


def test_the_command_samples_reproducibly(folder, capsys):
    argv = ["generate", str(folder), "--prompt", PROMPT, "--max-new-tokens", "6",
            "--temperature", "1.5", "--seed", "3"]
    assert cli.main(argv) == 0
    first = capsys.readouterr().out
    assert cli.main(argv) == 0
    assert capsys.readouterr().out == first


def test_a_folder_without_tokenizer_json_is_refused_by_name(tmp_path, capsys):
    shutil.copytree(LLAMA, tmp_path / "bare")
    with pytest.raises(ValueError, match="no tokenizer.json"):
        text.load_tokenizer(tmp_path / "bare")
    assert cli.main(["generate", str(tmp_path / "bare"), "--prompt", "w1"]) == 2
    assert "tokenizer.json" in capsys.readouterr().err


@pytest.mark.parametrize("kwargs, match", [
    ({"max_new_tokens": 0}, "max_new_tokens=0"),
    ({"prompt": 3}, "prompt=int"),
])
def test_bad_arguments_are_named(greedy, kwargs, match):
    lm = greedy[0]
    arguments = {"prompt": PROMPT, "max_new_tokens": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        text.generate_text(lm, _tokenizer(), **arguments)


def test_a_bad_eos_token_id_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": "x"}))
    with pytest.raises(ValueError, match="eos_token_id"):
        text.stop_token_ids(tmp_path)
