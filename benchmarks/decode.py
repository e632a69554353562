"""Benchmark: per-token decode latency with a key/value cache vs recomputing the prefix.

    python -m benchmarks.decode                         # every backend, default sizes
    python -m benchmarks.decode --backend jax --quick   # small smoke sizes
    python -m benchmarks.decode --json decode.json
    python -m benchmarks.decode --baseline ../before   # cached step vs another checkout

Model: a stack of 4 Llama-style `keras_attn.TransformerDecoderLayer`s (pre-RMSNorm,
H=8 query heads over H_kv=2 key/value heads of width 64, RoPE, SwiGLU feed-forward of
width 2D, no biases) at D=512 and B=1, float32, on embeddings (no vocabulary).

- `cached`: after a prefill of the P=512-token prompt, N=256 one-token steps, each
  one call of the compiled step `(x_t, caches, index) -> (y_t, caches)` over caches of
  P + N slots; the median over the steps (and the mean).
- `uncached`: the same token computed by running the stack over the whole prefix
  (causal); timed at prefix lengths P, P + N/2 and P + N - 1. Its cost grows about
  linearly over the run, so the per-token figure over the N steps is taken as the
  mean of those three (the middle one is their mean's closest single point).
- `keras-hub` (where `keras_hub` imports): one attention layer's cached step,
  `keras_attn.MultiHeadAttention(num_heads=8, key_dim=64)` against keras-hub's
  `CachedMultiHeadAttention` (same heads: it has no grouped-query option), the cache
  filled to P, the slot mask built from the index inside the step for keras-hub.

Execution: `jax.jit` on JAX (weights passed as arguments), `tf.function(
jit_compile=True)` on TensorFlow, eager PyTorch under `torch.no_grad()`. Timing: one
process per backend builds every contender and times them in turn, round after round
(cached run, uncached lengths, keras-hub pair), after a warm-up call of each; medians
over rounds. Target: cached per-token <= 1/5 of uncached on every backend.
"""

import argparse
import json
import os
import statistics
import sys
import time

from benchmarks import _common as common

TARGET = 0.2  # cached / uncached per-token time
DEFAULTS = {"prompt": 512, "new": 256, "dim": 512, "layers": 4, "rounds": 3}
QUICK = {"prompt": 64, "new": 32, "dim": 128, "layers": 2, "rounds": 2}
HEADS, KV_HEADS, HEAD_DIM = 8, 2, 64


# ----------------------------------------------------------------------------
# Worker side.


def _compile(backend, fn, variables):
    """`fn(*args)` compiled for `backend`; JAX gets the weights as arguments."""
    import keras

    if backend == "jax":
        import jax

        def pure(values, *args):
            with keras.StatelessScope(state_mapping=list(zip(variables, values, strict=True))):
                return fn(*args)

        jitted = jax.jit(pure)
        return lambda *args: jitted([v.value for v in variables], *args)
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, jit_compile=True)
    import torch

    def eager(*args):
        with torch.no_grad():
            return fn(*args)

    return eager


def _block(backend):
    """Wait for the result (JAX dispatches asynchronously)."""
    if backend == "jax":
        import jax

        return lambda tree: jax.block_until_ready(tree)
    return lambda tree: tree


def _stack(spec):
    import keras

    import keras_attn

    D, layers = spec["dim"], spec["layers"]
    keras.utils.set_random_seed(0)
    stack = []
    for i in range(layers):
        layer = keras_attn.TransformerDecoderLayer(
            HEADS, key_dim=HEAD_DIM, intermediate_dim=2 * D, num_key_value_heads=KV_HEADS,
            rope_max_wavelength=10000.0, normalization="rms", normalize_first=True,
            gated_feed_forward=True, activation="silu", use_bias=False, name=f"decoder_{i}")
        layer.build((1, None, D))
        stack.append(layer)
    return stack


