"""MixtureOfExperts' dense path (every expert on every token) against its sparse path (the
token copies sorted by expert into blocks, each block through its expert), per token count
N, timed with interleaved repeats (median and spread): what `implementation="auto"`'s rule
(dense up to 4 experts, else sparse) is to be set from.

    KERAS_BACKEND=torch python benchmarks/moe_paths.py

Sizes: Mixtral's routing (E=8, k=2) at a scaled-down width (D=512, F=1024).
"""

import argparse
import statistics
import time

import keras
import numpy as np

import keras_attn


def call_times(layer, x, repeats):
    keras.ops.convert_to_numpy(layer(x))  # warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        keras.ops.convert_to_numpy(layer(x))
        times.append(time.perf_counter() - start)
    return times


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--intermediate", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    layer = keras_attn.MixtureOfExperts(args.experts, args.top_k, args.intermediate)
    layer.build((None, None, args.width))
    rng = np.random.default_rng(0)
    for N in (1, 2, 4, 16, 64, 256):
        x = rng.standard_normal((1, N, args.width)).astype("float32")
        times = {"dense": [], "sparse": []}
        for _ in range(args.rounds):  # interleaved: each round times both paths
            for path in times:
                layer.implementation = path
                times[path] += call_times(layer, x, args.repeats)
        medians = {}
        for path, values in times.items():
            ms = [1e3 * t for t in values]
            medians[path] = statistics.median(ms)
            print(f"{keras.backend.backend()} N={N:4d} {path:6s} median {medians[path]:8.3f} ms "
                  f"(min {min(ms):.3f}, max {max(ms):.3f})")
        layer.implementation = "auto"
        print(f"  sparse/dense {medians['sparse'] / medians['dense']:.2f}; "
              f"auto takes {layer._chosen_path()}")


if __name__ == "__main__":
    main()
