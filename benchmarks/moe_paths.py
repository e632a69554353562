"""MixtureOfExperts' dense path (every expert on every token) against its sparse path (the
token copies sorted by expert into blocks, each block through its expert), per token count
N, timed with interleaved repeats (median and spread) of a compiled `predict_on_batch` (XLA
on JAX, a `tf.function` on TensorFlow, eager on PyTorch): what `implementation="auto"`'s rule
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


def call_times(model, x, repeats):
    model.predict_on_batch(x)  # warm up (compiles on JAX and TensorFlow)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        keras.ops.convert_to_numpy(model.predict_on_batch(x))
        times.append(time.perf_counter() - start)
    return times


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--intermediate", type=int, default=1024)
    parser.add_argument("--tokens", default="1,16,128,512,2048")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    models = {}
    for path in ("dense", "sparse"):  # the same weights, one compiled model per path
        layer = keras_attn.MixtureOfExperts(args.experts, args.top_k, args.intermediate,
                                            implementation=path)
        inputs = keras.Input((None, args.width))
        models[path] = keras.Model(inputs, layer(inputs))
    models["sparse"].set_weights(models["dense"].get_weights())
    rng = np.random.default_rng(0)
    for N in (int(n) for n in args.tokens.split(",")):
        x = rng.standard_normal((1, N, args.width)).astype("float32")
        times = {"dense": [], "sparse": []}
        for _ in range(args.rounds):  # interleaved: each round times both paths
            for path in times:
                times[path] += call_times(models[path], x, args.repeats)
        medians = {}
        for path, values in times.items():
            ms = [1e3 * t for t in values]
            medians[path] = statistics.median(ms)
            print(f"{keras.backend.backend()} N={N:4d} {path:6s} median {medians[path]:8.3f} ms "
                  f"(min {min(ms):.3f}, max {max(ms):.3f})")
        auto = keras_attn.MixtureOfExperts(args.experts, args.top_k, args.intermediate)
        print(f"  sparse/dense {medians['sparse'] / medians['dense']:.2f}; "
              f"auto takes {auto._chosen_path()}", flush=True)


if __name__ == "__main__":
    main()
