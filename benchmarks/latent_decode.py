"""Absorbed against expanded multi-head latent attention: one decode step over a filled
latent cache, and a prefill, timed with interleaved repeats (median and spread).

    KERAS_BACKEND=torch python benchmarks/latent_decode.py

Sizes: DeepSeek V3's head layout scaled down (H=16, r=128, d_nope=32, d_rope=16, d_v=32,
D=512) and DeepSeek V3's own attention (H=128, r=512, 128, 64, 128, D=7168) for one step.
"""

import argparse
import statistics
import time

import keras
import numpy as np

import keras_attn


def step_time(layer, x, cache, index, repeats):
    keras.ops.convert_to_numpy(layer(x, use_causal_mask=True, cache=cache,
                                     cache_update_index=index)[0])  # warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        keras.ops.convert_to_numpy(layer(x, use_causal_mask=True, cache=cache,
                                         cache_update_index=index)[0])
        times.append(time.perf_counter() - start)
    return times


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--big", action="store_true", help="DeepSeek V3's real sizes")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.big:
        sizes, D, S, B = dict(num_heads=128, kv_lora_rank=512, qk_nope_head_dim=128,
                              qk_rope_head_dim=64, v_head_dim=128, q_lora_rank=1536), 7168, 1024, 1
    else:
        sizes, D, S, B = dict(num_heads=16, kv_lora_rank=128, qk_nope_head_dim=32,
                              qk_rope_head_dim=16, v_head_dim=32, q_lora_rank=96), 512, 1024, 4
    layer = keras_attn.MultiHeadLatentAttention(**sizes)
    layer.build((None, None, D))
    rng = np.random.default_rng(0)
    cache = layer.empty_cache(B, S)
    prompt = rng.standard_normal((B, S - 64, D)).astype("float32")
    _, cache = layer(prompt, use_causal_mask=True, cache=cache, cache_update_index=0)
    for T in (1, 8, 16, 32, 64):
        label = f"T={T} over S={S}"
        x = rng.standard_normal((B, T, D)).astype("float32")
        times = {"absorbed": [], "expanded": []}
        for _ in range(args.rounds):  # interleaved: each round times both forms
            for form in times:
                layer.decode = form
                times[form] += step_time(layer, x, cache, S - 64, args.repeats)
        for form, values in times.items():
            ms = [1e3 * t for t in values]
            print(f"{keras.backend.backend()} {label:16s} {form:9s} median {statistics.median(ms):8.3f} ms "
                  f"(min {min(ms):.3f}, max {max(ms):.3f}, n={len(ms)}) B={B}")


if __name__ == "__main__":
    main()
