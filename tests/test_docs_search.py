"""The docs site's search finds the converting guide's checkpoint-folder words.

mkdocs' search index splits a page's text with `plugins: search: separator` of
mkdocs.yml; a word is found only if it is a whole token there. Its default (spaces and
hyphens) left `convert.causal_lm_from_pretrained(path)` one token, found by no search
for `causal_lm_from_pretrained`. This reads the separator from mkdocs.yml and splits the
guide's Markdown as the index splits its text (mkdocs is not installed in the test
environments: `tox -e docs` builds the index itself).
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "guides" / "converting.md"


def _separator():
    match = re.search(r"^\s*separator:\s*'(?P<regex>.*)'\s*$",
                      (ROOT / "mkdocs.yml").read_text(encoding="utf-8"), re.MULTILINE)
    assert match, "mkdocs.yml sets no search separator"
    return re.compile(match["regex"])


@pytest.mark.backend_independent
@pytest.mark.parametrize("word", ["safetensors", "from_pretrained", "save_pretrained",
                                  "causal_lm_from_pretrained", "causal_lm_to_pretrained"])
def test_the_converting_guide_is_found_by(word):
    text = GUIDE.read_text(encoding="utf-8")
    tokens = {t.lower() for t in _separator().split(text) if t}
    assert word in tokens, sorted(t for t in tokens if word in t)
