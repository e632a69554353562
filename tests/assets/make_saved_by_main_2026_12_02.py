"""Write `saved_by_main_2026_12_02.keras` and `.npz`: files saved by main before issue 32.

Run once, under JAX, from the repository root, with the code whose files the test must
keep loading (this file was run on main at `d052d17`, 2026-12-02, before the kernel spec,
the RoPE spec, composable blocks, the KV cache object and the family modules):

    KERAS_BACKEND=jax python tests/assets/make_saved_by_main_2026_12_02.py

Two models, the options 0.1.0's file lacks: a functional model (MultiHeadAttention with a
gate, `scale`, yarn RoPE with its parameters, value_dim != key_dim, output_dim; a decoder
block with Gemma's sandwich norms, split biases and llama3 RoPE; an encoder block with a
window) and a `CausalLM` (tied embeddings, an embedding scale, a final logit soft-cap,
blocks with their own windows and RoPE). Weights random and far from identity. The
`.npz` stores the inputs, the outputs computed here, and the weights' paths.
"""

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_attn  # noqa: E402
from keras_attn.testing.weights import randomize_weights  # noqa: E402

B, T, D, H, V = 2, 6, 16, 4, 40
HERE = os.path.dirname(os.path.abspath(__file__))
NAME = "saved_by_main_2026_12_02"


def build_functional():
    x_in = keras.Input((T, D), name="x")
    x = keras_attn.MultiHeadAttention(
        H, 4, value_dim=6, output_dim=D, num_key_value_heads=2, use_gate=True, scale=0.3,
        rope_max_wavelength=1e4, rope_type="yarn", rope_scaling_factor=4.0,
        rope_original_max_position_embeddings=8, rope_beta_fast=16.0, rope_beta_slow=2.0,
        qk_norm="rms", output_use_bias=False, name="mha")(x_in, use_causal_mask=True)
    x = keras_attn.TransformerDecoderLayer(
        H, intermediate_dim=24, num_key_value_heads=2, normalization="rms",
        normalize_first=True, gated_feed_forward=True, activation="gelu",
        use_post_attention_norm=True, use_post_ffw_norm=True, attention_use_bias=True,
        attention_output_use_bias=False, feed_forward_use_bias=False,
        rope_max_wavelength=500.0, rope_type="llama3", rope_scaling_factor=8.0,
        rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
        rope_original_max_position_embeddings=4, logit_soft_cap=20.0, name="decoder")(x)
    x = keras_attn.TransformerEncoderLayer(
        H, intermediate_dim=20, sliding_window=2, normalize_first=True,
        implementation="explicit", name="encoder")(x)
    return keras.Model(x_in, x)


def build_causal_lm():
    blocks = [keras_attn.TransformerDecoderLayer(
        H, intermediate_dim=24, num_key_value_heads=1 + i, normalization="rms",
        normalize_first=True, gated_feed_forward=True, activation="silu", use_bias=False,
        rope_max_wavelength=1e4 if i == 0 else 100.0, sliding_window=3 if i == 0 else None,
        qk_norm="rms" if i else None, name=f"block_{i}") for i in range(2)]
    lm = keras_attn.CausalLM(V, D, blocks, tie_word_embeddings=True, embedding_scale=4.0,
                             final_logit_soft_cap=30.0, name="lm")
    lm(np.zeros((1, T), "int32"))
    return lm


def main():
    g = np.random.default_rng(0)
    functional, lm = build_functional(), build_causal_lm()
    for layer in functional.layers:
        randomize_weights(layer, seed=len(layer.name), scale=0.25)  # activations O(1)
    randomize_weights(lm, seed=7, scale=0.25)
    x = g.standard_normal((B, T, D)).astype("float32")
    ids = g.integers(0, V, (B, T)).astype("int32")
    out = keras.ops.convert_to_numpy(functional(x))
    logits = keras.ops.convert_to_numpy(lm(ids))
    tokens = keras.ops.convert_to_numpy(lm.generate(ids[:, :3], max_length=T + 2))
    functional.save(os.path.join(HERE, NAME + "_functional.keras"))
    lm.save(os.path.join(HERE, NAME + "_causal_lm.keras"))
    np.savez(os.path.join(HERE, NAME + ".npz"), x=x, output=out, ids=ids, logits=logits,
             tokens=tokens, backend=np.array(keras.backend.backend()),
             functional_weight_paths=np.array([w.path for w in functional.weights]),
             causal_lm_weight_paths=np.array([w.path for w in lm.weights]))
    print("saved; output std", out.std(), "logits std", logits.std())


if __name__ == "__main__":
    main()
