"""The lazy package face: `import keras_attn` imports no Keras; every public name resolves."""

import os
import pathlib
import subprocess
import sys

import keras

import keras_attn

ROOT = pathlib.Path(__file__).resolve().parents[1]
SAVED = ROOT / "tests" / "assets" / "saved_by_0_1_0.keras"


def _python(code, block=()):
    lines = [f"import sys; sys.modules[{m!r}] = None" for m in block] + [code]
    env = dict(os.environ, PYTHONPATH=str(ROOT), KERAS_BACKEND=keras.backend.backend())
    return subprocess.run([sys.executable, "-c", "\n".join(lines)], capture_output=True,
                          text=True, env=env, timeout=300)


def test_every_public_name_resolves():
    for name in keras_attn.__all__:
        assert getattr(keras_attn, name) is not None, name
    assert set(keras_attn.__all__) <= set(dir(keras_attn))
    assert keras_attn.observe_paths is keras_attn._observe.observe_paths  # public now


def test_import_keras_attn_imports_no_keras():
    done = _python("import keras_attn, sys\n"
                   "assert sys.modules.get('keras') is None, 'keras imported'\n"
                   "print(keras_attn.__version__, 'MultiHeadAttention' in dir(keras_attn))",
                   block=("keras", "tensorflow", "jax", "torch"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [keras_attn.__version__, "True"]


def test_an_unknown_name_is_an_attribute_error():
    done = _python("import keras_attn\ntry:\n    keras_attn.MultiheadAttention\n"
                   "except AttributeError as e:\n    print(e)", block=("keras",))
    assert "has no attribute 'MultiheadAttention'" in done.stdout, done.stderr


def test_saved_files_load_after_keras_or_after_register():
    load = f"keras.saving.load_model({str(SAVED)!r})"
    # Keras first: `import keras_attn` registers the layers at once.
    done = _python(f"import keras\nimport keras_attn\n{load}")
    assert done.returncode == 0, done.stderr
    # keras_attn first, then Keras: `register()` (or any layer name used) does.
    done = _python(f"import keras_attn\nimport keras\nkeras_attn.register()\n{load}")
    assert done.returncode == 0, done.stderr
    # The check can fail: without either, Keras cannot find the classes.
    done = _python(f"import keras_attn\nimport keras\n{load}")
    assert done.returncode != 0 and "MultiHeadAttention" in done.stderr
