"""The LoRA fine-tune round trip: `CausalLM.enable_lora`, a few `fit` steps, then
`save_pretrained` writes the merged weights, and a `.keras` file keeps the fine-tuned model.

A tiny Llama from a config dict and random arrays (std 0.35, no torch needed to build it);
fitted on jax, tensorflow and torch. The folder read back (keras_attn's reader, every
backend; transformers' `from_pretrained` where torch and transformers are installed)
gives the fine-tuned model's logits within 1e-5 relative, and the untuned model's are far
from them: the comparison sees whether the LoRA was merged.
"""

import os

import keras
import numpy as np
import pytest

from keras_attn import convert
from keras_attn.models import _lora

if keras.backend.backend() == "numpy":
    pytest.skip("the numpy backend cannot train", allow_module_level=True)
pytest.importorskip("safetensors")

TOLERANCE = 1e-5
V, D, F, L = 64, 32, 48, 2
CONFIG = {"model_type": "llama", "vocab_size": V, "hidden_size": D, "intermediate_size": F,
          "num_hidden_layers": L, "num_attention_heads": 4, "num_key_value_heads": 2,
          "rope_theta": 500.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}
LAYER = {"self_attn.q_proj.weight": (D, D), "self_attn.k_proj.weight": (D // 2, D),
         "self_attn.v_proj.weight": (D // 2, D), "self_attn.o_proj.weight": (D, D),
         "mlp.gate_proj.weight": (F, D), "mlp.up_proj.weight": (F, D),
         "mlp.down_proj.weight": (D, F), "input_layernorm.weight": (D,),
         "post_attention_layernorm.weight": (D,)}


def _llama():
    rng = np.random.default_rng(0)
    shapes = {"model.embed_tokens.weight": (V, D), "model.norm.weight": (D,),
              "lm_head.weight": (V, D),
              **{f"model.layers.{i}.{name}": shape for i in range(L)
                 for name, shape in LAYER.items()}}
    state = {name: (rng.normal(0, 0.35, shape) + (1.0 if len(shape) == 1 else 0.0)).astype(
        "float32") for name, shape in shapes.items()}
    return convert.causal_lm_from_transformers(CONFIG, state)


def _error(actual, expected):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float(np.abs(actual - expected).max() / np.abs(expected).max())


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """(ids, untuned logits, the LoRA-tuned model, its logits, its base kernels before fit)."""
    lm = _llama()
    ids = np.random.default_rng(1).integers(0, V, (4, 12)).astype("int32")
    untuned = keras.ops.convert_to_numpy(lm(ids))
    lm.enable_lora(2, target_names=list(_lora.PROJECTIONS))
    frozen = {w.path: keras.ops.convert_to_numpy(w) for w in lm.non_trainable_weights}
    lm.compile(optimizer=keras.optimizers.Adam(1e-2),
               loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    lm.fit(ids[:, :-1], ids[:, 1:], epochs=3, batch_size=4, verbose=0)
    return ids, untuned, lm, keras.ops.convert_to_numpy(lm(ids)), frozen


def test_enable_lora_trains_the_low_rank_factors_only(tuned):
    ids, untuned, lm, logits, frozen = tuned
    names = sorted({w.path.rsplit("/", 2)[-2] for w in lm.trainable_weights})
    assert names == sorted(set(_lora.PROJECTIONS) | {"output_dense"})
    assert all(w.path.rsplit("/", 1)[-1].startswith("lora_kernel_")
               for w in lm.trainable_weights)
    assert len(lm.trainable_weights) == 2 * 7 * L  # A and B of 7 projections per block
    for w in lm.non_trainable_weights:  # the base weights did not move
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(w), frozen[w.path])
    assert _error(logits, untuned) > 100 * TOLERANCE  # but the model did


def test_save_pretrained_writes_the_merged_weights(tuned, tmp_path):
    ids, untuned, lm, logits, _ = tuned
    lm.save_pretrained(tmp_path)
    back = keras.ops.convert_to_numpy(convert.causal_lm_from_pretrained(tmp_path)(ids))
    assert _error(back, logits) <= TOLERANCE
    assert _error(back, untuned) > 100 * TOLERANCE  # the ablation: unmerged is far off


def test_transformers_loads_the_fine_tuned_model(tuned, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    ids, untuned, lm, logits, _ = tuned
    lm.save_pretrained(tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, attn_implementation="eager").eval()
    with torch.no_grad():
        theirs = model(torch.as_tensor(ids, dtype=torch.long)).logits.float().numpy()
    error = _error(theirs, logits)
    assert error <= TOLERANCE, f"relative error {error:.3g}"
    assert _error(theirs, untuned) > 100 * TOLERANCE


def test_a_saved_lora_model_reloads_predicting_the_same(tuned, tmp_path):
    ids, _, lm, logits, _ = tuned
    path = os.path.join(tmp_path, "tuned.keras")
    lm.save(path)
    again = keras.saving.load_model(path, compile=False)
    assert _error(keras.ops.convert_to_numpy(again(ids)), logits) <= TOLERANCE
    # its LoRA again (the config's `lora`): the merged kernels frozen, the factors to train
    assert again.lora == {"rank": 2, "target_names": list(_lora.PROJECTIONS)}
    assert len(again.trainable_weights) == 2 * 7 * L
    assert all(w.path.rsplit("/", 1)[-1].startswith("lora_kernel_")
               for w in again.trainable_weights)


def test_a_model_without_lora_keeps_todays_config():
    assert "lora" not in _llama().get_config()


def test_a_quantized_model_is_not_written(tmp_path):
    from keras_attn import CausalLM, TransformerDecoderLayer

    lm = CausalLM(16, 8, [TransformerDecoderLayer(num_heads=2, key_dim=4, intermediate_dim=8,
                                                  normalization="rms", normalize_first=True)],
                  source_config={"model_type": "llama"})  # refused before it is read
    lm.quantize("int8")
    with pytest.raises(ValueError, match="quantized"):
        lm.save_pretrained(tmp_path)
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize("arguments, match", [
    ((0,), r"`rank` must be a positive integer. Received: rank=0"),
    ((2, ["query_dense", "no_such_layer"]), r"'no_such_layer'.*Received: target_names="),
    ((2, "query_dense"), r"`target_names` must be None or a non-empty list"),
])
def test_bad_lora_arguments_are_refused(arguments, match):
    with pytest.raises(ValueError, match=match):
        _llama().enable_lora(*arguments)


def test_the_default_targets_are_keras_hubs_query_and_value():
    lm = _llama()
    lm.enable_lora(2)
    names = sorted({w.path.rsplit("/", 2)[-2] for w in lm.trainable_weights})
    assert names == ["query_dense", "value_dense"]
