"""Every ```python block of README.md and docs/**/*.md runs, on this backend.

The blocks of one file share a namespace and run in order, as a reader would run them,
except the README's: a reader copies one of those alone, so each runs alone, in a fresh
namespace (`STANDALONE`), and one that uses an earlier block's names fails. A
block that needs something special declares it in an HTML comment on the line (or the
lines) right before its fence, and is skipped, with that requirement as the reason, only
where the environment lacks it:

    <!-- requires: backend=jax, devices=8 -->
    <!-- requires: trainable-backend -->
    <!-- requires: module=torch -->
    <!-- skip: what the block is (for a block that cannot run anywhere) -->

Requirements (comma-separated, all must hold):

- `backend=NAME` (or `backend=jax|torch`): the Keras backend is one of these;
- `devices=N`: `keras.distribution.list_devices()` has at least N devices (JAX only:
  Keras implements `keras.distribution` on no other backend);
- `trainable-backend`: the backend can train (not numpy);
- `module=NAME`: the module is importable (torch, transformers, ...);
- `own-process`: not a requirement but how the block runs: as a script of its own in a
  fresh Python process (`__name__ == "__main__"`, no shared namespace), for a block that
  must configure a backend before it starts or that spawns processes.

An unknown requirement fails the block instead of skipping it, so that a typo cannot hide
a block. A block skipped here leaves the file's later blocks to declare what they need
from it: a later block that uses its names fails (never skips) where it did not run. Each
block runs from `compile(..., "FILE:LINE")`, so a traceback points at the Markdown line.
A test's id names what its block requires (`docs/guides/scaling-out.md:20+backend+devices`):
`tox -e multidevice` runs `-k devices`, the blocks that need its 8 JAX devices; the
backend environments run the rest.
"""

import importlib.util
import os
import re
from pathlib import Path

import keras
import pytest

ROOT = Path(__file__).resolve().parent.parent
BACKEND = keras.backend.backend()
TRAINABLE = BACKEND in ("tensorflow", "jax", "torch")

FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)")
DIRECTIVE = re.compile(r"^\s*<!--\s*(?P<kind>requires|skip)\s*:\s*(?P<value>.*?)\s*-->\s*$")


def markdown_files():
    """README.md, then every docs/**/*.md that is a real file (not under a symlinked folder)."""
    files = [ROOT / "README.md"]
    for folder, dirs, names in os.walk(ROOT / "docs"):  # followlinks=False: docs/notebooks
        dirs[:] = sorted(d for d in dirs if not os.path.islink(os.path.join(folder, d)))
        files += [Path(folder) / n for n in sorted(names) if n.endswith(".md")]
    return files


def python_blocks(path):
    """`(line, code, directives)` of each ```python block: line is the fence's, 1-based."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        fence, indent = match["fence"], len(match["indent"])
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        if match["info"].lower() in ("python", "py"):
            directives, j = [], i - 1
            while j >= 0 and DIRECTIVE.match(lines[j]):
                directives.insert(0, DIRECTIVE.match(lines[j]).group("kind", "value"))
                j -= 1
            code = "\n".join(line[indent:] for line in lines[i + 1:end])
            blocks.append((i + 1, code, directives))
        i = end + 1
    return blocks


def _devices():
    if BACKEND != "jax":
        return 0
    return len(keras.distribution.list_devices())


def unmet(directives):
    """Why this environment cannot run the block (None: it can). Unknown names raise."""
    reasons = []
    for kind, value in directives:
        if kind == "skip":
            if not value:
                raise ValueError("`<!-- skip: ... -->` needs a reason")
            reasons.append(f"declared skip: {value}")
            continue
        for requirement in (r.strip() for r in value.split(",") if r.strip()):
            name, _, arg = (p.strip() for p in requirement.partition("="))
            if name == "backend" and arg:
                wanted = arg.split("|")
                if BACKEND not in wanted:
                    reasons.append(f"requires backend={arg} (this is {BACKEND})")
            elif name == "devices" and arg.isdigit():
                found = _devices()
                if found < int(arg):
                    reasons.append(f"requires devices={arg} (found {found} on {BACKEND}; "
                                   "`tox -e multidevice` has 8)")
            elif name == "trainable-backend" and not arg:
                if not TRAINABLE:
                    reasons.append(f"requires trainable-backend (the {BACKEND} backend cannot train)")
            elif name == "module" and arg:
                if importlib.util.find_spec(arg) is None:
                    reasons.append(f"requires module={arg} (not installed)")
            elif name == "own-process" and not arg:
                pass
            else:
                raise ValueError(f"unknown requirement {requirement!r} in `<!-- requires: {value} -->`")
    return "; ".join(reasons) or None


# The files whose every block runs alone, in a namespace of its own.
STANDALONE = {ROOT / "README.md"}

BLOCKS = [(path, line, code, directives)
          for path in markdown_files() for line, code, directives in python_blocks(path)]


class _File:
    """One Markdown file's namespace, and how far into its blocks it has run."""

    def __init__(self):
        self.namespace = {"__name__": "__docs__"}
        self.done = set()      # lines of the blocks that ran
        self.failed = {}       # line -> the error of a block that raised


