"""`keras_attn.convert` from Keras's MultiHeadAttention, and the state-dict checks every
converter shares (NumPy arrays: no torch needed), on every backend.

The torch converters are tested in `test_convert_torch.py`, which needs torch.
"""

import ast
import pathlib
import re
import sys

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn import convert
from keras_attn.testing.weights import randomize_weights

from ..helpers import assert_close, randn, rng, to_numpy

B, T, S = 2, 5, 7
D_Q, D_K, D_V = 6, 9, 5

CONFIGS = {
    "plain": {"num_heads": 2, "key_dim": 4, "value_dim": 3},
    "output_shape": {"num_heads": 2, "key_dim": 4, "value_dim": 3, "output_shape": 7},
    "no_bias": {"num_heads": 2, "key_dim": 4, "value_dim": 3, "use_bias": False},
}


def _inputs(mode, causal, seed):
    """Keyword inputs for Keras's layer (`query`, `value`, maybe `key`) and for ours."""
    g = rng(seed)
    length = T if causal or mode == "self" else S  # causal masks are compared for T == S only
    x = randn(g, B, T, D_Q)
    if mode == "self":
        keras_kwargs = {"query": x, "value": x}
    elif mode == "cross":
        keras_kwargs = {"query": x, "value": randn(g, B, length, D_V)}
    else:  # "cross_key": a key of its own width
        keras_kwargs = {"query": x, "value": randn(g, B, length, D_V), "key": randn(g, B, length, D_K)}
    # Ours gets every tensor by keyword (Keras's default key = value made explicit).
    ours_kwargs = dict(keras_kwargs)
    ours_kwargs.setdefault("key", ours_kwargs["value"])
    return keras_kwargs, ours_kwargs, length


def _keras_layer(config, keras_kwargs, seed):
    layer = keras.layers.MultiHeadAttention(**config)
    layer.build(**{f"{name}_shape": tensor.shape for name, tensor in keras_kwargs.items()})
    randomize_weights(layer, seed=seed)
    return layer


@pytest.mark.parametrize("mask", ["none", "causal", "attention_mask", "both"])
@pytest.mark.parametrize("mode", ["self", "cross", "cross_key"])
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_from_keras_matches_keras(config, mode, mask):
    causal = mask in ("causal", "both")
    keras_kwargs, ours_kwargs, length = _inputs(mode, causal, seed=3)
    source = _keras_layer(CONFIGS[config], keras_kwargs, seed=4)
    layer = convert.multi_head_attention_from_keras(source)
    assert isinstance(layer, keras_attn.MultiHeadAttention) and layer.built

    call = {"use_causal_mask": causal}
    if mask in ("attention_mask", "both"):
        attention_mask = rng(5).random((B, T, length)) < 0.5
        attention_mask[:, :, 0] = True  # every query may attend at least one key
        call["attention_mask"] = attention_mask
    # return_attention_scores=True keeps Keras on its explicit einsum path: its fused path
    # (ops.dot_product_attention) fails on JAX when value_dim != key_dim.
    expected, _ = source(**keras_kwargs, **call, return_attention_scores=True)
    actual = layer(**ours_kwargs, **call)
    assert_close(actual, to_numpy(expected), what=f"{config}/{mode}/{mask}")


@pytest.mark.parametrize("causal", [False, True])
def test_from_keras_matches_keras_fused_path(causal):
    """key_dim == value_dim: Keras's default (fused) path, with and without a padding mask."""
    keras_kwargs, ours_kwargs, length = _inputs("cross_key", causal, seed=6)
    source = _keras_layer({"num_heads": 3, "key_dim": 2}, keras_kwargs, seed=7)
    layer = convert.multi_head_attention_from_keras(source)
    assert_close(layer(**ours_kwargs, use_causal_mask=causal),
                 to_numpy(source(**keras_kwargs, use_causal_mask=causal)), what="fused")
    attention_mask = np.ones((B, T, length), bool)
    attention_mask[1, :, length - 2:] = False  # padding at the end of the second sequence
    assert_close(layer(**ours_kwargs, use_causal_mask=causal, attention_mask=attention_mask),
                 to_numpy(source(**keras_kwargs, use_causal_mask=causal, attention_mask=attention_mask)),
                 what="fused, masked")


