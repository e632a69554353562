"""Is one fused QKV matmul faster than three Dense projections? Measure it.

    python -m benchmarks.projections [--size 8x256x256] [--repeats 20]

Two Keras layers with the same three `Dense` sublayers (the public weights of
`keras_attn.MultiHeadAttention`): `separate` calls them one by one;
`concatenated` concatenates the three kernels (and biases) at call time and
does one `(B*T, D) x (D, 3D)` matmul, then splits. Their compiled forward
(`predict_on_batch`) and train step (`train_on_batch`) are timed in turn in
one process (A B A B ...), and the medians printed.
"""

import argparse

from benchmarks import _common as common


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="8x256x256", help="BxTxD")
    common.add_options(parser, rounds=("--repeats", 20, "interleaved timed runs of each"),
                       json_help=None, worker=False)
    args = parser.parse_args(argv)
    B, T, D = (int(p) for p in args.size.split("x"))

    import keras
    import numpy as np

    class Projections(keras.layers.Layer):
        def __init__(self, concatenated, **kwargs):
            super().__init__(**kwargs)
            self.concatenated = concatenated
            self.parts = [keras.layers.Dense(D, name=n) for n in ("query", "key", "value")]

        def build(self, shape):
            for part in self.parts:
                part.build(shape)

        def call(self, x):
            if self.concatenated:
                kernel = keras.ops.concatenate([p.kernel for p in self.parts], axis=-1)
                bias = keras.ops.concatenate([p.bias for p in self.parts], axis=-1)
                q, k, v = keras.ops.split(keras.ops.matmul(x, kernel) + bias, 3, axis=-1)
            else:
                q, k, v = (p(x) for p in self.parts)
            return q * k + v  # cheap use of all three

    jit = keras.backend.backend() != "torch"
    x = np.random.default_rng(0).standard_normal((B, T, D)).astype("float32")
    runs = {}
    for name in ("separate", "concatenated"):
        inputs = keras.Input((T, D), batch_size=B)
        model = keras.Model(inputs, Projections(name == "concatenated")(inputs))
        model.compile(keras.optimizers.SGD(1e-3), "mse", jit_compile=jit)
        runs[(name, "forward")] = lambda m=model: m.predict_on_batch(x)
        runs[(name, "train")] = lambda m=model: m.train_on_batch(x, x)
    median = common.medians(common.interleaved(runs, args.rounds, warmup=2))
    print(f"backend {keras.backend.backend()}, B={B} T={T} D={D}, {args.rounds} interleaved runs")
    for mode in ("forward", "train"):
        sep, cat = median[("separate", mode)], median[("concatenated", mode)]
        print(f"{mode:8s} separate {sep * 1e3:7.2f} ms  concatenated {cat * 1e3:7.2f} ms  "
              f"ratio {cat / sep:.2f}")


if __name__ == "__main__":
    main()
