"""Benchmark: decoding at scale, against transformers and keras-hub (issue 37).

    python -m benchmarks.scale                          # every backend, every point
    python -m benchmarks.scale --backend torch --points batch,long
    python -m benchmarks.scale --quick                  # small sizes, a smoke run
    python -m benchmarks.scale --json scale.json

What a decoding user waits for: the tokens per second of N greedy steps after a
cache that already holds S positions. Points (`--points`, default all):

- **batch**: `benchmarks.models`' Llama (vocabulary 4096, D=512, 4 layers, 8 query
  over 2 key/value heads, SwiGLU 1408, float32), S=512, B = 1, 8 and 32;
- **long**: the same model, B=1, S = 8192 and 32768;
- **large**: a 0.50B-parameter Llama (vocabulary 65536, untied, D=1024, 24 layers,
  16 query over 4 key/value heads, SwiGLU 4096), B=1, S=512, in float32 and in
  bfloat16, beside the memory-bandwidth bound: the bytes one step reads (every weight
  but the input embedding table, and the S cached keys and values of every layer)
  divided by this machine's read bandwidth, measured in each worker (a NumPy and a
  backend reduction over a 1 GiB array, the fastest of 7 each; the final table divides
  by the best that any worker of the run measured); and beside the
  contenders, timed in the same rounds, "matmuls alone": the step's matrix products
  with nothing else (every weight matrix, random, chained), compiled as the steps are,
  the fastest the backend's matmul reads those bytes.

The driver builds each model once with transformers (seeded random weights, std 0.05,
nothing downloaded) and saves it as safetensors; every contender loads that folder:
keras_attn through `causal_lm_from_pretrained`, keras-hub 0.32 through
`LlamaBackbone.from_preset` in a `LlamaCausalLM`, and (PyTorch) transformers'
`LlamaForCausalLM` with SDPA attention and a `StaticCache`. The S cached positions are
the same seeded random keys and values in every contender's layout (keras_attn's
caches as its `generate` makes them: a `KVCache` `(B, S_max, H_kv, d)` per block, on
PyTorch its `OwnedKVCache`, stored `(B, H_kv, S_max, d)` and written in place;
keras-hub's `(B, L, 2, S_max, H_kv, d)`, transformers' `(B, H_kv, S_max, d)` written
through `StaticCache.update`), S_max = S + N, so no prefill is timed: a 32k-token
prefill would cost minutes here and materialise keras-hub's `32k x 32k` scores.

**Equivalence first:** the driver runs transformers' first step from that cache
(position S); each contender's first-step logits must be within 1e-3 of it
(max |diff| / max |logit|; 0.15 in bfloat16, against the float32 reference: see
`TOLERANCE`), else it is reported and not timed.

Timing: N greedy steps from the filled cache, each library's way of running its own
decoding loop. JAX: the N steps in one `jax.jit` (`keras.ops.fori_loop`, the weights
as state through `keras.StatelessScope`), as both keras_attn's and keras-hub's
`generate` compile their loops; TensorFlow: the same loop in a `tf.function`, with XLA
for keras_attn (its `generate`'s default) and without for keras-hub (its default on a
CPU); PyTorch: a Python loop under `torch.no_grad()` (keras_attn: the traced decoding
step its `generate` replays; keras-hub: its `call_with_cache`, eagerly; transformers:
the model's forward with the static cache, as its `generate` calls it). Contenders of
a point are timed in turn, round after round; medians over rounds, the spread
(min-max) printed. Ratios are keras_attn / the other.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

from benchmarks import _common as common

SMALL = {"vocab": 4096, "dim": 512, "layers": 4, "heads": 8, "kv_heads": 2, "ffn": 1408}
LARGE = {"vocab": 65536, "dim": 1024, "layers": 24, "heads": 16, "kv_heads": 4, "ffn": 4096}
QUICK_SMALL = {"vocab": 512, "dim": 128, "layers": 2, "heads": 4, "kv_heads": 2, "ffn": 256}
QUICK_LARGE = {"vocab": 1024, "dim": 256, "layers": 4, "heads": 4, "kv_heads": 2, "ffn": 512}
# (point name, model, batch B, cached positions S, dtype)
POINTS = {
    "batch": [("small", 1, 512, "float32"), ("small", 8, 512, "float32"),
              ("small", 32, 512, "float32")],
    "long": [("small", 1, 8192, "float32"), ("small", 1, 32768, "float32")],
    "large": [("large", 1, 512, "float32"), ("large", 1, 512, "bfloat16")],
}
QUICK_POINTS = {
    "batch": [("small", 1, 64, "float32"), ("small", 8, 64, "float32")],
    "long": [("small", 1, 1024, "float32")],
    "large": [("large", 1, 64, "float32"), ("large", 1, 64, "bfloat16")],
}
# max |logits - transformers' float32 logits| / max |theirs| that a contender must meet to
# be timed. Float32: 1e-3, not benchmarks.models' 1e-4: the softmax over 32k cached
# positions sums in another order in each library, and keras-hub's first step on
# TensorFlow measured 1.1e-4 there (keras_attn 5.5e-5; 5e-6 at 512 positions); a wrong
# layout, position or mask measured O(1). bfloat16 against the same float32 reference:
# 0.15; the 0.50B model's 24 layers in bfloat16 measured 6.9e-2 to 8.2e-2 for every
# contender, transformers' own included.
TOLERANCE = {"float32": 1e-3, "bfloat16": 0.15}
BANDWIDTH_BYTES = 2**30


def point_name(model, batch, length, dtype):
    return f"{model} B={batch} S={length} {dtype}"


# ----------------------------------------------------------------------------
# The checkpoints and the reference (driver side).


def make_checkpoint(sizes, folder):
    """A seeded random transformers Llama of `sizes`, saved to `folder` (safetensors)."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=sizes["vocab"], hidden_size=sizes["dim"], intermediate_size=sizes["ffn"],
        num_hidden_layers=sizes["layers"], num_attention_heads=sizes["heads"],
        num_key_value_heads=sizes["kv_heads"], max_position_embeddings=65536,
        tie_word_embeddings=False, attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # far from identity (std 0.02 is too gentle for a check)
        for parameter in model.parameters():
            if parameter.ndim >= 2:
                parameter.normal_(0.0, 0.05)
    model.save_pretrained(folder, safe_serialization=True)
    return model