def test_from_keras_copies_the_configuration():
    keras_kwargs, _, _ = _inputs("cross_key", False, seed=0)
    source = keras.layers.MultiHeadAttention(
        num_heads=2, key_dim=4, value_dim=3, output_shape=7, dropout=0.25, use_bias=False, seed=11)
    source.build(**{f"{name}_shape": tensor.shape for name, tensor in keras_kwargs.items()})
    layer = convert.multi_head_attention_from_keras(source, name="converted")
    assert (layer.num_heads, layer.key_dim, layer.head_value_dim, layer.output_dim) == (2, 4, 3, 7)
    assert (layer.dropout, layer.use_bias, layer.seed, layer.name) == (0.25, False, 11, "converted")
    assert tuple(layer.query_dense.kernel.shape) == (D_Q, 8)
    assert tuple(layer.key_dense.kernel.shape) == (D_K, 8)
    assert tuple(layer.value_dense.kernel.shape) == (D_V, 6)
    assert tuple(layer.output_dense.kernel.shape) == (6, 7)
    assert layer.query_dense.bias is None


def test_from_keras_head_layout():
    """Head h of Keras's kernel (D_q, H, d) is our columns [h * d, (h + 1) * d)."""
    keras_kwargs, _, _ = _inputs("self", False, seed=0)
    source = _keras_layer(CONFIGS["plain"], keras_kwargs, seed=1)
    layer = convert.multi_head_attention_from_keras(source)
    theirs = to_numpy(source.query_dense.kernel)  # (D_q, H, d_k)
    ours = to_numpy(layer.query_dense.kernel)  # (D_q, H * d_k)
    np.testing.assert_array_equal(ours[:, 4:8], theirs[:, 1, :])
    np.testing.assert_array_equal(to_numpy(layer.output_dense.kernel)[3:6],
                                  to_numpy(source.output_dense.kernel)[1])


def test_from_keras_rejects_an_unbuilt_layer():
    with pytest.raises(ValueError, match="must be built"):
        convert.multi_head_attention_from_keras(keras.layers.MultiHeadAttention(2, 4))


def test_from_keras_rejects_other_layers():
    with pytest.raises(ValueError, match="keras.layers.MultiHeadAttention"):
        convert.multi_head_attention_from_keras(keras.layers.Dense(3))


def test_from_keras_rejects_other_attention_axes():
    source = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, attention_axes=(1, 2))
    source.build((2, 3, 4, 6), (2, 3, 4, 6))
    with pytest.raises(ValueError, match="attention_axes"):
        convert.multi_head_attention_from_keras(source)


def test_from_keras_rejects_derived_arguments():
    source = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)
    source.build((2, 3, 6), (2, 3, 6))
    with pytest.raises(ValueError, match="key_dim"):
        convert.multi_head_attention_from_keras(source, key_dim=8)


def test_from_keras_keeps_the_regularizer_and_constraint_objects():
    """The objects themselves come along: a custom class without `get_config` (not serializable)."""

    class Penalty(keras.regularizers.Regularizer):
        def __call__(self, x):
            return 1e-3 * keras.ops.sum(keras.ops.abs(x))

    penalty, clip = Penalty(), keras.constraints.MaxNorm(2.0)
    source = keras.layers.MultiHeadAttention(2, 4, kernel_regularizer=penalty, bias_constraint=clip)
    source.build((2, 3, 6), (2, 3, 6))
    layer = convert.multi_head_attention_from_keras(source)
    assert layer.kernel_regularizer is penalty and layer.bias_constraint is clip
    assert layer.bias_regularizer is None and layer.kernel_constraint is None


def _convert_modules():
    package = pathlib.Path(convert.__file__).parent
    return [(path.name, ast.parse(path.read_text(), filename=str(path)))
            for path in sorted(package.glob("*.py"))]


def test_converters_import_only_keras_numpy_and_the_standard_library():
    """No torch or transformers, and nothing that unpickles (`torch.load`, `np.load`, pickle)."""
    allowed = ({"keras", "numpy", "keras_attn"} | set(sys.stdlib_module_names)) - {
        "pickle", "shelve", "marshal"}
    optional = {"safetensors"}  # the `safetensors` extra: imported inside a function only
    assert len(_convert_modules()) >= 5
    for name, tree in _convert_modules():
        for node in tree.body:  # module level: no optional package
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [
                    node.module or ""]
                assert not {n.split(".")[0] for n in names} & optional, (
                    f"{name}:{node.lineno} imports an optional package at module level")
        allowed_here = allowed | optional
        for node in ast.walk(tree):
            roots = []
            if isinstance(node, ast.Import):
                roots = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                roots = [node.module.split(".")[0]]
            assert set(roots) <= allowed_here, f"{name}:{node.lineno} imports {roots}"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                json_call = isinstance(node.func.value, ast.Name) and node.func.value.id == "json"
                assert json_call or node.func.attr not in ("load", "loads"), (
                    f"{name}:{node.lineno} loads a file")  # JSON only: it cannot unpickle


