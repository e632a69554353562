"""`MultiHeadLatentAttention` (DeepSeek V2/V3's MLA) and its `LatentCache`, against the float64
reference (`keras_attn.testing.reference.multi_head_latent_attention`), on every backend.

Each numerical test has an ablation beside it (the option off or wrong) that moves the
output far past the tolerance, so that it can fail; the attention path and the form
(expanded or absorbed) are observed (`observe_paths`).
"""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn import observe_paths
from keras_attn.cache import KVCache
from keras_attn.latent_cache import LatentCache
from keras_attn.testing.weights import randomize_weights, reference_params

from .. import reference
from ..helpers import UNCACHED, assert_close, randn, rng, to_numpy

B, T, D = 2, 7, 8
SIZES = dict(num_heads=2, kv_lora_rank=6, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=3)
YARN = dict(rope_max_wavelength=100.0, rope_type="yarn", rope_scaling_factor=4.0,
            rope_original_max_position_embeddings=4, rope_mscale=1.0, rope_mscale_all_dim=0.5)
VARIANTS = {
    "plain_query": dict(q_lora_rank=None, rope_max_wavelength=100.0),
    "low_rank_query_yarn_scale_bias": dict(q_lora_rank=5, use_bias=True, scale=0.45, **YARN),
    "not_interleaved_no_rope": dict(q_lora_rank=5, rope_interleaved=False,
                                    rope_max_wavelength=None),
}
PATHS = ("explicit", "fused", "blockwise")


def _layer(seed=1, **kwargs):
    options = {**SIZES, **kwargs}
    layer = keras_attn.MultiHeadLatentAttention(**options)
    layer.build((B, T, D))
    randomize_weights(layer, seed=seed)
    return layer, options


def _reference(layer, x, options, **call):
    kwargs = {k: v for k, v in options.items()
              if k not in ("use_bias", "decode", "implementation", "dtype")}
    return reference.multi_head_latent_attention(reference_params(layer), x, **kwargs, **call)


def _x(seed=0, length=T):
    return randn(rng(seed), B, length, D)


