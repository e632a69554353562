"""`benchmarks.scale`'s own checks, which its figures rest on: the seeded cache written into
transformers' `StaticCache` and into keras_attn's `KVCache`s gives the same first decoding
step (a swapped layout moves it far past the benchmark's tolerance), and the bytes of the
bandwidth bound are the model's parameters and cache, counted by transformers."""

import keras
import numpy as np
import pytest

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "torch",
    reason="transformers' model is the reference; it runs in the torch environment")


def _relative(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def test_every_layout_of_the_filled_cache_gives_transformers_first_step(tmp_path):
    pytest.importorskip("transformers")
    import torch

    from benchmarks import scale

    sizes, batch, length = scale.QUICK_SMALL, 2, 16
    hf = scale.make_checkpoint(sizes, tmp_path)
    keys, values, token = scale.filled_cache(sizes, batch, length, seed=3)
    cache = scale._hf_static(hf, keys, values, length + 1, torch.float32)
    expected = scale._hf_step(hf, cache, torch.as_tensor(token, dtype=torch.long),
                              length).numpy()
    ours = scale._ours(str(tmp_path), sizes, keys, values, token, length + 8, "float32")
    assert _relative(ours["first"](), expected) < 1e-4
    # transformers' static cache in the benchmark's own use: N steps from the same cache.
    again = scale._hf(str(tmp_path), sizes, keys, values, token, length + 8, "float32")
    assert _relative(again["first"](), expected) < 1e-4
    np.testing.assert_array_equal(again["decode"](4), ours["decode"](4))
    # Ablation: keys and values swapped in keras_attn's caches.
    swapped = scale._ours(str(tmp_path), sizes, values, keys, token, length + 8, "float32")
    assert _relative(swapped["first"](), expected) > 100 * scale.TOLERANCE["float32"]


def test_bytes_per_step_counts_the_parameters_and_the_cache():
    transformers = pytest.importorskip("transformers")

    from benchmarks import scale

    sizes, batch, length = scale.QUICK_LARGE, 3, 40
    config = transformers.LlamaConfig(
        vocab_size=sizes["vocab"], hidden_size=sizes["dim"], intermediate_size=sizes["ffn"],
        num_hidden_layers=sizes["layers"], num_attention_heads=sizes["heads"],
        num_key_value_heads=sizes["kv_heads"], tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config)
    read = sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n)
    head_dim = sizes["dim"] // sizes["heads"]
    cache = sizes["layers"] * 2 * batch * length * sizes["kv_heads"] * head_dim
    assert scale.bytes_per_step(sizes, batch, length, "float32") == 4 * (read + cache)
    assert scale.bytes_per_step(sizes, batch, length, "bfloat16") == 2 * (read + cache)
