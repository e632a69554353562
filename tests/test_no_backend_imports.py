"""The package's promise: library code never imports a backend directly.

The library is every module but the backend boundary (`_device`) and the demo, which,
like the tools and the benchmarks, is an application of the library and may use a
backend's own engine (its data-parallel training, `demo/data_parallel.py`).
"""

import ast
import pathlib

import keras_attn

BACKENDS = {"tensorflow", "jax", "jaxlib", "torch", "tf_keras"}
PACKAGE = pathlib.Path(keras_attn.__file__).parent
# The backend boundary: the package whose job is to inspect devices, take
# gradients of arbitrary functions and run a backend's own engines. Layers and
# the core must not import it.
BOUNDARY = {"_device"}
APPLICATIONS = {"demo"}


def _imported_roots(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module.split(".")[0]


def _modules():
    return sorted(p for p in PACKAGE.rglob("*.py")
                  if p.relative_to(PACKAGE).parts[0] not in BOUNDARY | APPLICATIONS)


def test_walk_finds_the_layers():
    names = {p.name for p in _modules()}
    assert {"attention.py", "multi_head_attention.py", "transformer_encoder.py",
            "worker.py"} <= names


def test_no_module_imports_a_backend():
    offenders = {str(p.relative_to(PACKAGE)): sorted(set(_imported_roots(p)) & BACKENDS)
                 for p in _modules()}
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, f"backend imports in keras_attn: {offenders}"


def test_layers_do_not_reach_the_boundary():
    for path in _modules():
        text = path.read_text()
        if "layers" in path.parts or path.name == "attention.py":
            assert "_device" not in text, f"{path.name} uses the backend boundary"


def test_the_check_detects_an_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import numpy\nfrom torch import nn\nimport jax.numpy as jnp\n")
    assert set(_imported_roots(bad)) & BACKENDS == {"torch", "jax"}