def _relative(a, b):
    a, b = np.asarray(to_numpy(a), np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_uncached_forward_matches_the_float64_reference_on_every_path(variant, path):
    layer, options = _layer(implementation=path, **VARIANTS[variant])
    x = _x()
    with observe_paths() as taken:
        out = layer(x, use_causal_mask=True)
    assert taken[path] == 1 and taken["latent_expanded"] == 1, dict(taken)
    expected, _ = _reference(layer, x, options, is_causal=True)
    assert_close(out, expected, what=f"{variant} {path}")


@pytest.mark.parametrize("path", PATHS)
def test_the_absorbed_form_without_a_cache_matches_the_reference_on_every_path(path):
    """`decode="absorbed"` forces the absorbed form on any call: one key/value head of
    width r + d_rope serving every query head, on each kernel path."""
    layer, options = _layer(implementation=path, decode="absorbed",
                            **VARIANTS["low_rank_query_yarn_scale_bias"])
    x = _x(2)
    with observe_paths() as taken:
        out = layer(x, use_causal_mask=True)
    assert taken[path] == 1 and taken["latent_absorbed"] == 1, dict(taken)
    expected, _ = _reference(layer, x, options, is_causal=True)
    assert_close(out, expected, what=f"absorbed {path}")


@pytest.mark.parametrize("ablation", ["rope_interleaved", "scale", "no_kv_norm", "not_causal"])
def test_ablations_move_the_output_far_past_the_tolerance(ablation):
    """Each option changes the numbers: the reference with it wrong is far from the layer."""
    layer, options = _layer(**VARIANTS["low_rank_query_yarn_scale_bias"])
    x = _x()
    out = layer(x, use_causal_mask=True)
    params = reference_params(layer)
    kwargs = {k: v for k, v in options.items() if k != "use_bias"}
    if ablation == "rope_interleaved":
        kwargs["rope_interleaved"] = False
    elif ablation == "scale":
        kwargs["scale"] = None  # 1 / sqrt(d_qk) instead of the given (mscale'd) one
    elif ablation == "no_kv_norm":
        params["key_value_a_norm"]["scale"] = params["key_value_a_norm"]["scale"] * 0 + 1.0
    is_causal = ablation != "not_causal"
    wrong, _ = reference.multi_head_latent_attention(params, x, **kwargs, is_causal=is_causal)
    assert _relative(out, wrong) > 1e-2, ablation  # the tolerance is 1e-5


@pytest.mark.parametrize("decode", ["absorbed", "expanded"])
@pytest.mark.parametrize("variant", ["plain_query", "low_rank_query_yarn_scale_bias"])
def test_cached_decoding_in_both_forms_matches_the_reference(variant, decode):
    """A prefill in two chunks (3 + 2 tokens), then one token per call: every row is the
    float64 reference's uncached causal forward, in the form asked for."""
    layer, options = _layer(decode=decode, **VARIANTS[variant])
    x = _x(3)
    expected, _ = _reference(layer, x, options, is_causal=True)
    cache = layer.empty_cache(B, T + 2)
    assert isinstance(cache, LatentCache) and isinstance(cache, KVCache)
    rows = []
    bounds = [(0, 3), (3, 5), (5, 6), (6, 7)]
    with observe_paths() as taken:
        for start, stop in bounds:
            out, cache = layer(x[:, start:stop], use_causal_mask=True, cache=cache,
                               cache_update_index=start)
            rows.append(to_numpy(out))
    assert taken[f"latent_{decode}"] == len(bounds) and taken["cached"] == len(bounds), dict(taken)
    other = "expanded" if decode == "absorbed" else "absorbed"
    assert taken[f"latent_{other}"] == 0
    assert_close(np.concatenate(rows, axis=1), expected, what=f"{variant} {decode} cached")
    # Ablation: the decode steps written one slot late (their RoPE positions wrong).
    cache = layer.empty_cache(B, T + 2)
    _, cache = layer(x[:, :5], use_causal_mask=True, cache=cache, cache_update_index=0)
    late, _ = layer(x[:, 5:6], use_causal_mask=True, cache=cache, cache_update_index=6)
    assert _relative(late, expected[:, 5:6]) > 1e-2


def test_auto_absorbs_per_token_decoding_and_expands_a_long_prefill():
    layer, _ = _layer(q_lora_rank=5)
    assert layer.decode == "auto"
    x = _x(length=layer.ABSORB_MAX_QUERIES + 1)
    cache = layer.empty_cache(B, x.shape[1] + 1)
    with observe_paths() as taken:
        layer(x, use_causal_mask=True)  # no cache: training / scoring
        _, cache = layer(x, use_causal_mask=True, cache=cache, cache_update_index=0)
    assert taken["latent_expanded"] == 2 and taken["latent_absorbed"] == 0, dict(taken)
    with observe_paths() as taken:
        layer(x[:, :1], use_causal_mask=True, cache=cache, cache_update_index=x.shape[1])
    assert taken["latent_absorbed"] == 1 and taken["latent_expanded"] == 0, dict(taken)


@pytest.mark.parametrize("decode", ["absorbed", "expanded"])
def test_scores_and_an_attention_mask_in_both_forms(decode):
    layer, options = _layer(decode=decode, q_lora_rank=5, rope_max_wavelength=100.0)
    x = _x(4)
    keep = np.random.default_rng(5).random((B, T, T)) > 0.3
    keep[..., 0] = True
    expected, weights = _reference(layer, x, options, is_causal=True, mask=keep)
    cache = layer.empty_cache(B, T)
    out, scores, cache = layer(x, attention_mask=keep, use_causal_mask=True, cache=cache,
                               cache_update_index=0, return_attention_scores=True)
    assert_close(out, expected, what=f"{decode} masked")
    assert_close(scores, weights, what=f"{decode} scores")
    unmasked, _ = _reference(layer, x, options, is_causal=True)
    assert _relative(out, unmasked) > 1e-2  # the mask matters


def test_the_absorbed_and_expanded_forms_agree_with_a_tensor_index():
    """A `cache_update_index` given as a tensor: both forms give the same rows (a compiled
    loop traces it: `test_generate_decodes_over_a_latent_cache...`)."""
    layer, _ = _layer(q_lora_rank=5, rope_max_wavelength=100.0)
    x = _x(6)
    outputs = {}
    for decode in ("absorbed", "expanded"):
        layer.decode = decode
        cache = layer.empty_cache(B, T)
        _, cache = layer(x[:, :4], use_causal_mask=True, cache=cache, cache_update_index=0)
        index = keras.ops.convert_to_tensor(4, "int32")
        outputs[decode], _ = layer(x[:, 4:5], use_causal_mask=True, cache=cache,
                                   cache_update_index=index)
    layer.decode = "auto"
    assert_close(outputs["absorbed"], to_numpy(outputs["expanded"]), against=UNCACHED)


def test_latent_cache_layout_and_bytes_per_token():
    layer, _ = _layer(q_lora_rank=5)
    cache = layer.empty_cache(B, 11)
    assert tuple(cache.latent.shape) == (B, 11, 6) and tuple(cache.rope_keys.shape) == (B, 11, 4)
    assert cache.max_length == 11
    # r + d_rope = 10 numbers a token, against H * (d_qk + d_v) = 2 * (8 + 3) = 22.
    assert layer.cache_bytes_per_token("float32") == (40, 88)
    deepseek = keras_attn.MultiHeadLatentAttention(128, 512, 128, 64, 128, q_lora_rank=1536)
    assert deepseek.cache_bytes_per_token("bfloat16") == (1152, 81920)
    assert keras_attn.empty_cache(layer, B, 11).latent.shape == cache.latent.shape
    _, new = layer(_x()[:, :3], use_causal_mask=True, cache=cache, cache_update_index=2)
    assert isinstance(new, LatentCache)
    written = np.abs(to_numpy(new.latent)).sum(-1)
    assert (written[:, 2:5] > 0).all() and (written[:, :2] == 0).all() and (
        written[:, 5:] == 0).all()


def test_bad_arguments_and_caches_are_refused_by_name():
    with pytest.raises(ValueError, match="decode.*Received: decode='fast'"):
        keras_attn.MultiHeadLatentAttention(**SIZES, decode="fast")
    with pytest.raises(ValueError, match="num_key_value_heads.*Received: num_key_value_heads=1"):
        keras_attn.MultiHeadLatentAttention(**SIZES, num_key_value_heads=1)
    with pytest.raises(ValueError, match="sliding_window.*Received: sliding_window=4"):
        keras_attn.MultiHeadLatentAttention(**SIZES, sliding_window=4)
    with pytest.raises(ValueError, match="kv_lora_rank.*Received: kv_lora_rank=0"):
        keras_attn.MultiHeadLatentAttention(**{**SIZES, "kv_lora_rank": 0})
    with pytest.raises(ValueError, match="q_lora_rank.*Received: q_lora_rank=-2"):
        keras_attn.MultiHeadLatentAttention(**SIZES, q_lora_rank=-2)
    layer, _ = _layer()
    x = _x()
    with pytest.raises(ValueError, match="LatentCache"):
        layer(x, cache=KVCache.empty(B, T, 2, 4), cache_update_index=0)
    with pytest.raises(ValueError, match="cache_update_index"):
        layer(x, cache=layer.empty_cache(B, T))
    with pytest.raises(ValueError, match="do not fit"):
        layer(x, cache=layer.empty_cache(B, T - 1), cache_update_index=0)
    with pytest.raises(ValueError, match="cache.latent"):
        layer(x, cache=LatentCache.empty(B, T, 5, 4), cache_update_index=0)
    with pytest.raises(ValueError, match="as_kv_cache=False"):
        layer.empty_cache(B, T, as_kv_cache=False)
    with pytest.raises(ValueError, match="keras-hub"):
        layer.empty_cache(B, T).to_keras_hub()
    mha = keras_attn.MultiHeadAttention(2, 4)
    with pytest.raises(ValueError, match="LatentCache"):
        mha(x, cache=layer.empty_cache(B, T), cache_update_index=0)


def test_config_round_trip_and_keras_file(tmp_path):
    layer, _ = _layer(decode="absorbed", **VARIANTS["low_rank_query_yarn_scale_bias"])
    config = layer.get_config()
    again = keras_attn.MultiHeadLatentAttention.from_config(config)
    assert again.get_config() == config
    inputs = keras.Input((T, D))
    model = keras.Model(inputs, layer(inputs, use_causal_mask=True))
    x = _x()
    before = to_numpy(model.predict_on_batch(x))
    path = str(tmp_path / "latent.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(to_numpy(reloaded.predict_on_batch(x)), before)
    assert reloaded.layers[-1].decode == "absorbed"


def test_generate_decodes_over_a_latent_cache_as_the_uncached_model_does():
    """`keras_attn.generate` with a LatentCache (absorbed per-token steps inside its loop)
    gives the greedy tokens of re-running the uncached model on the whole sequence."""
    V, L, P = 11, 9, 3
    # Seeded weights: unseeded ones could meet a greedy near-tie, or give the ablation the
    # same tokens by chance, in some run; fixed ones decide the same way every run.
    embedding = keras.layers.Embedding(
        V, D, embeddings_initializer=keras.initializers.RandomNormal(stddev=1.0, seed=0))
    layer, _ = _layer(q_lora_rank=5, rope_max_wavelength=100.0)
    head = keras.layers.Dense(
        V, kernel_initializer=keras.initializers.RandomNormal(stddev=2.0, seed=1))
    prompt = np.array([[1, 4, 7], [2, 9, 3]], "int32")

    def logits_of(ids, cache=None, index=None):
        x = embedding(ids)
        if cache is None:
            return head(layer(x, use_causal_mask=True))
        y, cache = layer(x, use_causal_mask=True, cache=cache, cache_update_index=index)
        return head(y), cache

    tokens = prompt
    for _ in range(L - P):  # the uncached reference: the whole sequence every step
        step = np.argmax(to_numpy(logits_of(tokens))[:, -1], axis=-1).astype("int32")
        tokens = np.concatenate([tokens, step[:, None]], axis=1)
    with observe_paths() as taken:
        generated = keras_attn.generate(lambda ids, cache, index: logits_of(ids, cache, index),
                                        prompt, L, layer.empty_cache(B, L))
    np.testing.assert_array_equal(to_numpy(generated), tokens)
    assert taken["latent_absorbed"] >= 2, dict(taken)  # the prefill and the traced step(s)
    assert len(set(tokens[:, P:].ravel().tolist())) > 1  # not a constant sequence
    # Ablation: the updated cache dropped (each step sees the empty cache and itself).
    forgetful = keras_attn.generate(
        lambda ids, cache, index: (logits_of(ids, cache, index)[0], cache),
        prompt, L, layer.empty_cache(B, L))
    assert (to_numpy(forgetful) != tokens).any()
