"""Structure facts of the code below the layers (issue 32).

No function below `layers/` takes more than 6 positional arguments: what a kernel needs
beyond its tensors travels in one `KernelSpec` (or by keyword), so a new option is a
field, not one more position in a dozen signatures. The public
functions and constructors keep their released signatures (a contract: argument
orders stay): `scaled_dot_product_attention` (torch's and keras's take their options
positionally too), `rotary_embedding` and `RotaryEmbedding` (keras-hub's order first).
"""

import ast
import pathlib

import keras_attn

PACKAGE = pathlib.Path(keras_attn.__file__).parent
MAX_POSITIONAL = 6
# DESIGN.md's map: everything below layers/ (the kernels, the policy and the masks, the
# options, shapes and checks, RoPE, the cache and the decode loop).
BELOW_LAYERS = ("attention.py", "_kernels", "_policy.py", "_masks.py", "options.py",
                "_shapes.py", "_validation.py", "rotary.py", "cache.py", "_cache_rules.py",
                "generation.py", "_spec.py", "rope_spec.py", "linear_attention.py",
                "recurrent_cache.py")
CONTRACT = {"attention.py:scaled_dot_product_attention", "rotary.py:rotary_embedding",
            "rotary.py:__init__"}  # RotaryEmbedding.__init__


def positional_count(function):
    args = function.args
    count = len(args.posonlyargs) + len(args.args)
    if args.args and args.args[0].arg in ("self", "cls"):
        count -= 1
    return count


def offenders(paths, limit=MAX_POSITIONAL):
    found = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                count = positional_count(node)
                if count > limit or node.args.vararg is not None and count >= limit:
                    found[f"{path.relative_to(PACKAGE)}:{node.name}"] = count
    return found


def _below_layers():
    paths = []
    for name in BELOW_LAYERS:
        target = PACKAGE / name
        paths += sorted(target.rglob("*.py")) if target.is_dir() else [target] * target.exists()
    return paths


def test_the_walk_finds_the_kernels():
    names = {p.name for p in _below_layers()}
    assert {"attention.py", "explicit.py", "blockwise.py", "fused.py", "blocks.py"} <= names


def test_no_function_below_the_layers_takes_more_than_six_positional_arguments():
    found = {k: v for k, v in offenders(_below_layers()).items() if k not in CONTRACT}
    assert not found, f"more than {MAX_POSITIONAL} positional arguments: {found}"


def test_the_check_can_fail(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(a, b, c, d, e, f, g):\n    pass\n"
                   "def ok(a, b, c, d, e, f, *, g=1):\n    pass\n"
                   "class C:\n    def m(self, a, b, c, d, e, f):\n        pass\n")
    global PACKAGE
    saved, PACKAGE = PACKAGE, tmp_path
    try:
        assert offenders([bad]) == {"bad.py:f": 7}
    finally:
        PACKAGE = saved