def _stack_part(spec, rounds_out):
    backend, P, N = spec["backend"], spec["prompt"], spec["new"]
    cached_run, stack, x = _cached_steps(spec)
    block = _block(backend)

    def full(prefix):
        for layer in stack:
            prefix = layer(prefix)
        return prefix[:, -1:]

    uncached = _compile(backend, full, [v for layer in stack for v in layer.weights])
    lengths = (P, P + N // 2, P + N - 1)
    prefixes = {n: x[:, :n] for n in lengths}
    for n in lengths:  # warm-up: one compile per shape
        block(uncached(prefixes[n]))
    for _ in range(spec["rounds"]):
        steps = cached_run()
        rounds_out["cached_median"].append(statistics.median(steps))
        rounds_out["cached_mean"].append(statistics.fmean(steps))
        for n in lengths:
            rounds_out[f"uncached_{n}"].append(
                common.timed(lambda n=n: block(uncached(prefixes[n]))))
    return lengths


def _hub_part(spec, rounds_out):
    """keras_attn vs keras-hub's CachedMultiHeadAttention, one cached step, H = H_kv."""
    try:
        from keras_hub.layers import CachedMultiHeadAttention
    except ImportError as error:
        return f"keras-hub not installed here ({error})"
    import numpy as np
    from keras import ops

    import keras_attn

    backend, P, N, D = spec["backend"], spec["prompt"], spec["new"], spec["dim"]
    heads = HEADS
    S = P + N
    ours = keras_attn.MultiHeadAttention(num_heads=heads, key_dim=HEAD_DIM)
    hub = CachedMultiHeadAttention(num_heads=heads, key_dim=HEAD_DIM)
    for layer in (ours, hub):
        layer.build((1, 1, D), (1, 1, D))
    rng = np.random.default_rng(1)
    x_t = ops.convert_to_tensor(rng.standard_normal((1, 1, D)).astype("float32"))
    cache = ops.convert_to_tensor(
        rng.standard_normal((1, 2, S, heads, HEAD_DIM)).astype("float32"))
    index = ops.convert_to_tensor(P, "int32")

    def ours_step(x, cache, index):
        return ours(x, x, cache=cache, cache_update_index=index, use_causal_mask=True)

    def hub_step(x, cache, index):
        mask = ops.expand_dims(ops.arange(S) <= index, 0)  # (1, S): written slots
        mask = ops.expand_dims(mask, 0)  # (1, 1, S)
        return hub(x, x, attention_mask=mask, cache=cache, cache_update_index=index)

    block = _block(backend)
    steps = {"keras_attn": _compile(backend, ours_step, ours.weights),
             "keras_hub": _compile(backend, hub_step, hub.weights)}
    for fn in steps.values():
        block(fn(x_t, cache, index))
    for _ in range(spec["rounds"]):
        for name, fn in steps.items():
            times = [common.timed(lambda fn=fn: block(fn(x_t, cache, index))) for _ in range(20)]
            rounds_out[f"hub_{name}"].append(statistics.median(times))
    return None


def worker(spec):
    import collections

    from keras_attn import _device

    _device.single_cpu_thread_for_small_ops()
    rounds = collections.defaultdict(list)
    lengths = _stack_part(spec, rounds)
    hub_note = _hub_part(spec, rounds)
    result = {name: statistics.median(values) * 1e3 for name, values in rounds.items()}
    result["uncached_mean"] = statistics.fmean(result[f"uncached_{n}"] for n in lengths)
    result["ratio"] = result["cached_median"] / result["uncached_mean"]
    if hub_note is None:
        result["hub_ratio"] = result["hub_keras_attn"] / result["hub_keras_hub"]
    else:
        result["hub_note"] = hub_note
    result["lengths"] = list(lengths)
    result["info"] = _device.describe()
    return result


# ----------------------------------------------------------------------------
# Parent side.


def run_backend(backend, spec, timeout, tree=None):
    """One worker process; `tree` (a checkout's root) runs that checkout's code instead."""
    return common.spawn("benchmarks.decode", {**spec, "backend": backend}, timeout, tree=tree)


def table(results, spec):
    P, N = spec["prompt"], spec["new"]
    lines = [f"B=1, D={spec['dim']}, {spec['layers']} layers, H={HEADS}, H_kv={KV_HEADS}, "
             f"prompt {P}, {N} new tokens; ms per token, medians of {spec['rounds']} rounds",
             "",
             "| backend | cached (median step) | uncached @ " + " / ".join(
                 str(n) for n in (P, P + N // 2, P + N - 1))
             + " | uncached mean | cached / uncached | target <= 0.20 "
               "| keras_attn / keras-hub step |",
             "|---|---:|---:|---:|---:|---|---|"]
    for backend, r in results.items():
        if "error" in r:
            lines.append(f"| {backend} | error: {r['error']} | | | | | |")
            continue
        uncached = " / ".join(f"{r[f'uncached_{n}']:.1f}" for n in r["lengths"])
        hub = (f"{r['hub_keras_attn']:.2f} / {r['hub_keras_hub']:.2f} ms = "
               f"{r['hub_ratio']:.2f}" if "hub_ratio" in r else r["hub_note"])
        lines.append(f"| {backend} | {r['cached_median']:.2f} | {uncached} | "
                     f"{r['uncached_mean']:.1f} | {r['ratio']:.3f} | "
                     f"{'met' if r['ratio'] <= TARGET else 'MISSED'} | {hub} |")
    return "\n".join(lines)


def _cached_steps(spec):
    """`(run, stack, x)`: `run()` times the prefilled stack's `N` cached steps (a list of
    seconds); `x` `(1, P + N, D)` holds the prompt and the new tokens' inputs."""
    import numpy as np
    from keras import ops

    import keras_attn

    backend, P, N, D = spec["backend"], spec["prompt"], spec["new"], spec["dim"]
    stack = _stack(spec)
    block = _block(backend)

    def step(x_t, caches, index):
        new = []
        for layer, cache in zip(stack, caches, strict=True):
            x_t, cache = layer(x_t, self_attention_cache=cache,
                               self_attention_cache_update_index=index)
            new.append(cache)
        return x_t, new

    cached_step = _compile(backend, step, [v for layer in stack for v in layer.weights])
    x = ops.convert_to_tensor(
        np.random.default_rng(0).standard_normal((1, P + N, D)).astype("float32"))
    empty = [keras_attn.empty_cache(layer, 1, P + N) for layer in stack]
    _, filled = block(cached_step(x[:, :P], empty, ops.convert_to_tensor(0, "int32")))
    indices = [ops.convert_to_tensor(P + t, "int32") for t in range(N)]
    tokens = [x[:, P + t:P + t + 1] for t in range(N)]
    block(cached_step(tokens[0], filled, indices[0]))  # warm-up: compiles the step

    def run():
        caches, steps = filled, []
        for t in range(N):
            start = time.perf_counter()
            y, caches = cached_step(tokens[t], caches, indices[t])
            block(y)
            steps.append(time.perf_counter() - start)
        return steps

    return run, stack, x


def compare_worker(spec):
    """Both checkouts' stacks in one process, their cached runs interleaved round by round."""
    from keras_attn import _device

    _device.single_cpu_thread_for_small_ops()
    runs, files = {}, {}
    for name, root in spec["trees"].items():
        files[name] = common.import_tree(root).__file__
        runs[name] = _cached_steps(spec)[0]
    times = {name: [] for name in runs}
    times["files"] = files
    for r in range(spec["rounds"]):
        order = list(runs) if r % 2 == 0 else list(reversed(runs))  # A B, B A, ...
        for name in order:
            times[name].append(statistics.median(runs[name]()) * 1e3)
    return times


def compare(backends, spec, timeout, baseline):
    """Baseline and this tree in one process per backend, interleaved: cached step ratios.

    One worker builds the same stack from each checkout's `keras_attn` (this tree's
    benchmark code, the same seed and inputs), then alternates their cached runs
    (A B B A ...), so process-to-process variance (±20% here) does not enter the ratio.
    """
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = {**spec, "rounds": max(spec["rounds"], 8),
            "trees": {"baseline": os.path.abspath(baseline), "this": here}}
    print(f"ms per cached step (median of each round's {spec['new']} steps), "
          f"{spec['rounds']} interleaved rounds\n\n"
          "| backend | baseline (ms, median) | this tree (ms, median) | this / baseline |\n"
          "|---|---|---|---:|")
    for backend in backends:
        print(f"[decode] {backend} ...", file=sys.stderr, flush=True)
        result = common.spawn("benchmarks.decode", {**spec, "backend": backend,
                                                    "compare": True}, timeout)
        if "error" in result:
            print(f"| {backend} | error: {result['error']} | | |")
            return 1
        before, after = (statistics.median(result[n]) for n in ("baseline", "this"))
        print(f"| {backend} | {before:.2f} | {after:.2f} | {after / before:.3f} |", flush=True)
        print(f"[decode] {backend}: {result['files']}", file=sys.stderr, flush=True)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_options(parser, backend="list", quick="small smoke sizes",
                       rounds=("--rounds", None, "timing rounds (default 3)"),
                       timeout=("--timeout", 900, "seconds per backend"),
                       json_help="write the results here",
                       baseline="one process per backend builds the stack from each "
                       "checkout's keras_attn and alternates their cached steps")
    args = parser.parse_args(argv)
    if args.worker:
        chosen = compare_worker if json.loads(args.worker).get("compare") else worker
        return common.worker_main(chosen, args.worker)
    spec = dict(QUICK if args.quick else DEFAULTS)
    if args.rounds:
        spec["rounds"] = args.rounds
    if args.baseline:
        return compare(common.backends(args), spec, args.timeout, args.baseline)
    results = {}
    for backend in common.backends(args):
        print(f"[decode] {backend} ...", file=sys.stderr, flush=True)
        results[backend] = run_backend(backend, spec, args.timeout)
    print(table(results, spec))
    if args.json:
        common.write_json(args.json, {"spec": spec, "results": results})
    return 0 if all("error" not in r and r["ratio"] <= TARGET for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
