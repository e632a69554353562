"""Benchmark: keras_attn MultiHeadAttention vs keras.layers.MultiHeadAttention vs native.

Run on the current backend (KERAS_BACKEND, or `--backend NAME`):

    python -m benchmarks.attention            # default sizes
    python -m benchmarks.attention --quick    # two small sizes, 3 repeats
    python -m benchmarks.attention --sizes 8x256x256x8,1x16384x256x4
    python -m benchmarks.attention --quick --json bench.json  # and the rows as JSON

Sizes are `BxTxDxH` (batch, sequence length, model width, heads); attention
is causal self-attention in float32. For each size the three contenders are
measured one after the other (interleaved), each configuration in a fresh
subprocess so that its peak memory (the RSS high-water mark from
`resource.getrusage`) is its own:

- `keras_attn`: `keras_attn.MultiHeadAttention` (implementation="auto");
- `keras`: `keras.layers.MultiHeadAttention`;
- `native`: the same four Dense projections around the backend's own kernel
  (`torch.nn.functional.scaled_dot_product_attention`,
  `jax.nn.dot_product_attention`); TensorFlow has no fused attention kernel,
  so there is no native row there.

Times are medians of `predict_on_batch` (compiled forward) and
`train_on_batch` (one SGD step; `jit_compile=True` on JAX and TensorFlow).
Where several contenders run at a size (up to `--interleave-max-t`), their
times come from one extra process that builds all of them and times them in
turn (A B C A B C ...), so that machine noise hits them alike; the table's
"alone ms" column is the time measured in the contender's own process (the
one whose peak RSS is reported). The float32 GEMM throughput of the
backend is measured in the same run (a 2048^3 matmul) and each time is
also reported as the fraction of that throughput it achieves (useful
FLOPs: projections plus the causal half of the attention matmuls; a train
step counts 3x the forward FLOPs).

Configurations whose materialised `T x S` scores would need more than
`--mem-limit-gib` are skipped and reported as such.

TF32 (GPUs only): with `KERAS_ATTN_ALLOW_TF32=1` every worker lets float32
matmuls use TF32 (`keras_attn._device.allow_tf32`), with `=0` it turns TF32
off (`disable_tf32`, as the tests and the parity workers always do); unset,
each backend's default applies (TensorFlow, and JAX's default precision on
Ampere and later GPUs, use TF32; PyTorch's matmuls do not). Keras's flash
attention setting is left at its default (enabled where the kernel applies).
"""

import argparse
import os
import statistics
import sys

from benchmarks import _common as common

DEFAULT_SIZES = "8x128x256x8,8x256x256x8,4x1024x256x8,2x4096x256x8,1x16384x256x4"
QUICK_SIZES = "8x128x256x8,8x256x256x8"
CONTENDERS = ("keras_attn", "keras", "native")
# Peak bytes of a path that materialises the scores, per score element (float32
# logits, weights and temporaries), measured roughly on this machine.
MATERIALISING_BYTES = {"forward": {"jax": 10, "tensorflow": 16, "torch": 12, "numpy": 16},
                       "train": {"jax": 24, "tensorflow": 32, "torch": 28, "numpy": 32}}


def parse_sizes(text):
    sizes = []
    for item in text.split(","):
        parts = item.lower().split("x")
        if len(parts) != 4:
            raise ValueError(f"A size is BxTxDxH, for example 8x256x256x8. Received: {item!r}")
        sizes.append(tuple(int(p) for p in parts))
    return sizes


def forward_flops(B, T, D, H):
    projections = 4 * 2 * B * T * D * D
    attention = 2 * 2 * B * T * T * D / 2  # QK^T and PV, causal half
    return projections + attention


# ----------------------------------------------------------------------------
# Worker side: one configuration, in its own process.


