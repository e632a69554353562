"""Benchmark: sliding-window vs full causal attention, grouped-query vs multi-head attention.

    python -m benchmarks.modern                          # all backends, default sizes
    python -m benchmarks.modern --backend jax --quick    # small smoke sizes
    python -m benchmarks.modern --backend torch --parts window --json modern.json

Functional core `keras_attn.scaled_dot_product_attention` on float32
`(B, H, T, d)` tensors, causal self-attention:

- `window`: sliding window W=1024 vs full causal at B=1, T=S=16384, H=4,
  d=64 (D=256), `implementation="blockwise"` for both (the blockwise path
  skips the key blocks outside the window, so its cost grows like T * W).
  On PyTorch (elsewhere with `--full-auto`) full causal also runs `"auto"`,
  which there is SDPA's flash kernel (on JAX and TensorFlow it is blockwise).
- `gqa`: grouped-query H=8, H_kv=2 vs multi-head H=8 (key/value with 8
  heads) at B=1, T=S=4096, d=64, on the `"auto"` path and on `"blockwise"`.
- `layer`: `keras_attn.MultiHeadAttention(num_heads=8, key_dim=64,
  num_key_value_heads=2)` vs `num_key_value_heads=8` at D=512, T=4096, with
  parameter counts; skipped (and reported so) when the layer does not take
  `num_key_value_heads`.

Steps: `forward`, and `train` = forward + gradients of `mean(out**2)` w.r.t.
q, k, v (or the layer's weights and input). Execution: `jax.jit` on JAX,
`tf.function` on TensorFlow (`--tf-xla` for `jit_compile=True`), eager on
PyTorch (`torch.no_grad()` for the forward), whose workers run with
`OMP_WAIT_POLICY=PASSIVE` (`--omp-active` to keep OpenMP's default).

Timing: per backend and part, one process builds every contender of a step
and times them in turn (A B A B ...), after one warm-up call each, so that
machine noise hits them alike; medians are reported. Memory: each
(contender, step) also runs in a fresh process whose `resource.getrusage`
high-water mark (peak RSS) after one warm-up and one timed call is
reported, next to the baseline after imports and input creation, and the
path that `keras_attn._policy.observe_paths` recorded.
"""

import argparse
import json
import os
import time

from benchmarks import _common as common

PARTS = ("window", "gqa", "layer")
WINDOW_TARGET = 0.25  # window time / full causal time
MEMORY_TARGET_GIB = 1.0
DEFAULTS = {"length": 16384, "window": 1024, "heads": 4, "gqa_length": 4096, "repeats": 3,
            "block_size": None}
QUICK = {"length": 2048, "window": 256, "heads": 4, "gqa_length": 1024, "repeats": 2,
         "block_size": 128}
HEAD_DIM = 64
GQA_HEADS, GQA_KV_HEADS = 8, 2
LAYER_DIM = 512


# ----------------------------------------------------------------------------
# Worker side.


def _contenders(spec):
    """name -> (query heads, key/value heads, length, scaled_dot_product_attention kwargs)."""
    if spec["part"] == "window":
        H, T = spec["heads"], spec["length"]
        full = {"is_causal": True, "implementation": "blockwise"}
        out = {"window": (H, H, T, {**full, "sliding_window": spec["window"]}), "full": (H, H, T, full)}
        if spec.get("full_auto") or (spec.get("full_auto") is None and spec["backend"] == "torch"):
            out["full-auto"] = (H, H, T, {"is_causal": True, "implementation": "auto"})
        return out
    T = spec["gqa_length"]
    out = {}
    for impl in ("auto", "blockwise"):
        kwargs = {"is_causal": True, "implementation": impl}
        out[f"gqa-{impl}"] = (GQA_HEADS, GQA_KV_HEADS, T, kwargs)
        out[f"mha-{impl}"] = (GQA_HEADS, GQA_HEADS, T, kwargs)
    return out


def _inputs(heads, kv_heads, length):
    import numpy as np

    g = np.random.default_rng(0)
    q = g.standard_normal((1, heads, length, HEAD_DIM)).astype("float32")
    k, v = (g.standard_normal((1, kv_heads, length, HEAD_DIM)).astype("float32") for _ in range(2))
    return q, k, v