def filled_cache(sizes, batch, length, seed):
    """The S cached positions of every layer: keys and values `(L, B, S, H_kv, d)` float32,
    and the first token `(B, 1)`; the same in every process (seeded)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    head_dim = sizes["dim"] // sizes["heads"]
    shape = (sizes["layers"], batch, length, sizes["kv_heads"], head_dim)
    keys = rng.standard_normal(shape, dtype=np.float32)
    values = rng.standard_normal(shape, dtype=np.float32)
    token = rng.integers(1, sizes["vocab"], (batch, 1)).astype("int32")
    return keys, values, token


def _hf_static(model, keys, values, max_length, dtype):
    """transformers' `StaticCache` of `max_length` slots holding `keys`/`values`."""
    import torch
    import transformers

    cache = transformers.StaticCache(config=model.config, max_cache_len=max_length)
    for i in range(keys.shape[0]):  # (B, S, H, d) -> (B, H, S, d); lazily allocates
        cache.update(torch.as_tensor(keys[i]).transpose(1, 2).to(dtype),
                     torch.as_tensor(values[i]).transpose(1, 2).to(dtype), i)
    return cache


def _hf_step(model, cache, token, position):
    """One step of transformers' model at `position` (the static cache rewound there)."""
    import torch

    for layer in cache.layers:  # StaticLayer writes at its own count, not cache_position
        layer.cumulative_length.fill_(position)
    with torch.no_grad():
        return model(input_ids=token, past_key_values=cache, use_cache=True,
                     cache_position=torch.tensor([position])).logits[:, -1]


# ----------------------------------------------------------------------------
# Contenders (worker side): decode(n) -> (B, n) tokens, and first() -> (B, V) logits.


