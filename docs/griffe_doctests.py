"""A Griffe extension for the API pages: how keras_attn's docstrings are written.

- Doctests become ```pycon code blocks. The docstrings write their examples as doctests
  right after an `Example:` line at the docstring's own indentation (they run on every
  backend, `tox -e jax` and the others). Google-style parsing keeps that as text, and
  Markdown would read `>>>` as nested block quotes. Each run of doctest lines (a `>>>`
  line up to the next blank line: the source and its expected output) is fenced.
- An `Args:` entry that documents several parameters at once
  (`kernel_initializer, bias_initializer, ...: of the dense kernels ...`) becomes one
  entry per parameter, which Google-style parsing needs (it warns otherwise): each gets
  the description if it is one line, else the first gets it and the others point to it.
- A `Call arguments:` section (Keras's name for what `call` takes) becomes a list, one
  item per argument, instead of one paragraph.

The docstrings themselves are unchanged. mkdocs.yml loads it (mkdocstrings'
`extensions`).
"""

import re

import griffe

_SHARED = re.compile(r"^(?P<names>\w+(?:\s*,\s*\w+)+)\s*:\s*(?P<description>.*)$", re.S)


def fence_doctests(text):
    """`text` with every doctest run outside a fenced block wrapped in ```pycon fences."""
    lines, out, i, fence = text.splitlines(), [], 0, None
    while i < len(lines):
        line = lines[i]
        stripped = line.lstrip()
        indent = line[: len(line) - len(stripped)]
        if fence is None and stripped.startswith(">>>"):
            if out and out[-1].strip():
                out.append("")
            out.append(f"{indent}```pycon")
            while i < len(lines) and lines[i].strip():
                out.append(lines[i])
                i += 1
            out.append(f"{indent}```")
            continue
        if stripped.startswith(("```", "~~~")):
            marker = stripped[:3]
            fence = None if fence == marker else (fence or marker)
        out.append(line)
        i += 1
    return "\n".join(out)


def _sections(text, header, rewrite):
    """`text` with the entry lines of every `header` section (say `Args:`) passed through
    `rewrite(lines, i, item)`, which returns `(new lines, index after them)`; `item` is the
    entries' indent."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        i += 1
        if line.strip() != header:
            continue
        item = line[: len(line) - len(line.lstrip())] + "    "
        while i < len(lines) and (not lines[i].strip() or lines[i].startswith(item)):
            new, i = rewrite(lines, i, item)
            out += new
    return "\n".join(out)


def _split_entry(lines, i, item):
    """One `Args:` entry (with its continuation lines), split if it names several parameters."""
    start, i = i, i + 1
    while i < len(lines) and lines[i].startswith(item + " "):
        i += 1  # the entry's continuation lines
    entry = lines[start:i]
    match = _SHARED.match(" ".join(part.strip() for part in entry))
    if not entry[0].strip() or not match:
        return entry, i
    names = [n.strip() for n in match["names"].split(",")]
    if len(entry) == 1:
        return [f"{item}{name}: {match['description']}" for name in names], i
    # `entry` rejoined: "names: first words" on the first line, then the rest.
    first = " ".join(part.strip() for part in entry)
    description = first[first.index(":") + 1:].strip()
    return [f"{item}{names[0]}: {description}"] + [
        f"{item}{name}: as `{names[0]}`." for name in names[1:]], i


def _list_item(lines, i, item):
    """One line of a `Call arguments:` section: an entry's first line becomes a list item."""
    entry = lines[i]
    if entry.strip() and not entry.startswith(item + " "):
        name, colon, rest = entry.strip().partition(":")
        entry = f"{item}- `{name}`:{rest}" if colon else f"{item}- {entry.strip()}"
    return [entry], i + 1


def split_shared_args(text):
    """`text` with each `Args:` entry naming several parameters split into one per name."""
    return _sections(text, "Args:", _split_entry)


def list_call_arguments(text):
    """The entries of each `Call arguments:` section as Markdown list items."""
    return _sections(text, "Call arguments:", _list_item)


class FenceDoctests(griffe.Extension):
    """Fence the doctests and split the shared `Args:` entries of every docstring."""

    def on_instance(self, *, obj, **kwargs):
        if obj.docstring is None:
            return
        value = list_call_arguments(split_shared_args(obj.docstring.value))
        if ">>>" in value:
            value = fence_doctests(value)
        obj.docstring.value = value