def _native_layer(keras, D, H):
    backend = keras.backend.backend()

    class NativeAttention(keras.layers.Layer):
        """Four Dense projections around the backend's own attention kernel."""

        def build(self, shape):
            self.q = keras.layers.Dense(D, name="query")
            self.k = keras.layers.Dense(D, name="key")
            self.v = keras.layers.Dense(D, name="value")
            self.o = keras.layers.Dense(D, name="output")
            for layer in (self.q, self.k, self.v):
                layer.build(shape)
            self.o.build(shape)

        def call(self, x):
            B, T = x.shape[0], x.shape[1]

            def heads(t):
                return keras.ops.reshape(t, (B, T, H, D // H))

            q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
            if backend == "torch":
                import torch

                out = torch.nn.functional.scaled_dot_product_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
                out = out.transpose(1, 2)
            elif backend == "jax":
                import jax

                out = jax.nn.dot_product_attention(q, k, v, is_causal=True)
            else:
                raise RuntimeError(f"no native attention kernel on {backend}")
            return self.o(keras.ops.reshape(out, (B, T, D)))

    return NativeAttention()


def _gemm_worker(repeats):
    import keras
    import numpy as np

    n = 2048
    a = keras.ops.convert_to_tensor(np.random.default_rng(0).standard_normal((n, n), "float32"))
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        matmul = jax.jit(lambda x, y: x @ y)
    elif backend == "tensorflow":
        import tensorflow as tf

        matmul = tf.function(lambda x, y: tf.matmul(x, y), jit_compile=True)
    else:
        matmul = keras.ops.matmul
    run = lambda: keras.ops.convert_to_numpy(matmul(a, a))
    times = common.interleaved({"gemm": run}, repeats, warmup=2)
    return {"gemm_gflops": 2 * n**3 / statistics.median(times["gemm"]) / 1e9}


def _build(contender, mode, B, T, D, H):
    """A compiled model for one contender and a `run()` doing one step."""
    import keras
    import numpy as np

    import keras_attn

    backend = keras.backend.backend()
    inputs = keras.Input((T, D), batch_size=B)
    if contender == "keras_attn":
        outputs = keras_attn.MultiHeadAttention(H, D // H)(inputs, use_causal_mask=True)
    elif contender == "keras":
        outputs = keras.layers.MultiHeadAttention(H, D // H)(
            inputs, inputs, use_causal_mask=True)
    else:
        outputs = _native_layer(keras, D, H)(inputs)
    model = keras.Model(inputs, outputs)
    model.compile(keras.optimizers.SGD(1e-3), "mse", jit_compile=backend != "torch")
    g = np.random.default_rng(0)
    x = g.standard_normal((B, T, D)).astype("float32")
    y = g.standard_normal((B, T, D)).astype("float32")

    def run():
        if mode == "forward":
            model.predict_on_batch(x)
        else:
            model.train_on_batch(x, y)

    return run


def _interleaved_worker(contenders, mode, B, T, D, H, repeats):
    """All contenders in one process, timed in turn (A B C A B C ...)."""
    runs = {c: _build(c, mode, B, T, D, H) for c in contenders}
    times = common.interleaved(runs, repeats, warmup=2)  # compile / warm up
    return {"median_s": common.medians(times), "runs": repeats}


def _baseline_worker(trees, mode, B, T, D, H, repeats):
    """keras_attn's model from each checkout in `trees` in one process, timed in turn."""
    runs = {}
    for name, root in trees.items():
        common.import_tree(root)
        runs[name] = _build("keras_attn", mode, B, T, D, H)
    return {"median_s": common.medians(common.interleaved(runs, repeats, warmup=2))}


def _model_worker(contender, mode, B, T, D, H, repeats, budget_s):
    import keras_attn  # noqa: F401  (the baseline includes Keras and the backend)

    rss_base = common.peak_rss_gib()
    run = _build(contender, mode, B, T, D, H)
    first = common.timed(run)  # compile / warm up
    times = []
    while len(times) < repeats and (len(times) < 2 or sum(times) < budget_s):
        times.append(common.timed(run))
    return {"median_s": statistics.median(times), "runs": len(times), "first_s": first,
            "rss_base_gib": rss_base, "rss_peak_gib": common.peak_rss_gib()}


def _tf32_setting():
    """KERAS_ATTN_ALLOW_TF32 as a word: 1 "allowed", 0 "off", unset "default"."""
    return {"1": "allowed", "0": "off"}.get(os.environ.get("KERAS_ATTN_ALLOW_TF32", ""),
                                          "default")


def worker(spec):
    if _tf32_setting() != "default":
        from keras_attn import _device

        (_device.allow_tf32 if _tf32_setting() == "allowed" else _device.disable_tf32)()
    if spec["kind"] == "gemm":
        return _gemm_worker(spec["repeats"])
    if spec["kind"] == "baseline":
        return _baseline_worker(spec["trees"], spec["mode"], *spec["size"], spec["repeats"])
    if spec["kind"] == "interleaved":
        return _interleaved_worker(spec["contenders"], spec["mode"], *spec["size"],
                                   spec["repeats"])
    return _model_worker(spec["contender"], spec["mode"], *spec["size"], spec["repeats"],
                         spec["budget_s"])


# ----------------------------------------------------------------------------
# Driver side.


def _spawn(spec, timeout):
    return common.spawn("benchmarks.attention", spec, timeout)


def _skip_reason(backend, contender, mode, size, mem_limit_gib, train_max_t):
    B, T, D, H = size
    if contender == "native" and backend not in ("torch", "jax"):
        return f"{backend} has no native fused attention"
    if mode == "train" and T > train_max_t:
        return f"train step skipped above T={train_max_t} (--train-max-t)"
    # keras_attn ("auto") never materialises scores above the threshold; torch's
    # SDPA (keras and native) runs a flash kernel for unmasked causal attention.
    if contender == "keras_attn" or backend == "torch":
        return None
    estimate = B * H * T * T * MATERIALISING_BYTES[mode].get(backend, 32) / 2**30
    if estimate > mem_limit_gib:
        return f"would need ~{estimate:.0f} GiB (> --mem-limit-gib {mem_limit_gib:g})"
    return None


def _fmt(value, spec="{:.3f}"):
    return "-" if value is None else spec.format(value)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=None, help=f"BxTxDxH list (default {DEFAULT_SIZES})")
    common.add_options(parser, backend="env", quick=f"sizes {QUICK_SIZES}, 3 repeats",
                       rounds=("--repeats", None, "timed runs per config"),
                       timeout=("--timeout-s", 900, "per configuration"))
    parser.add_argument("--budget-s", type=float, default=20.0,
                        help="stop repeating a config after this much timed work (min 2 runs)")
    parser.add_argument("--modes", default="forward,train")
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--mem-limit-gib", type=float, default=12.0)
    parser.add_argument("--train-max-t", type=int, default=4096)
    parser.add_argument("--interleave-max-t", type=int, default=4096,
                        help="time contenders interleaved in one process up to this T")
    common.add_options(parser, worker=False, json_help=None, baseline=(
        "time keras_attn's model from it and from this tree in one process per size and "
        "mode, interleaved, and print this / baseline"))
    args = parser.parse_args(argv)
    if args.worker:
        return common.worker_main(worker, args.worker)
    if args.backend:
        os.environ["KERAS_BACKEND"] = args.backend  # inherited by the workers

    import keras

    from keras_attn import _device

    backend = keras.backend.backend()
    sizes = parse_sizes(args.sizes or (QUICK_SIZES if args.quick else DEFAULT_SIZES))
    repeats = args.rounds or (3 if args.quick else 10)
    modes = [m for m in args.modes.split(",") if m]
    contenders = [c for c in args.contenders.split(",") if c]
    info = _device.describe()
    print(f"# backend {backend} {info['backend_version']}, keras {info['keras']}, "
          f"{info['device']}, {common.machine()}, TF32 {_tf32_setting()}", flush=True)

    if args.baseline:
        return _compare(args.baseline, sizes, modes, repeats, args)

    gemm = _spawn({"kind": "gemm", "repeats": repeats}, args.timeout)
    gflops = gemm.get("gemm_gflops")
    print(f"# float32 GEMM (2048^3): {_fmt(gflops, '{:.1f}')} GFLOP/s", flush=True)

    rows = []
    for size in sizes:
        for mode in modes:
            runnable = [c for c in contenders if not _skip_reason(
                backend, c, mode, size, args.mem_limit_gib, args.train_max_t)]
            together = {}
            if len(runnable) > 1 and size[1] <= args.interleave_max_t:
                label = f"{'x'.join(map(str, size))} {mode:7s} interleaved {'/'.join(runnable)}"
                together = _spawn({"kind": "interleaved", "contenders": runnable, "mode": mode,
                                   "size": list(size), "repeats": repeats}, args.timeout)
                status = together.get("error") or ", ".join(
                    f"{c} {t * 1e3:.1f} ms" for c, t in together["median_s"].items())
                print(f"{label}: {status}", flush=True)
            for contender in contenders:
                label = f"{'x'.join(map(str, size))} {mode:7s} {contender:10s}"
                reason = _skip_reason(backend, contender, mode, size, args.mem_limit_gib,
                                      args.train_max_t)
                if reason:
                    result = {"skipped": reason}
                else:
                    if sys.stdout.isatty():
                        print(f"... {label}", end="", flush=True)
                    result = _spawn({"kind": "model", "contender": contender, "mode": mode,
                                     "size": list(size), "repeats": repeats,
                                     "budget_s": args.budget_s}, args.timeout)
                    status = result.get("error") or (
                        f"{result['median_s'] * 1e3:.1f} ms, peak {result['rss_peak_gib']:.2f} GiB")
                    print(f"\r{label} {status}" if sys.stdout.isatty() else f"{label} {status}",
                          flush=True)
                if contender in together.get("median_s", {}):
                    result["alone_median_s"] = result.get("median_s")
                    result["median_s"] = together["median_s"][contender]
                    result["interleaved"] = True
                rows.append({"size": size, "mode": mode, "contender": contender, **result})

    print()
    print(table(rows, gflops, backend))
    if args.json:
        common.write_json(args.json, {"backend": backend, "info": info, "tf32": _tf32_setting(),
                                      "gemm_gflops": gflops, "rows": rows})


def _compare(baseline, sizes, modes, repeats, args):
    """`--baseline`: keras_attn from `baseline` and from this tree, per size and mode."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trees = {"baseline": os.path.abspath(baseline), "this": here}
    print(f"keras_attn.MultiHeadAttention, causal, float32; medians of {repeats} interleaved "
          f"runs per process (baseline {baseline})\n\n"
          "| size BxTxDxH | mode | baseline ms | this ms | this / baseline |\n"
          "|---|---|---:|---:|---:|", flush=True)
    worst = 0.0
    for size in sizes:
        for mode in modes:
            if _skip_reason(keras_backend(), "keras_attn", mode, size, args.mem_limit_gib,
                            args.train_max_t):
                continue
            result = _spawn({"kind": "baseline", "trees": trees, "mode": mode,
                             "size": list(size), "repeats": repeats}, args.timeout)
            label = f"| {'x'.join(map(str, size))} | {mode} |"
            if "error" in result:
                print(f"{label} error: {result['error']} | | |", flush=True)
                return 1
            before, after = (result["median_s"][n] * 1e3 for n in ("baseline", "this"))
            worst = max(worst, after / before)
            print(f"{label} {before:.2f} | {after:.2f} | {after / before:.3f} |", flush=True)
    print(f"\nworst this / baseline: {worst:.3f}")
    return 0


def keras_backend():
    import keras

    return keras.backend.backend()


def table(rows, gflops, backend):
    """Markdown table: time, ratio vs keras's layer, GEMM fraction, peak RSS."""
    lines = [f"backend **{backend}**, float32 GEMM {_fmt(gflops, '{:.1f}')} GFLOP/s", "",
             "| B x T x D x H | step | contender | median ms | / keras | GEMM frac. "
             "| alone ms | peak RSS GiB | RSS after import GiB |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    by_key = {(tuple(r["size"]), r["mode"], r["contender"]): r for r in rows}
    for r in rows:
        size, mode = tuple(r["size"]), r["mode"]
        name = "x".join(map(str, size))
        if "median_s" not in r:
            why = r.get("skipped") or r.get("error")
            lines.append(f"| {name} | {mode} | {r['contender']} | n/a: {why} | | | | | |")
            continue
        ref = by_key.get((size, mode, "keras"), {})
        ratio = r["median_s"] / ref["median_s"] if "median_s" in ref else None
        flops = forward_flops(*size) * (3 if mode == "train" else 1)
        frac = flops / r["median_s"] / 1e9 / gflops if gflops else None
        lines.append(f"| {name} | {mode} | {r['contender']} | {r['median_s'] * 1e3:.1f} | "
                     f"{_fmt(ratio, '{:.2f}')} | {_fmt(frac, '{:.2f}')} | "
                     f"{_fmt(r.get('alone_median_s', r['median_s']) * 1e3, '{:.1f}')} | "
                     f"{r['rss_peak_gib']:.2f} | {r['rss_base_gib']:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
