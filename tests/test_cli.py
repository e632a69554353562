"""The `keras-attn` command's front door, `keras_attn.cli` (also `python -m keras_attn`).

`--help`, `--version` and `info` start with neither Keras nor TensorFlow
importable and `KERAS_BACKEND` unset (Keras would fall back to TensorFlow and
crash); the other commands check the backend first and say in one line which
variable to set; the processes the command starts hide TensorFlow's C++ logs.
"""

import ast
import importlib.metadata
import json
import os
import pathlib
import subprocess
import sys

import keras
import pytest

import keras_attn
from keras_attn import cli
from keras_attn.parity.cases import CASES

BACKEND = keras.backend.backend()
ROOT = pathlib.Path(__file__).resolve().parents[1]
NOISY = ("KERAS_BACKEND", "TF_CPP_MIN_LOG_LEVEL")
# keras_attn itself is imported (the front door is keras_attn.cli; its face is lazy).
SEEN = ("keras", "tensorflow", "jax", "torch")

# `python -m keras_attn ARGS` (runpy, as -m does), with the modules in BLOCK made
# unimportable first; then, on stderr, the last line: which heavy modules got imported.
_RUN = """
import runpy, sys
for name in {block!r}:
    sys.modules[name] = None  # `import name` raises ImportError, find_spec says absent
sys.argv = ["keras-attn", *sys.argv[1:]]
try:
    runpy.run_module("keras_attn", run_name="__main__", alter_sys=True)
finally:
    seen = sorted(m for m in {seen!r} if sys.modules.get(m) is not None)
    print("imported: " + ",".join(seen), file=sys.stderr)
"""


def _front_door(tmp_path, *args, block=("keras", "tensorflow"), env=None, timeout=300):
    """Run the command in a fresh interpreter: KERAS_BACKEND and TF_CPP_MIN_LOG_LEVEL
    removed, KERAS_HOME empty (no keras.json, so Keras's default: tensorflow)."""
    environ = {k: v for k, v in os.environ.items() if k not in NOISY}
    environ.update(PYTHONPATH=str(ROOT), KERAS_HOME=str(tmp_path), **(env or {}))
    code = _RUN.format(block=tuple(block), seen=SEEN)
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=environ, cwd=tmp_path, timeout=timeout)
    lines = done.stderr.strip().splitlines()
    imported = lines[-1].partition("imported:")[2].strip().split(",") if lines else ["?"]
    done.imported = [m for m in imported if m]
    done.messages = [line for line in lines[:-1] if line.strip()]
    return done


def _unblocked_backends(block):
    return [b for b in cli.installed_backends()
            if not set(cli.REQUIRES[b]) & set(block)]


def test_help_without_keras_or_a_backend(tmp_path):
    done = _front_door(tmp_path, "--help")
    assert done.returncode == 0, done.stderr
    assert done.imported == [], done.imported
    for name in ("info", "example", "parity", "demo", "KERAS_BACKEND", "TF_CPP_MIN_LOG_LEVEL"):
        assert name in done.stdout
    assert done.messages == []