def _core_fn(backend, step, kwargs, arrays, tf_mode):
    """A no-argument callable running one step of the functional core, synchronously.

    `tf_mode` (TensorFlow): "xla" (`tf.function(jit_compile=True)`), "graph" (a
    plain `tf.function`) or "eager"."""
    import keras_attn

    def attend(q, k, v):
        return keras_attn.scaled_dot_product_attention(q, k, v, **kwargs)

    if backend == "jax":
        import jax
        import jax.numpy as jnp

        q, k, v = (jnp.asarray(a) for a in arrays)
        if step == "forward":
            fn = jax.jit(attend)
        else:
            fn = jax.jit(jax.grad(lambda q, k, v: jnp.mean(jnp.square(attend(q, k, v))),
                                  argnums=(0, 1, 2)))
        return lambda: jax.block_until_ready(fn(q, k, v))
    if backend == "tensorflow":
        import tensorflow as tf

        q, k, v = (tf.constant(a) for a in arrays)

        def train(q, k, v):
            with tf.GradientTape() as tape:
                tape.watch([q, k, v])
                loss = tf.reduce_mean(tf.square(attend(q, k, v)))
            return tape.gradient(loss, [q, k, v])

        fn = attend if step == "forward" else train
        if tf_mode != "eager":
            fn = tf.function(fn, jit_compile=tf_mode == "xla")
        return lambda: fn(q, k, v)  # TensorFlow on the CPU returns when the values are ready
    import torch

    if step == "forward":
        q, k, v = (torch.from_numpy(a) for a in arrays)

        def run():
            with torch.no_grad():
                return attend(q, k, v)

        return run
    q, k, v = (torch.from_numpy(a).requires_grad_() for a in arrays)
    return lambda: torch.autograd.grad(torch.mean(torch.square(attend(q, k, v))), (q, k, v))