def test_the_keras_converter_reads_private_attributes_in_one_helper_only():
    """Keras's public API (`query_dense`, `attention_axes`, ...), except what it hides: four
    options and the gate of a MultiHeadAttention, the sublayers of a GroupQueryAttention."""
    tree = dict(_convert_modules())["keras.py"]
    private = {}
    for function in tree.body:
        if isinstance(function, ast.FunctionDef):
            names = {node.attr for node in ast.walk(function) if isinstance(node, ast.Attribute)}
            names |= {node.args[1].value for node in ast.walk(function)
                      if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr"
                      and isinstance(node.args[1], ast.Constant)}
            private[function.name] = {n for n in names if n.startswith("_") and not n.startswith("__")}
    assert private.pop("_unexposed_arguments") == {
        "_use_gate", "_output_shape", "_sliding_window", "_flash_attention", "_gate_dense",
        "_query_dense", "_key_dense", "_value_dense", "_output_dense"}
    assert not any(private.values()), f"private attributes read: {private}"


# ---------------------------------------------------------------------------
# Keys under another prefix: the error names the prefixes found and the `prefix=` to pass.


def _llama_layer_state(D=8, F=16):
    def zeros(*shape):  # only the keys and shapes matter
        return np.zeros(shape, "float32")

    state = {f"self_attn.{p}_proj.weight": zeros(D, D) for p in "qkvo"}
    state.update({"mlp.gate_proj.weight": zeros(F, D), "mlp.up_proj.weight": zeros(F, D),
                  "mlp.down_proj.weight": zeros(D, F), "input_layernorm.weight": zeros(D),
                  "post_attention_layernorm.weight": zeros(D)})
    return state


def _llama_model_state(layers=12):
    """A `LlamaModel`'s keys: `layers.N.` (a `LlamaForCausalLM`'s are `model.layers.N.`)."""
    state = {f"layers.{i}.{k}": v for i in range(layers) for k, v in _llama_layer_state().items()}
    state["embed_tokens.weight"] = np.zeros((10, 8), "float32")
    state["norm.weight"] = np.zeros((8,), "float32")
    return state


def test_a_state_dict_under_another_prefix_names_the_prefixes_and_the_one_to_pass():
    state = _llama_model_state()
    with pytest.raises(ValueError) as caught:
        convert.transformer_decoder_layer_from_llama(state, 2, 2, prefix="model.layers.10.")
    message = str(caught.value)
    assert "Received keys: []" not in message
    assert "No key of state_dict starts with prefix='model.layers.10.'" in message
    assert "'embed_tokens.', 'layers.', 'norm.'" in message
    # Natural order, and the suggestion is the received prefix without its 'model.'.
    assert "the prefixes 'layers.0.', 'layers.1.', 'layers.2.'" in message
    assert "(12 in all)" in message
    assert "prefix='layers.10.' (received prefix='model.layers.10.')" in message
    layer = convert.transformer_decoder_layer_from_llama(state, 2, 2, prefix="layers.10.")
    assert layer.built


def test_a_whole_model_state_dict_without_a_prefix_names_the_prefixes():
    state = _llama_model_state(layers=2)
    with pytest.raises(ValueError, match=re.escape(
            "'q_proj.weight' and the other 3 missing entries are found under the prefixes "
            "'layers.0.self_attn.', 'layers.1.self_attn.': pass the one you mean as `prefix`, "
            "for example prefix='layers.0.self_attn.' (received prefix='')")):
        convert.multi_head_attention_from_llama(state, 2, 2)
    # The other way round: a LlamaForCausalLM's keys, a LlamaModel's prefix.
    causal = {"model." + k: v for k, v in state.items()}
    with pytest.raises(ValueError, match=re.escape("prefix='model.layers.1.self_attn.'")):
        convert.multi_head_attention_from_llama(causal, 2, 2, prefix="layers.1.self_attn.")


def test_a_missing_entry_found_nowhere_else_lists_the_keys_received():
    state = _llama_layer_state()
    del state["mlp.up_proj.weight"]
    with pytest.raises(ValueError, match=r"missing 'mlp\.up_proj\.weight'\. Received keys: \["):
        convert.transformer_decoder_layer_from_llama(state, 2, 2)
    with pytest.raises(ValueError, match=r"Received: an empty state dict"):
        convert.multi_head_attention_from_llama({}, 2, 2, prefix="model.layers.0.self_attn.")