def test_version_without_keras_or_a_backend(tmp_path):
    done = _front_door(tmp_path, "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"keras-attn {keras_attn.__version__}"
    assert done.imported == []


@pytest.mark.parametrize("block", [("keras", "tensorflow"), ("keras",)],
                         ids=["no-keras-no-tensorflow", "no-keras"])
def test_info_without_keras_lists_versions_and_devices(tmp_path, block):
    done = _front_door(tmp_path, "info", block=block)
    assert done.returncode == 0, done.stderr
    assert done.imported == [], done.imported  # the devices come from subprocesses
    out = done.stdout
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert keras_attn.__version__ in lines["keras-attn"]
    assert importlib.metadata.version("keras") in lines["keras"]
    assert "KERAS_BACKEND unset" in lines["backend"]
    assert "tensorflow" in lines["backend"]  # Keras's default, there being no keras.json
    installed = _unblocked_backends(block)
    for backend in cli.BACKENDS:
        line = lines[backend]
        if backend not in installed:
            assert "not installed" in line
        else:
            assert "devices:" in line and "devices unknown" not in line, line
            assert "cpu" in line
    if "tensorflow" in block:
        assert "not installed" in lines["tensorflow"]


def test_info_json_without_keras(tmp_path):
    done = _front_door(tmp_path, "info", "--json", "--no-devices")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["keras_attn"]["version"] == keras_attn.__version__
    assert report["keras"] == importlib.metadata.version("keras")
    assert report["KERAS_BACKEND"] is None
    assert report["keras_backend"] == {"name": "tensorflow", "from": "Keras's default",
                                       "installed": False}
    assert set(report["backends"]) == set(cli.BACKENDS)
    assert done.imported == []


@pytest.mark.parametrize("env, expected", [
    ({}, "KERAS_BACKEND is unset, so Keras would load its default, tensorflow, but "
         "tensorflow is not installed"),
    ({"KERAS_BACKEND": "tensorflow"}, "KERAS_BACKEND=tensorflow, but tensorflow is not installed"),
    ({"KERAS_BACKEND": "tensorfow"}, "KERAS_BACKEND=tensorfow is not one of keras-attn's backends"),
])
@pytest.mark.parametrize("command", ["demo", "example"])
def test_a_command_that_needs_a_backend_says_which_variable_to_set(tmp_path, command, env,
                                                                   expected):
    done = _front_door(tmp_path, command, env=env)
    assert done.returncode == 2
    assert done.imported == []
    assert len(done.messages) == 1, done.messages  # one line, no traceback
    message = done.messages[0]
    assert message.startswith(f"keras-attn: `keras-attn {command}` needs a Keras backend: ")
    assert expected in message and "KERAS_BACKEND" in message
    installed = _unblocked_backends(("keras", "tensorflow"))
    if installed:
        assert f"`KERAS_BACKEND={installed[0]} keras-attn {command}`" in message


def test_a_keras_json_that_chooses_a_missing_backend_is_named(tmp_path):
    (tmp_path / "keras.json").write_text(json.dumps({"backend": "tensorflow"}))
    done = _front_door(tmp_path, "example")
    assert done.returncode == 2
    assert f"{tmp_path / 'keras.json'} chooses tensorflow" in done.messages[0]


def test_parity_help_lists_the_cases_with_keras_backend_unset(tmp_path):
    """TensorFlow absent and KERAS_BACKEND unset: the orchestrator's --help loads an
    installed backend (the help does not depend on it), or says what to install."""
    done = _front_door(tmp_path, "parity", "--help", block=("tensorflow",))
    if _unblocked_backends(("tensorflow",)):
        assert done.returncode == 0, done.stderr
        assert "tensorflow" not in done.imported
        for case in CASES:
            assert case.name in done.stdout
    else:
        assert done.returncode == 2
        assert "none is installed" in done.messages[0] and "KERAS_BACKEND" in done.messages[0]


def test_parity_help_lists_every_case_with_its_description(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["parity", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert f"cases ({len(CASES)};" in out
    for case in CASES:
        line = next(x for x in out.splitlines() if x.split()[:1] == [case.name])
        assert case.description in line  # one case per line, not re-wrapped


def test_quiet_environment_keeps_what_the_user_set(monkeypatch):
    assert cli.quiet_environment({}) == {"TF_CPP_MIN_LOG_LEVEL": "3"}
    assert cli.quiet_environment({"TF_CPP_MIN_LOG_LEVEL": "0"}) == {
        "TF_CPP_MIN_LOG_LEVEL": "0"}
    from keras_attn.parity.cli import _worker_env

    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    assert _worker_env("jax", "cpu")["TF_CPP_MIN_LOG_LEVEL"] == "3"
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "1")
    assert _worker_env("jax", "cpu")["TF_CPP_MIN_LOG_LEVEL"] == "1"


def test_abseil_start_up_lines_are_dropped_and_the_rest_of_stderr_kept(capfd):
    # What TensorFlow 2.21 writes at import on a CPU with oneDNN on, whatever
    # TF_CPP_MIN_LOG_LEVEL says (Abseil logs before absl::InitializeLog() go to stderr).
    with cli._without_native_start_up_logs():
        os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called are "
                    b"written to STDERR\n")
        os.write(2, b"I0000 00:00:1796161905.250845    3114 port.cc:153] oneDNN custom "
                    b"operations are on.\n")
        os.write(2, b"E0000 00:00:1796161905.251 17 cuda_executor.cc:1] failed call to cuInit\n")
        os.write(2, b"a C++ line in another format\n")
        os.write(2, b"UserWarning: a Python warning\n")
    assert capfd.readouterr().err == "a C++ line in another format\nUserWarning: a Python warning\n"


@pytest.mark.skipif("tensorflow" not in cli.installed_backends(),
                    reason="needs TensorFlow, whose start-up logs are the ones hidden")
@pytest.mark.parametrize("backend", ["tensorflow", "jax", "torch"])
def test_every_backend_starts_quietly(tmp_path, backend):
    """With TensorFlow installed, Keras's `set_random_seed` imports it on every backend
    (to seed it too): under JAX and PyTorch its start-up lines came through (issue 38)."""
    if backend not in cli.installed_backends():
        pytest.skip(f"needs {backend} too")
    done = _front_door(tmp_path, "example", block=(), env={"KERAS_BACKEND": backend})
    assert done.returncode == 0, done.stderr
    assert "logits" in done.stdout
    for noise in ("absl::InitializeLog", "cpu_feature_guard", "I0000", "E0000", "oneDNN"):
        assert noise not in done.stderr, done.stderr


def test_the_front_door_imports_only_the_standard_library():
    """At module level and inside its functions: a command's module (which imports Keras)
    is imported by name, in `run_command`, once the backend is checked."""
    tree = ast.parse(pathlib.Path(cli.__file__).read_text())
    top = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            top |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            top.add(node.module.split(".")[0])
    assert top <= set(sys.stdlib_module_names), top
    inner = {node.module for node in ast.walk(tree)
             if isinstance(node, ast.ImportFrom) and node not in tree.body}
    assert inner == set(), inner


def test_the_entry_point_is_the_front_door():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["scripts"] == {"keras-attn": "keras_attn.cli:main"}
    assert "py-modules" not in meta["tool"]["setuptools"]  # no top-level module beside the package


def test_keras_attn_cli_main_runs_a_command_on_the_active_backend(capsys):
    from keras_attn.cli import main

    assert main(["example", "--seed", "1"]) == 0
    assert f"backend: {BACKEND}" in capsys.readouterr().out