_FILES = {}


@pytest.fixture(autouse=True)
def _fresh_state(request):
    """Overrides conftest's: a fresh Keras session and float32 at a file's first block only.

    A file's blocks share their models from block to block; clearing the session
    between them renames the ops of models that live on (Keras 3.9 then refuses to
    reload a model built before the clear: 'The name "not_equal" is used 2 times').
    """
    params = getattr(getattr(request.node, "callspec", None), "params", {})
    if _state_key(params.get("path"), params.get("line")) not in _FILES:
        keras.config.set_dtype_policy("float32")
        keras.backend.clear_session()
    yield


def _state_key(path, line):
    """A file's shared namespace, or a README block's own."""
    return (path, line) if path in STANDALONE else path


def _run(path, line, code, state):
    source = "\n" * (line) + code  # line numbers in tracebacks are the Markdown file's
    exec(compile(source, f"{path.relative_to(ROOT)}:{line}", "exec"), state.namespace)


def _own_process(directives):
    return any(r.strip() == "own-process" for kind, value in directives if kind == "requires"
               for r in value.split(","))


def _run_in_own_process(path, line, code, tmp_path):
    """Run the block as a script in a fresh interpreter; fail with its output."""
    import sys

    from tests.helpers import run_in_own_group

    script = tmp_path / f"{path.stem}_{line}.py"
    script.write_text("\n" * line + code)  # line numbers are the Markdown file's
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    result = run_in_own_group([sys.executable, str(script)], cwd=tmp_path, env=env,
                              timeout=300)
    assert result.returncode == 0, (f"{path.relative_to(ROOT)}:{line} exited "
                                    f"{result.returncode}:\n{result.stdout[-3000:]}"
                                    f"{result.stderr[-3000:]}")


def _block_id(path, line, directives):
    """`docs/x.md:12`, plus `+devices` etc. for what it requires (`-k devices` selects those)."""
    names = [r.split("=")[0].strip() for kind, value in directives if kind == "requires"
             for r in value.split(",") if r.strip()]
    return f"{path.relative_to(ROOT).as_posix()}:{line}" + "".join(f"+{n}" for n in names)


@pytest.mark.parametrize(
    ("path", "line", "code", "directives"), BLOCKS,
    ids=[_block_id(p, line, directives) for p, line, _, directives in BLOCKS])
def test_block_runs(path, line, code, directives, tmp_path):
    reason = unmet(directives)
    if reason:
        pytest.skip(reason)
    if _own_process(directives):
        _run_in_own_process(path, line, code, tmp_path)
        return
    state = _FILES.setdefault(_state_key(path, line), _File())
    # Run the file's earlier blocks first (in order) if this test runs alone (-k, a rerun).
    for earlier_line, earlier_code, earlier_directives in python_blocks(path):
        if earlier_line >= line or path in STANDALONE:
            break
        if (earlier_line in state.done or unmet(earlier_directives)
                or _own_process(earlier_directives)):
            continue
        if earlier_line in state.failed:
            pytest.fail(f"the block at line {earlier_line} of this file failed: "
                        f"{state.failed[earlier_line]!r}")
        _run(path, earlier_line, earlier_code, state)
        state.done.add(earlier_line)
    if line in state.done:
        return
    try:
        _run(path, line, code, state)
    except BaseException as error:
        state.failed[line] = error
        raise
    state.done.add(line)


def test_the_examples_are_found():
    """The collector sees the README and the guides, and no requirement is misspelt."""
    files = {p.relative_to(ROOT).as_posix() for p, *_ in BLOCKS}
    assert "README.md" in files and "docs/guides/cache.md" in files, files
    assert len(BLOCKS) >= 20, len(BLOCKS)
    for _, _, _, directives in BLOCKS:
        unmet(directives)  # raises on an unknown requirement


def test_a_failing_block_fails(tmp_path):
    """A block that raises is reported as the failure it is, at its Markdown line."""
    page = tmp_path / "page.md"
    page.write_text("Text.\n\n```python\nx = 1\n```\n\n<!-- requires: module=math -->\n"
                    "```python\nassert x == 2, 'wrong'\n```\n", encoding="utf-8")
    blocks = python_blocks(page)
    assert [(line, directives) for line, _, directives in blocks] == [
        (3, []), (8, [("requires", "module=math")])]
    assert unmet(blocks[1][2]) is None
    namespace = {}
    exec(compile("\n" * 3 + blocks[0][1], "page.md:3", "exec"), namespace)
    with pytest.raises(AssertionError, match="wrong") as failure:
        exec(compile("\n" * 8 + blocks[1][1], "page.md:8", "exec"), namespace)
    assert failure.traceback[-1].lineno + 1 == 9  # the line of the assert, 1-based
    with pytest.raises(ValueError, match="unknown requirement"):
        unmet([("requires", "backend")])