def _layer_fn(backend, step, kv_heads, length, tf_xla):
    """`(run, parameter count)` for the MultiHeadAttention layer with `kv_heads`."""
    import numpy as np

    import keras_attn

    layer = keras_attn.MultiHeadAttention(num_heads=GQA_HEADS, key_dim=LAYER_DIM // GQA_HEADS,
                                          num_key_value_heads=kv_heads)
    layer.build((1, length, LAYER_DIM))
    params = int(sum(np.prod(w.shape) for w in layer.trainable_weights))
    x = np.random.default_rng(0).standard_normal((1, length, LAYER_DIM)).astype("float32")
    if backend == "jax":
        import jax
        import jax.numpy as jnp

        trainable = [w.value for w in layer.trainable_variables]
        non_trainable = [w.value for w in layer.non_trainable_variables]

        def loss(trainable, x):
            out, _ = layer.stateless_call(trainable, non_trainable, x, use_causal_mask=True)
            return jnp.mean(jnp.square(out))

        if step == "forward":
            fn = jax.jit(lambda t, x: layer.stateless_call(t, non_trainable, x,
                                                           use_causal_mask=True)[0])
        else:
            fn = jax.jit(jax.grad(loss, argnums=(0, 1)))
        x = jnp.asarray(x)
        return (lambda: jax.block_until_ready(fn(trainable, x))), params
    if backend == "tensorflow":
        import tensorflow as tf

        def train(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                loss = tf.reduce_mean(tf.square(layer(x, use_causal_mask=True)))
            return tape.gradient(loss, [x, *layer.trainable_variables])

        forward = lambda x: layer(x, use_causal_mask=True)
        fn = tf.function(forward if step == "forward" else train, jit_compile=tf_xla)
        x = tf.constant(x)
        return (lambda: fn(x)), params
    import torch

    x = torch.from_numpy(x)
    if step == "forward":
        def run():
            with torch.no_grad():
                return layer(x, use_causal_mask=True)

        return run, params
    x.requires_grad_()
    weights = [w.value for w in layer.trainable_variables]

    def run():
        loss = torch.mean(torch.square(layer(x, use_causal_mask=True)))
        return torch.autograd.grad(loss, [x, *weights])

    return run, params


def _build(spec, name, step):
    """`(run, extra info)` of one contender."""
    import keras

    backend = keras.backend.backend()
    if spec["part"] == "layer":
        run, params = _layer_fn(backend, step, int(name.split("=")[1]), spec["gqa_length"],
                                spec["tf_xla"])
        return run, {"params": params}
    heads, kv_heads, length, kwargs = _contenders(spec)[name]
    return _core_fn(backend, step, kwargs, _inputs(heads, kv_heads, length),
                    "xla" if spec["tf_xla"] else "graph"), {}


def _paths_string(counter):
    return "+".join(sorted(counter)) or "-"


def _setup(spec):
    if spec["backend"] == "torch" and spec.get("omp_passive"):
        # Before torch is imported: OpenMP threads that spin at each op's barrier
        # lose their core on a loaded machine, and the blockwise path's many small
        # ops then ran 10-40x slower with 2 threads (see README).
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    import keras_attn

    if spec.get("block_size"):
        keras_attn.config.set_attention_block_size(spec["block_size"])
    if spec["part"] == "layer":
        import inspect

        if "num_key_value_heads" not in inspect.signature(keras_attn.MultiHeadAttention).parameters:
            return "keras_attn.MultiHeadAttention does not take num_key_value_heads (yet)"
    return None


def time_worker(spec):
    """Every contender of `spec["names"]` for one step, timed in turn."""
    from keras_attn._policy import observe_paths

    runs, paths = {}, {}
    for name in spec["names"]:
        with observe_paths() as taken:
            runs[name], _ = _build(spec, name, spec["step"])
            runs[name]()  # trace / compile (the memory process times a second call alone)
        paths[name] = _paths_string(taken)
    times = common.interleaved(runs, spec["repeats"])
    return {"median_s": common.medians(times), "times_s": times, "paths": paths}


def memory_worker(spec):
    """One contender and step in this fresh process: peak RSS, alone time, path."""
    from keras_attn._policy import observe_paths

    name, step = spec["names"][0], spec["step"]
    with observe_paths() as taken:
        run, extra = _build(spec, name, step)
        base = common.peak_rss_gib()
        warm = common.timed(run)  # trace / compile
    paths = _paths_string(taken)
    alone = common.timed(run)
    peak = common.peak_rss_gib()
    return {"rss_base_gib": base, "rss_peak_gib": peak, "delta_gib": peak - base,
            "warmup_s": warm, "alone_s": alone, "path": paths, **extra}


def worker(spec):
    skipped = _setup(spec)
    if skipped:
        return {"skipped": skipped}
    return time_worker(spec) if spec["kind"] == "time" else memory_worker(spec)


# ----------------------------------------------------------------------------
# Driver side.


def _spawn(spec, timeout):
    return common.spawn("benchmarks.modern", spec, timeout)


def _names(part, spec):
    if part == "layer":
        return [f"kv_heads={GQA_KV_HEADS}", f"kv_heads={GQA_HEADS}"]
    return list(_contenders({**spec, "part": part}))


def run_part(backend, part, spec, timeout):
    """Interleaved times, then one process per (contender, step) for memory."""
    spec = {**spec, "backend": backend, "part": part}
    names = _names(part, spec)
    result = {"time": {}, "memory": {}}
    for step in ("forward", "train"):
        label = f"[{backend}] {part} {step}: interleaved {'/'.join(names)}"
        print(f"{label} ...", flush=True)
        start = time.perf_counter()
        timed = _spawn({**spec, "kind": "time", "step": step, "names": names}, timeout)
        result["time"][step] = timed
        if "skipped" in timed:
            print(f"{label}: skipped: {timed['skipped']}", flush=True)
            return {"skipped": timed["skipped"]}
        status = timed.get("error") or ", ".join(
            f"{n} {s * 1e3:.0f} ms ({timed['paths'][n]})" for n, s in timed["median_s"].items())
        print(f"{label}: {status} [{time.perf_counter() - start:.0f} s]", flush=True)
        for name in names:
            label = f"[{backend}] {part} {step}: memory {name}"
            start = time.perf_counter()
            mem = _spawn({**spec, "kind": "memory", "step": step, "names": [name]}, timeout)
            result["memory"].setdefault(step, {})[name] = mem
            status = mem.get("error") or (
                f"peak {mem['rss_peak_gib']:.2f} GiB (base {mem['rss_base_gib']:.2f}, "
                f"{mem['delta_gib']:+.2f}), alone {mem['alone_s'] * 1e3:.0f} ms, path {mem['path']}")
            print(f"{label}: {status} [{time.perf_counter() - start:.0f} s]", flush=True)
    return result


def _get(result, step, name, key, fmt, scale=1.0):
    try:
        if key == "median_s":
            value = result["time"][step]["median_s"][name]
        else:
            value = result["memory"][step][name][key]
    except (KeyError, TypeError):
        return "n/a"
    return fmt.format(value * scale)


def _ratio(result, step, a, b):
    try:
        medians = result["time"][step]["median_s"]
        return medians[a] / medians[b]
    except (KeyError, TypeError, ZeroDivisionError):
        return None


def _path(result, step, name):
    return result.get("time", {}).get(step, {}).get("paths", {}).get(name, "n/a")


def _part_results(results, part):
    """`(backend, result)` of every backend that ran `part`."""
    return [(backend, parts[part]) for backend, parts in results.items() if parts.get(part)]


def window_table(results, spec):
    lines = [f"B=1, T=S={spec['length']}, H={spec['heads']}, d={HEAD_DIM}, causal, W={spec['window']}",
             "",
             "| backend | step | path | window ms | full ms | window / full | "
             f"<= {WINDOW_TARGET} | window peak GiB | full peak GiB | baseline GiB | "
             f"< {MEMORY_TARGET_GIB} GiB |",
             "|---|---|---|---:|---:|---:|---|---:|---:|---:|---|"]
    for backend, r in _part_results(results, "window"):
        for step in ("forward", "train"):
            ratio = _ratio(r, step, "window", "full")
            peaks = [r.get("memory", {}).get(step, {}).get(n, {}).get("rss_peak_gib")
                     for n in ("window", "full")]
            mem_ok = "n/a" if None in peaks else ("yes" if max(peaks) < MEMORY_TARGET_GIB else "**no**")
            ok = "n/a" if ratio is None else ("yes" if ratio <= WINDOW_TARGET else "**no**")
            paths = {_path(r, step, "window"), _path(r, step, "full")}
            lines.append(
                f"| {backend} | {step} | {'/'.join(sorted(paths))} | "
                f"{_get(r, step, 'window', 'median_s', '{:.0f}', 1e3)} | "
                f"{_get(r, step, 'full', 'median_s', '{:.0f}', 1e3)} | "
                f"{_fmt_ratio(ratio)} | {ok} | "
                f"{_get(r, step, 'window', 'rss_peak_gib', '{:.2f}')} | "
                f"{_get(r, step, 'full', 'rss_peak_gib', '{:.2f}')} | "
                f"{_get(r, step, 'full', 'rss_base_gib', '{:.2f}')} | {mem_ok} |")
            if "full-auto" in r.get("time", {}).get(step, {}).get("median_s", {}):
                lines.append(
                    f"| {backend} | {step} | full, auto: {_path(r, step, 'full-auto')} | | "
                    f"{_get(r, step, 'full-auto', 'median_s', '{:.0f}', 1e3)} | "
                    f"{_fmt_ratio(_ratio(r, step, 'window', 'full-auto'))} | | | "
                    f"{_get(r, step, 'full-auto', 'rss_peak_gib', '{:.2f}')} | | |")
    return "\n".join(lines)


def _fmt_ratio(ratio):
    return "n/a" if ratio is None else f"{ratio:.2f}"


def gqa_table(results, spec):
    lines = [f"B=1, T=S={spec['gqa_length']}, H={GQA_HEADS}, d={HEAD_DIM}, causal; "
             f"GQA: H_kv={GQA_KV_HEADS}, MHA: H_kv={GQA_HEADS}",
             "",
             "| backend | implementation | step | path GQA / MHA | GQA ms | MHA ms | GQA / MHA | "
             "GQA peak GiB | MHA peak GiB | GQA delta GiB | MHA delta GiB |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for backend, r in _part_results(results, "gqa"):
        for impl in ("auto", "blockwise"):
            g, m = f"gqa-{impl}", f"mha-{impl}"
            for step in ("forward", "train"):
                lines.append(
                    f"| {backend} | {impl} | {step} | {_path(r, step, g)} / {_path(r, step, m)} | "
                    f"{_get(r, step, g, 'median_s', '{:.0f}', 1e3)} | "
                    f"{_get(r, step, m, 'median_s', '{:.0f}', 1e3)} | "
                    f"{_fmt_ratio(_ratio(r, step, g, m))} | "
                    f"{_get(r, step, g, 'rss_peak_gib', '{:.2f}')} | "
                    f"{_get(r, step, m, 'rss_peak_gib', '{:.2f}')} | "
                    f"{_get(r, step, g, 'delta_gib', '{:+.3f}')} | "
                    f"{_get(r, step, m, 'delta_gib', '{:+.3f}')} |")
    return "\n".join(lines)


def layer_table(results, spec):
    a, b = f"kv_heads={GQA_KV_HEADS}", f"kv_heads={GQA_HEADS}"
    lines = [f"`MultiHeadAttention(num_heads={GQA_HEADS}, key_dim={LAYER_DIM // GQA_HEADS}, "
             f"num_key_value_heads=...)`, B=1, T={spec['gqa_length']}, D={LAYER_DIM}, causal",
             "",
             f"| backend | step | params H_kv={GQA_KV_HEADS} | params H_kv={GQA_HEADS} | "
             f"H_kv={GQA_KV_HEADS} ms | H_kv={GQA_HEADS} ms | ratio | peak GiB H_kv={GQA_KV_HEADS} | "
             f"peak GiB H_kv={GQA_HEADS} |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for backend, r in _part_results(results, "layer"):
        if "skipped" in r:
            lines.append(f"| {backend} | n/a: {r['skipped']} | | | | | | | |")
            continue
        for step in ("forward", "train"):
            lines.append(
                f"| {backend} | {step} | {_get(r, step, a, 'params', '{:,.0f}')} | "
                f"{_get(r, step, b, 'params', '{:,.0f}')} | "
                f"{_get(r, step, a, 'median_s', '{:.0f}', 1e3)} | "
                f"{_get(r, step, b, 'median_s', '{:.0f}', 1e3)} | "
                f"{_fmt_ratio(_ratio(r, step, a, b))} | "
                f"{_get(r, step, a, 'rss_peak_gib', '{:.2f}')} | "
                f"{_get(r, step, b, 'rss_peak_gib', '{:.2f}')} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_options(parser, backend="list",
                       quick=f"smoke sizes: T={QUICK['length']}, W={QUICK['window']}, GQA "
                             f"T={QUICK['gqa_length']}, block size {QUICK['block_size']}, 2 repeats",
                       rounds=("--repeats", None, "timed calls per contender (3)"),
                       timeout=("--timeout-s", 600, "per process"))
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma list of {','.join(PARTS)}")
    parser.add_argument("--length", type=int, default=None, help="window part: T = S (default 16384)")
    parser.add_argument("--window", type=int, default=None, help="window part: W (default 1024)")
    parser.add_argument("--gqa-length", type=int, default=None, help="gqa/layer parts: T = S (4096)")
    parser.add_argument("--block-size", type=int, default=None,
                        help="keras_attn.config.set_attention_block_size (default: the package's)")
    parser.add_argument("--full-auto", action=argparse.BooleanOptionalAction, default=None,
                        help="window part: also time full causal on implementation='auto' (default: "
                             "on PyTorch only, where auto takes SDPA; elsewhere it is blockwise)")
    parser.add_argument("--omp-active", action="store_true",
                        help="PyTorch: keep OpenMP's default wait policy (default: "
                             "OMP_WAIT_POLICY=PASSIVE in the workers)")
    parser.add_argument("--tf-xla", action="store_true",
                        help="tf.function(jit_compile=True) instead of plain tf.function")
    args = parser.parse_args(argv)
    if args.worker:
        return common.worker_main(worker, args.worker)

    spec = dict(QUICK if args.quick else DEFAULTS)
    for key in ("length", "window", "gqa_length", "block_size"):
        if getattr(args, key) is not None:
            spec[key] = getattr(args, key)
    if args.rounds is not None:
        spec["repeats"] = args.rounds
    spec["full_auto"], spec["tf_xla"] = args.full_auto, args.tf_xla
    spec["omp_passive"] = not args.omp_active
    parts = [p for p in args.parts.split(",") if p]
    print(f"# {common.machine()}; {json.dumps(spec)}", flush=True)
    results = {}
    for backend in common.backends(args):
        start = time.perf_counter()
        results[backend] = {part: run_part(backend, part, spec, args.timeout) for part in parts}
        print(f"[{backend}] done in {time.perf_counter() - start:.0f} s, "
              f"load {os.getloadavg()[0]:.1f}", flush=True)
    print()
    for part, table in (("window", window_table), ("gqa", gqa_table), ("layer", layer_table)):
        if part in parts:
            print(table(results, spec))
            print()
    if args.json:
        common.write_json(args.json, {"spec": spec, "results": results})


if __name__ == "__main__":
    main()