def _stateless(model, fn, jit_compile):
    """`fn(*args)` compiled as the backend compiles a generate loop, reading `model`'s
    weights: `jax.jit` with the weights as state, `tf.function` (XLA if `jit_compile`)."""
    import keras

    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        variables = list(model.variables)

        def pure(values, *args):
            with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                return fn(*args)

        compiled = jax.jit(pure)
        return lambda *args: compiled([v.value for v in variables], *args)
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, jit_compile=jit_compile)
    return fn


def _loop(step, token, caches, start, n):
    """n greedy steps from `caches` at `start`: the (B, n) tokens (keras.ops; in a compiled
    function a `fori_loop`, as `generate`'s loop)."""
    from keras import ops

    batch = token.shape[0]

    def body(i, carry):
        token, caches, tokens = carry
        logits, caches = step(token, caches, start + i)
        token = ops.cast(ops.argmax(logits[:, -1], axis=-1), "int32")[:, None]
        tokens = ops.slice_update(tokens, [0, i], token)
        return token, caches, tokens

    tokens = ops.zeros((batch, n), "int32")
    return ops.fori_loop(0, n, body, (token, caches, tokens))[2]


def _torch_loop(step, token, caches, start, n):
    import torch

    tokens = []
    with torch.no_grad():
        for i in range(n):
            logits, caches = step(token, caches, torch.tensor(start + i, dtype=torch.int32))
            token = torch.argmax(logits[:, -1], dim=-1).to(torch.int32)[:, None]
            tokens.append(token)
    return torch.cat(tokens, dim=1)


def _keras_contender(model, step, caches, token, start, jit_compile):
    import keras
    import numpy as np
    from keras import ops

    token = ops.convert_to_tensor(token)
    first = _stateless(model, lambda t, c: step(t, c, ops.convert_to_tensor(start, "int32"))[0],
                       jit_compile)
    if keras.backend.backend() == "torch":
        import torch

        def decode(n):
            return np.asarray(_torch_loop(step, token, caches, start, n))

        def logits():
            with torch.no_grad():
                return first(token, caches)[:, -1]
    else:
        compiled = {}

        def decode(n):
            if n not in compiled:
                compiled[n] = _stateless(model, lambda t, c: _loop(step, t, c, start, n),
                                         jit_compile)
            return np.asarray(compiled[n](token, caches))

        def logits():
            return first(token, caches)[:, -1]
    return {"first": lambda: np.asarray(ops.convert_to_numpy(ops.cast(logits(), "float32"))),
            "decode": decode}


def _ours(folder, sizes, keys, values, token, max_length, dtype):
    import keras
    from keras import ops

    from keras_attn.convert import causal_lm_from_pretrained
    from keras_attn.models._generate_loop import _empty_caches, traced_step_of

    lm = causal_lm_from_pretrained(folder, dtype=dtype)
    # The caches `generate` makes (on PyTorch heads-first, written in place), the S
    # positions written at index 0; zeros after them.
    caches = [cache.write(ops.cast(k, dtype), ops.cast(v, dtype), 0) for cache, k, v in
              zip(_empty_caches(lm, keys.shape[1], max_length), keys, values)]
    length = keys.shape[2]
    step = lm.next_token_logits
    if keras.backend.backend() == "torch":
        step = traced_step_of(lm)  # what generate replays (jit_compile="auto")
    return _keras_contender(lm, step, caches, token, length, jit_compile=True)


def _hub(folder, sizes, keys, values, token, max_length, dtype):
    import keras_hub
    import numpy as np
    from keras import ops

    backbone = keras_hub.models.LlamaBackbone.from_preset(folder, dtype=dtype)
    lm = keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)
    length = keys.shape[2]
    both = np.stack([keys, values], axis=2)  # (L, B, 2, S, H, d)
    both = np.pad(both, [(0, 0)] * 3 + [(0, max_length - length), (0, 0), (0, 0)])
    cache = ops.cast(ops.convert_to_tensor(np.moveaxis(both, 0, 1)), dtype)

    def step(token_ids, cache, index):
        logits, _, cache = lm.call_with_cache(token_ids, cache, index)
        return logits, cache

    return _keras_contender(lm, step, cache, token, length, jit_compile=False)


