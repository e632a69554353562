"""Benchmark: peak memory of a MultiHeadAttention forward+backward at long sequence lengths.

    python -m benchmarks.memory                          # all backends, T=8192, causal and not
    python -m benchmarks.memory --backend tensorflow --length 16384 --modes eager --causal
    python -m benchmarks.memory --json memory.json

`keras_attn.MultiHeadAttention(num_heads=4, key_dim=64)` (default
`implementation="auto"`) on a `(1, T, 256)` float32 input, self-attention.
Each (backend, mode, causal) configuration runs in a fresh subprocess
(KERAS_BACKEND set before Keras is imported), which builds the layer, runs
one forward+backward to warm up (and trace/compile) and one more that is
timed. The loss is `mean(out**2)`; gradients are taken w.r.t. the layer's
weights and the input.

Modes:

- tensorflow: `eager` (`tf.GradientTape`), `function` (`tf.function`),
  `xla` (`tf.function(jit_compile=True)`), `function-none-batch`
  (`tf.function` with `input_signature` batch dim `None`: checks that an
  unknown batch does not send `auto` to the fused path);
- jax: `eager` (`jax.grad` of `stateless_call`, not jitted), `jit`
  (`jax.jit(jax.grad(...))`);
- torch: `eager` (autograd `.backward()`), `compile` (`torch.compile` of the
  layer; skipped by default, `--modes` to ask for it).

Reported: the RSS high-water mark (`resource.getrusage` `ru_maxrss`) after
imports + build (baseline), after the warm-up step, and after the measured
step (peak); the delta peak - baseline; wall times; and which attention path
`keras_attn._policy.observe_paths` recorded. `--step forward` runs the forward
alone (to tell the forward's memory from the backward's).
"""

import argparse
import time

from benchmarks import _common as common

MODES = {
    "tensorflow": ("eager", "function", "xla", "function-none-batch"),
    "jax": ("eager", "jit"),
    "torch": ("eager", "compile"),
}
DEFAULT_SKIP = {("torch", "compile")}
TARGET_GIB = 1.5


# ----------------------------------------------------------------------------
# Worker side: one configuration in its own process.


