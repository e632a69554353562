"""Text in, text out for a checkpoint folder: its `tokenizer.json` and its stop tokens.

A Hugging Face checkpoint folder carries its tokenizer as `tokenizer.json`
(written by every "fast" tokenizer's `save_pretrained`), which the `tokenizers`
package reads without transformers or torch (`pip install keras-attn[text]`),
and its stop tokens as `eos_token_id` in `generation_config.json` (or, in older
folders, `config.json`). `keras-attn generate PATH --prompt "..."` is built on
these three functions; `generate_text` streams the new text to a callback as
the tokens come.

`tokenizers`' `encode` adds the special tokens the folder's post-processor
defines (Llama's BOS), as transformers' tokenizer call does by default; `decode`
skips special tokens, as `decode(..., skip_special_tokens=True)` does.
"""

import json
import os

import numpy as np

__all__ = ["TextStreamer", "generate_text", "load_tokenizer", "stop_token_ids"]

TOKENIZER_NAME = "tokenizer.json"
GENERATION_CONFIG_NAME = "generation_config.json"


def load_tokenizer(path):
    """The `tokenizers.Tokenizer` of the checkpoint folder `path` (its `tokenizer.json`).

    Args:
        path: the folder (`str` or `os.PathLike`).

    Returns:
        A `tokenizers.Tokenizer`.

    Raises:
        ValueError: the folder has no `tokenizer.json` (a folder with only a
            slow tokenizer's files, e.g. `tokenizer.model`, needs transformers
            to convert it first: `AutoTokenizer.from_pretrained(path)
            .save_pretrained(path)` writes `tokenizer.json`).
        ImportError: `tokenizers` is not installed (the message says how).
    """
    file = os.path.join(os.fspath(path), TOKENIZER_NAME)
    if not os.path.isfile(file):
        present = sorted(os.listdir(path)) if os.path.isdir(path) else None
        raise ValueError(
            f"The checkpoint folder has no {TOKENIZER_NAME} (a fast tokenizer's file, which "
            "the `tokenizers` package reads); a folder with only a slow tokenizer "
            "(tokenizer.model) needs `transformers.AutoTokenizer.from_pretrained(path)"
            ".save_pretrained(path)` once. Received: path="
            f"{os.fspath(path)!r}, files={present}")
    try:
        import tokenizers
    except ImportError as error:
        raise ImportError("Reading tokenizer.json needs the `tokenizers` package: "
                          "`pip install keras-attn[text]` (or `pip install tokenizers`)") from error
    return tokenizers.Tokenizer.from_file(file)


def stop_token_ids(path):
    """The stop token ids of the checkpoint folder `path`, a list (empty if it names none).

    `eos_token_id` (an int or a list) from `generation_config.json`, else from
    `config.json`, as transformers' `generate` reads them.
    """
    for name in (GENERATION_CONFIG_NAME, "config.json"):
        file = os.path.join(os.fspath(path), name)
        if not os.path.isfile(file):
            continue
        with open(file, encoding="utf-8") as handle:
            value = json.load(handle).get("eos_token_id")
        if value is None:
            continue
        values = value if isinstance(value, list) else [value]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
            raise ValueError(f"{name}'s `eos_token_id` must be a token id or a list of them. "
                             f"Received: eos_token_id={value!r}")
        return [int(v) for v in values]
    return []


class TextStreamer:
    """A `streamer=` for `CausalLM.generate` that turns one row's new tokens into text.

    transformers' streamer protocol: `put(ids)` gets the prompt first, then each
    step's new tokens; `end()` once. This one decodes the new tokens of row 0 so
    far at each step and passes `on_text` the text added since the last call, holding
    back a tail that ends in an incomplete character (a byte-level BPE splits
    one character over several tokens; its partial decode ends in U+FFFD).

    Args:
        tokenizer: a `tokenizers.Tokenizer`.
        on_text: `fn(str)`, called with each new piece of text (default: print it,
            flushed, without a newline).
        stop_token_ids: ids that end the text (not decoded, nothing after them).
    """

    def __init__(self, tokenizer, on_text=None, stop_token_ids=()):
        self.tokenizer = tokenizer
        self.on_text = on_text or (lambda text: print(text, end="", flush=True))
        self.stop_token_ids = set(stop_token_ids)
        self._prompt_seen = False
        self._ids = []
        self._stopped = False
        self._printed = 0

    def put(self, ids):
        ids = np.asarray(ids)
        if not self._prompt_seen:  # the prompt, once
            self._prompt_seen = True
            return
        if self._stopped:
            return
        for token in ids.reshape(ids.shape[0], -1)[0].tolist():
            if token in self.stop_token_ids:
                self._stopped = True
                break
            self._ids.append(int(token))
        self._emit(final=False)

    def end(self):
        self._emit(final=True)

    def _emit(self, final):
        text = self.tokenizer.decode(self._ids, skip_special_tokens=True)
        if not final and text.endswith("\ufffd"):
            return  # a character still incomplete: wait for its next token
        if len(text) > self._printed:
            self.on_text(text[self._printed:])
            self._printed = len(text)


def generate_text(lm, tokenizer, prompt, max_new_tokens=32, *, end_token_id=None,
                  on_text=None, **generate_kwargs):
    """`prompt` (a `str`) continued by `lm.generate`: the new text, streamed to `on_text`.

    Args:
        lm: a `keras_attn.CausalLM`.
        tokenizer: its `tokenizers.Tokenizer` (`load_tokenizer`).
        prompt: the text to continue (not empty once encoded).
        max_new_tokens: how many tokens at most to generate (a positive int).
        end_token_id: stop token ids (an int or a list), or None.
        on_text: `fn(str)` called with each new piece of text as it is decoded (None:
            nothing streamed).
        **generate_kwargs: `temperature`, `top_k`, `top_p`, `seed`, ... for
            `lm.generate`.

    Returns:
        The generated text (without the prompt), up to the first stop token.
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or (
            max_new_tokens < 1):
        raise ValueError(f"`max_new_tokens` must be a positive int. "
                         f"Received: max_new_tokens={max_new_tokens!r}")
    if not isinstance(prompt, str):
        raise ValueError(f"`prompt` must be a str. Received: prompt={type(prompt).__name__}")
    ids = tokenizer.encode(prompt).ids
    if not ids:
        raise ValueError(f"`prompt` encodes to no tokens. Received: prompt={prompt!r}")
    stops = [] if end_token_id is None else (
        list(end_token_id) if isinstance(end_token_id, (list, tuple)) else [end_token_id])
    pieces = []
    streamer = TextStreamer(tokenizer, on_text=lambda text: (
        pieces.append(text), on_text(text) if on_text else None), stop_token_ids=stops)
    lm.generate(np.asarray([ids], "int32"), len(ids) + max_new_tokens,
                end_token_id=stops or None, streamer=streamer, **generate_kwargs)
    return "".join(pieces)