def _hf(folder, sizes, keys, values, token, max_length, dtype):
    import torch
    import transformers

    torch_dtype = getattr(torch, dtype)
    model = transformers.LlamaForCausalLM.from_pretrained(
        folder, attn_implementation="sdpa", dtype=torch_dtype).eval()
    cache = _hf_static(model, keys, values, max_length, torch_dtype)
    start = keys.shape[2]
    token = torch.as_tensor(token, dtype=torch.long)

    def decode(n):
        out, t = [], token
        for i in range(n):
            t = torch.argmax(_hf_step(model, cache, t, start + i), dim=-1)[:, None]
            out.append(t)
        return torch.cat(out, dim=1).numpy()

    return {"first": lambda: _hf_step(model, cache, token, start).float().numpy(),
            "decode": decode}


def _matvec_floor(sizes, batch, dtype):
    """Not a model: the matrix products of one decoding step alone (every weight matrix the
    model reads, at its shape and dtype, random, chained so that none can be skipped),
    compiled and looped as the contenders' steps are. The fastest this backend's matmul
    reads those bytes; a contender near it is bound by the matmul kernel, not by its own
    code."""
    import keras
    import numpy as np
    from keras import ops

    rng = np.random.default_rng(5)
    d, f = sizes["dim"], sizes["ffn"]
    kv = sizes["kv_heads"] * d // sizes["heads"]

    def w(*shape):
        return ops.cast(ops.convert_to_tensor(
            0.02 * rng.standard_normal(shape, dtype=np.float32)), dtype)

    weights = [[w(d, d), w(d, kv), w(d, kv), w(d, d), w(d, f), w(d, f), w(f, d)]
               for _ in range(sizes["layers"])] + [[w(d, sizes["vocab"])]]

    def step(weights, x):
        for q, k, v, o, gate, up, down in weights[:-1]:
            side = ops.mean(ops.matmul(x, k) + ops.matmul(x, v), axis=-1, keepdims=True)
            x = (x + ops.matmul(ops.matmul(x, q), o) + side
                 + ops.matmul(ops.matmul(x, gate) * ops.matmul(x, up), down))
        return x + 1e-3 * ops.mean(ops.matmul(x, weights[-1][0]), axis=-1, keepdims=True)

    x = ops.cast(ops.ones((batch, d)), dtype)
    backend = keras.backend.backend()
    if backend == "torch":
        import torch

        def decode(n):
            with torch.no_grad():
                y = x
                for _ in range(n):
                    y = step(weights, y)
                return ops.convert_to_numpy(ops.cast(y, "float32"))
        return {"decode": decode}
    compiled = {}

    def decode(n):
        if n not in compiled:
            def loop(weights, x):
                return ops.fori_loop(0, n, lambda i, y: step(weights, y), x)
            if backend == "jax":
                import jax

                compiled[n] = jax.jit(loop)
            else:
                import tensorflow as tf

                compiled[n] = tf.function(loop, jit_compile=True)
        return ops.convert_to_numpy(ops.cast(compiled[n](weights, x), "float32"))
    return {"decode": decode}


# ----------------------------------------------------------------------------
# The worker: every point of one backend.