def _step_tensorflow(layer, x, mode, causal, step):
    import tensorflow as tf

    def forward(x):
        out = layer(x, use_causal_mask=causal)
        return tf.reduce_mean(tf.square(out))

    def train(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = forward(x)
        grads = tape.gradient(loss, [x, *layer.trainable_variables])
        return loss, grads

    fn = forward if step == "forward" else train
    if mode == "function":
        fn = tf.function(fn)
    elif mode == "xla":
        fn = tf.function(fn, jit_compile=True)
    elif mode == "function-none-batch":
        fn = tf.function(fn, input_signature=[tf.TensorSpec((None, *x.shape[1:]), tf.float32)])
    x = tf.constant(x)

    def run():
        result = fn(x)
        return [float(tf.reduce_sum(g)) for g in tf.nest.flatten(result)]

    return run


def _step_jax(layer, x, mode, causal, step):
    import jax
    import jax.numpy as jnp

    trainable = [v.value for v in layer.trainable_variables]
    non_trainable = [v.value for v in layer.non_trainable_variables]

    def loss(trainable, x):
        out, _ = layer.stateless_call(trainable, non_trainable, x, use_causal_mask=causal)
        return jnp.mean(jnp.square(out))

    fn = loss if step == "forward" else jax.grad(loss, argnums=(0, 1))
    if mode == "jit":
        fn = jax.jit(fn)
    x = jnp.asarray(x)

    def run():
        result = fn(trainable, x)
        return [float(jnp.sum(g)) for g in jax.tree_util.tree_leaves(result)]

    return run


def _step_torch(layer, x, mode, causal, step):
    import torch

    call = layer
    if mode == "compile":
        call = torch.compile(layer)
    x = torch.tensor(x, requires_grad=step != "forward")
    weights = [v.value for v in layer.trainable_variables]

    def run():
        if step == "forward":
            with torch.no_grad():
                return [float(torch.mean(torch.square(call(x, use_causal_mask=causal))))]
        for w in weights:
            w.grad = None
        x.grad = None
        loss = torch.mean(torch.square(call(x, use_causal_mask=causal)))
        loss.backward()
        return [float(loss)] + [float(torch.sum(t.grad)) for t in (x, *weights)]

    return run


def worker(spec):
    import math

    import keras
    import numpy as np

    import keras_attn
    from keras_attn._policy import observe_paths

    T, D = spec["length"], 256
    layer = keras_attn.MultiHeadAttention(num_heads=4, key_dim=64)
    layer.build((1, T, D))
    x = np.random.default_rng(0).standard_normal((1, T, D)).astype("float32")
    make = {"tensorflow": _step_tensorflow, "jax": _step_jax, "torch": _step_torch}
    run = make[keras.backend.backend()](layer, x, spec["mode"], spec["causal"], spec["step"])
    base, base_now = common.peak_rss_gib(), common.current_rss_gib()

    with observe_paths() as taken:
        warm_s = common.timed(run)  # warm up: trace / compile
    after_warm = common.peak_rss_gib()
    paths = dict(taken)
    start = time.perf_counter()
    values = run()
    step_s = time.perf_counter() - start
    peak = common.peak_rss_gib()
    return {
        "path": "+".join(f"{p}x{n}" if n > 1 else p for p, n in sorted(paths.items())) or "-",
        "rss_base_gib": base, "rss_base_now_gib": base_now, "rss_after_warmup_gib": after_warm,
        "rss_peak_gib": peak, "delta_gib": peak - base,
        "rss_end_now_gib": common.current_rss_gib(),
        "warmup_s": warm_s, "step_s": step_s,
        "finite": all(math.isfinite(v) for v in values),
    }


# ----------------------------------------------------------------------------
# Driver side.


def _spawn(spec, timeout):
    """The worker's result, with the process's wall time (`process_s`)."""
    start = time.perf_counter()
    result = common.spawn("benchmarks.memory", spec, timeout)
    return result if "error" in result else {**result, "process_s": time.perf_counter() - start}


def table(rows):
    lines = ["| backend | mode | causal | step | T | path | peak RSS GiB | baseline GiB | delta GiB "
             f"| < {TARGET_GIB} GiB | warm-up s | step s |",
             "|---|---|---|---|---:|---|---:|---:|---:|---|---:|---:|"]
    for r in rows:
        causal = {True: "yes", False: "no"}.get(r["causal"], "-")
        head = f"| {r['backend']} | {r['mode']} | {causal} | {r['step']} | {r['length']} |"
        if "rss_peak_gib" not in r:
            lines.append(f"{head} n/a: {r.get('skipped') or r.get('error')} | | | | | | |")
            continue
        ok = "yes" if r["rss_peak_gib"] < TARGET_GIB else "**no**"
        if not r.get("finite", True):
            ok += " (non-finite!)"
        lines.append(f"{head} {r['path']} | {r['rss_peak_gib']:.2f} | {r['rss_base_gib']:.2f} | "
                     f"{r['delta_gib']:+.2f} | {ok} | {r['warmup_s']:.1f} | {r['step_s']:.1f} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_options(parser, backend="list", timeout=("--timeout-s", 900, "per configuration"))
    parser.add_argument("--length", type=int, default=8192, help="T = S (default 8192)")
    parser.add_argument("--causal", action=argparse.BooleanOptionalAction, default=None,
                        help="only causal (--causal) or only non-causal (--no-causal); default both")
    parser.add_argument("--modes", default=None,
                        help="comma list (default: all but torch 'compile'); "
                             + "; ".join(f"{b}: {','.join(m)}" for b, m in MODES.items()))
    parser.add_argument("--step", choices=("train", "forward"), default="train",
                        help="forward+backward (default) or the forward alone")
    args = parser.parse_args(argv)
    if args.worker:
        return common.worker_main(worker, args.worker)

    wanted = set(args.modes.split(",")) if args.modes else None
    causals = [True, False] if args.causal is None else [args.causal]
    configs = []
    for backend in common.backends(args):
        for mode in MODES[backend]:
            if wanted is None and (backend, mode) in DEFAULT_SKIP:
                configs.append((backend, mode, None, "skipped by default (--modes compile)"))
            elif wanted is None or mode in wanted:
                configs.extend((backend, mode, c, None) for c in causals)
    print(f"# T=S={args.length}, B=1, D=256, H=4, step={args.step}, {common.machine()}", flush=True)
    rows = []
    for n, (backend, mode, causal, skipped) in enumerate(configs, 1):
        row = {"backend": backend, "mode": mode, "causal": causal, "step": args.step,
               "length": args.length}
        label = f"[{n}/{len(configs)}] {backend} {mode} causal={causal}"
        if skipped:
            rows.append({**row, "skipped": skipped})
            print(f"{label}: {skipped}", flush=True)
            continue
        print(f"{label} ...", flush=True)
        result = _spawn({"backend": backend, "mode": mode, "causal": causal,
                         "length": args.length, "step": args.step}, args.timeout)
        rows.append({**row, **result})
        status = result.get("error") or (
            f"path {result['path']}, peak {result['rss_peak_gib']:.2f} GiB "
            f"(base {result['rss_base_gib']:.2f}, +{result['delta_gib']:.2f}), "
            f"step {result['step_s']:.1f} s, warm-up {result['warmup_s']:.1f} s")
        print(f"{label}: {status}", flush=True)
    print()
    print(table(rows))
    if args.json:
        common.write_json(args.json, {"length": args.length, "step": args.step, "rows": rows})


if __name__ == "__main__":
    main()
