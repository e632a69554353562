"""The cache bytes per sequence of one Gated DeltaNet layer (a `RecurrentCache`) against one
softmax attention layer's `KVCache`, at a Qwen 3.5 layer's sizes (transformers 5.24's
`Qwen3_5TextConfig` defaults: hidden 4096; softmax layers 16 heads, 4 key/value heads of
256; linear layers 16 key heads and 32 value heads of 128, kernel 4).

    python -m benchmarks.recurrent_cache_memory            # bfloat16 cache, 1k and 32k tokens

The recurrent cache is measured from the layer (`GatedDeltaNet.cache_bytes_per_sequence`,
float32 state as transformers keeps it); the key/value cache from `KVCache.empty` of one
sequence, by its tensors' sizes. No backend work beyond building zeros.
"""

import argparse

import numpy as np

SOFTMAX = dict(num_key_value_heads=4, head_dim=256)
LINEAR = dict(linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
              linear_value_head_dim=128, linear_conv_kernel_dim=4)


def kv_cache_bytes(length, dtype):
    """Bytes of one sequence's keys and values over `length` positions."""
    from keras_attn import KVCache

    cache = KVCache.empty(1, length, SOFTMAX["num_key_value_heads"], SOFTMAX["head_dim"],
                          dtype=dtype)
    return sum(int(np.prod(x.shape)) * np.dtype("float16" if dtype == "bfloat16" else dtype)
               .itemsize for x in cache)


def recurrent_cache_bytes(dtype):
    from keras_attn import GatedDeltaNet

    layer = GatedDeltaNet(**LINEAR)
    layer.build((None, None, 4096))
    return layer.cache_bytes_per_sequence(dtype)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="1024,32768")
    parser.add_argument("--kv-dtype", default="bfloat16")
    parser.add_argument("--state-dtype", default="float32")
    args = parser.parse_args(argv)
    state = recurrent_cache_bytes(args.state_dtype)
    for length in (int(n) for n in args.lengths.split(",")):
        kv = kv_cache_bytes(length, args.kv_dtype)
        print(f"T={length}: softmax KVCache {kv / 2**20:.2f} MiB ({args.kv_dtype}), "
              f"GatedDeltaNet RecurrentCache {state / 2**20:.2f} MiB ({args.state_dtype}), "
              f"ratio {kv / state:.2f}")


if __name__ == "__main__":
    main()