def read_bandwidth():
    """Bytes per second of a full read: NumPy's and the backend's sum over a 1 GiB float32
    array, each the fastest of 7 (a bound is the best rate seen: medians of 5 moved from
    39.7 to 15.5 GB/s between two runs of TensorFlow's sum, under the 26.8 GB/s that the
    0.50B model's matrix products alone then read); both figures."""
    import numpy as np
    from keras import ops

    array = np.ones(BANDWIDTH_BYTES // 4, "float32")
    numpy_s = min(common.timed(lambda: array.sum()) for _ in range(7))
    tensor = ops.convert_to_tensor(array)
    ops.convert_to_numpy(ops.sum(tensor))
    backend_s = min(common.timed(lambda: ops.convert_to_numpy(ops.sum(tensor)))
                    for _ in range(7))
    return {"numpy_gbs": BANDWIDTH_BYTES / numpy_s / 1e9,
            "backend_gbs": BANDWIDTH_BYTES / backend_s / 1e9}


def bytes_per_step(sizes, batch, length, dtype):
    """What one decoding step must read: every weight but the input embedding table (of
    which it reads B rows, left out), and every layer's S cached keys and values."""
    d, f, layers = sizes["dim"], sizes["ffn"], sizes["layers"]
    kv = sizes["kv_heads"] * d // sizes["heads"]
    per_layer = 2 * d * d + 2 * d * kv + 3 * d * f + 2 * d
    weights = layers * per_layer + d + sizes["vocab"] * d
    cache = layers * 2 * batch * length * kv
    return (weights + cache) * (2 if dtype == "bfloat16" else 4)


def worker(spec):
    import gc

    import keras
    import numpy as np

    from keras_attn import _device

    backend = spec["backend"]
    builders = {"keras_attn": _ours}
    notes = {}
    try:
        import keras_hub  # noqa: F401

        builders["keras_hub"] = _hub
    except ImportError as error:
        notes["keras_hub"] = f"not installed ({error})"
    if backend == "torch":
        builders["hf_static"] = _hf
    result = {"info": _device.describe(), "notes": notes, "points": {}}
    if any(p[0] == "large" for p in spec["points"]):
        result["bandwidth"] = read_bandwidth()
    for model, batch, length, dtype in spec["points"]:
        name = point_name(model, batch, length, dtype)
        sizes = spec["sizes"][model]
        if backend == "torch":  # as benchmarks.models: one thread for the small model
            import torch

            torch.set_num_threads(1 if model == "small" else os.cpu_count())
        keys, values, token = filled_cache(sizes, batch, length, seed=length + batch)
        reference = np.load(os.path.join(spec["folder"], f"{name}.npy"))
        max_length = length + spec["new"]
        point = {"checks": {}, "ms": {}, "spread": {}}
        runs = {}
        for contender, build in builders.items():
            print(f"[scale] {backend} {name}: {contender}", file=sys.stderr, flush=True)
            c = build(os.path.join(spec["folder"], model), sizes, keys, values, token,
                      max_length, dtype)
            error = float(np.max(np.abs(c["first"]() - reference)) / np.max(np.abs(reference)))
            point["checks"][contender] = error
            if error > TOLERANCE[dtype]:
                continue
            c["decode"](spec["new"])  # the warm-up: compiles, traces
            runs[contender] = lambda c=c: c["decode"](spec["new"])
        if model == "large":  # the matmuls alone, in the same rounds (not checked: no model)
            c = _matvec_floor(sizes, batch, dtype)
            c["decode"](spec["new"])
            runs["matmuls alone"] = lambda c=c: c["decode"](spec["new"])
        times = common.interleaved(runs, spec["rounds"])
        for contender, seconds in times.items():
            per_token = [s / spec["new"] * 1e3 for s in seconds]
            point["ms"][contender] = statistics.median(per_token)
            point["spread"][contender] = [min(per_token), max(per_token)]
        point["bytes"] = bytes_per_step(sizes, batch, length, dtype)
        result["points"][name] = point
        del runs, c
        keras.backend.clear_session()
        gc.collect()
    result["peak_rss_gib"] = common.peak_rss_gib()
    return result


# ----------------------------------------------------------------------------
# Driver side.


def references(spec, points, folder):
    """Save each model's checkpoint and each point's reference first-step logits."""
    import numpy as np
    import torch

    for model in sorted({p[0] for p in points}):
        print(f"[scale] building the {model} transformers checkpoint ...", file=sys.stderr,
              flush=True)
        hf = make_checkpoint(spec["sizes"][model], os.path.join(folder, model))
        for m, batch, length, dtype in points:
            if m != model:
                continue
            keys, values, token = filled_cache(spec["sizes"][model], batch, length,
                                               seed=length + batch)
            cache = _hf_static(hf, keys, values, length + 1, torch.float32)
            logits = _hf_step(hf, cache, torch.as_tensor(token, dtype=torch.long), length)
            np.save(os.path.join(folder, f"{point_name(model, batch, length, dtype)}.npy"),
                    logits.numpy())
        del hf


def table(results, spec):
    lines = [f"N={spec['new']} greedy steps from a filled cache; ms per step (per batch of "
             f"B tokens), medians of {spec['rounds']} interleaved rounds (min-max); "
             "keras_attn / it", "",
             "| backend | point | contender | logits rel. error | ms / step | tokens/s "
             "| keras_attn / it | bound ms (x) |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    # The bound: the best read bandwidth any worker of these results measured (the same
    # machine; each backend's own sum reaches another rate).
    rates = [max(r["bandwidth"].values()) for r in results.values() if r.get("bandwidth")]
    best = max(rates) * 1e9 if rates else None
    for backend, r in results.items():
        if "error" in r:
            lines.append(f"| {backend} | error: {r['error']} | | | | | | |")
            continue
        bandwidth = r.get("bandwidth")
        for name, point in r["points"].items():
            ours = point["ms"].get("keras_attn")
            batch = int(name.split("B=")[1].split()[0])
            checks = dict(point["checks"], **{c: float("nan") for c in point["ms"]
                                              if c not in point["checks"]})
            for contender, error in checks.items():
                ms = point["ms"].get(contender)
                if ms is None:
                    lines.append(f"| {backend} | {name} | {contender} | {error:.1e} | "
                                 "not equivalent, not timed | | | |")
                    continue
                low, high = point["spread"][contender]
                ratio = f"{ours / ms:.2f}" if ours and contender != "keras_attn" else ""
                bound = ""
                if best and name.startswith("large"):
                    bound_ms = point["bytes"] / best * 1e3
                    bound = f"{bound_ms:.1f} ({ms / bound_ms:.2f}x)"
                error = f"{error:.1e}" if error == error else "(no model)"
                lines.append(f"| {backend} | {name} | {contender} | {error} | {ms:.2f} "
                             f"({low:.2f}-{high:.2f}) | {batch / ms * 1e3:.0f} | {ratio} | "
                             f"{bound} |")
        if bandwidth:
            lines.append(f"| {backend} | read bandwidth | numpy {bandwidth['numpy_gbs']:.1f} "
                         f"GB/s, {backend} {bandwidth['backend_gbs']:.1f} GB/s | | | | | |")
        lines.append(f"| {backend} | (worker peak RSS {r['peak_rss_gib']:.2f} GiB) | | | | | | |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_options(parser, backend="list", quick="small smoke sizes",
                       rounds=("--rounds", 5, "timing rounds (default 5)"),
                       timeout=("--timeout", 3600, "seconds per backend"),
                       json_help="write the results here")
    parser.add_argument("--points", default=",".join(POINTS),
                        help=f"comma list of {','.join(POINTS)} (default: all)")
    parser.add_argument("--new", type=int, default=None,
                        help="greedy steps timed per round (default 32; --quick 8)")
    args = parser.parse_args(argv)
    if args.worker:
        return common.worker_main(worker, args.worker)
    table_of = QUICK_POINTS if args.quick else POINTS
    unknown = set(args.points.split(",")) - set(table_of)
    if unknown:
        parser.error(f"--points: unknown {sorted(unknown)}; choose from {sorted(table_of)}")
    points = [p for name in args.points.split(",") for p in table_of[name]]
    spec = {"sizes": {"small": QUICK_SMALL if args.quick else SMALL,
                      "large": QUICK_LARGE if args.quick else LARGE},
            "new": args.new or (8 if args.quick else 32), "rounds": args.rounds,
            "points": points}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        references(spec, points, folder)
        common.run_backends("benchmarks.scale", spec, args, table, extra={"folder": folder},
                            started=start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
