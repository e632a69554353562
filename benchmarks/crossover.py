"""Benchmark: where the blockwise path overtakes the fused kernel, per backend.

    python -m benchmarks.crossover                       # current backend, default grid
    python -m benchmarks.crossover --backend jax --quick  # a few small points
    python -m benchmarks.crossover --backend tensorflow --json tf.json --plot tf.png

The functional core `keras_attn.scaled_dot_product_attention` on float32
`(B, H, T, d)` tensors, at every point of a grid of series (batch B, heads
H, head width d, causal or not, with or without a padding mask, T = S or
T != S), each series swept over the query length T. At each point the
contenders are:

- `fused`: `implementation="fused"` (`keras.ops.dot_product_attention`);
- `block-N`: `implementation="blockwise"` with `attention_block_size` N
  (N in `--block-sizes`, clamped to the sequence; clamped duplicates run once);
- `explicit`: `implementation="explicit"` (materialised weights);
- `auto`: `implementation="auto"` under the current policy, with the path it
  took (`keras_attn._policy.observe_paths`).

Steps: `forward`, and `train` = forward + gradients of `mean(out**2)` with
respect to q, k and v. Execution is compiled as users train: `jax.jit` on
JAX, `tf.function(jit_compile=True)` on TensorFlow (`--tf-mode graph` for a
plain `tf.function`, as Keras's `fit` runs on a CPU, `--tf-mode eager` for
none; `--no-tf-xla` is `--tf-mode graph`), eager on PyTorch (`torch.no_grad()` for the forward, with
`OMP_WAIT_POLICY=PASSIVE`, see benchmarks/README.md). Each (point, step)
runs in a fresh process that builds every contender, calls each once
(trace / compile), then times them in turn (A B C ... A B C ...) for at
least `--repeats` rounds, and more (up to 60) while the rounds fit in
`--budget-s` seconds, so that machine noise hits them alike; medians are
reported.

The table gives each contender's median over the best of fused and
blockwise at that point ("/ best"), and `auto`'s ratio; the plot (with
matplotlib) shows best-blockwise / fused over T for every series.
"""

import argparse
import json
import os
import time

from benchmarks import _common as common

BLOCK_SIZES = (128, 256, 512)
AUTO_TARGET = 1.05  # auto / best of fused and blockwise, at every point

# name -> (B, H, d, causal, padding mask, lengths T, key length S or None for S = T)
SERIES = {
    "B8 H8 d32 causal": (8, 8, 32, True, False, (32, 64, 128, 256, 512, 1024), None),
    "B1 H4 d64 causal": (1, 4, 64, True, False, (128, 256, 512, 1024, 2048, 4096), None),
    "B1 H4 d64 full": (1, 4, 64, False, False, (128, 512, 1024, 2048), None),
    "B2 H4 d64 causal pad": (2, 4, 64, True, True, (256, 1024, 2048), None),
    "B1 H4 d128 causal": (1, 4, 128, True, False, (256, 1024, 2048), None),
    "B2 H8 d64 cross S=1024": (2, 8, 64, False, True, (1, 4, 16, 128, 512), 1024),
}
QUICK_SERIES = {
    "B8 H8 d32 causal": (8, 8, 32, True, False, (64, 256), None),
    "B1 H4 d64 causal": (1, 4, 64, True, False, (256, 1024), None),
    "B2 H8 d64 cross S=1024": (2, 8, 64, False, True, (16,), 1024),
}


def contenders(T, S, block_sizes):
    """Contender names at one point: fused, distinct clamped block sizes, explicit, auto."""
    blocks = sorted({min(n, max(T, S)) for n in block_sizes})
    return ["fused", *(f"block-{n}" for n in blocks), "explicit", "auto"]


# ----------------------------------------------------------------------------
# Worker side: one point and step, in its own process.


def _point_inputs(B, H, d, T, S, padded):
    import numpy as np

    g = np.random.default_rng(0)
    q = g.standard_normal((B, H, T, d)).astype("float32")
    k, v = (g.standard_normal((B, H, S, d)).astype("float32") for _ in range(2))
    mask = None
    if padded:  # the last quarter of the keys of every other example is padding
        mask = np.ones((B, 1, 1, S), bool)
        mask[::2, ..., S - S // 4:] = False
    return (q, k, v), mask


def time_worker(spec):
    import keras
    from keras import ops

    from benchmarks.modern import _core_fn
    from keras_attn import config
    from keras_attn._policy import observe_paths

    backend = keras.backend.backend()
    B, H, d, T, S = (spec[n] for n in ("B", "H", "d", "T", "S"))
    arrays, mask = _point_inputs(B, H, d, T, S, spec["padded"])
    mask = None if mask is None else ops.convert_to_tensor(mask)
    runs, paths = {}, {}
    for name in spec["names"]:
        impl = "blockwise" if name.startswith("block-") else name
        # `auto` (and fused/explicit) run with no block size set: the policy's own choice.
        block = int(name.split("-")[1]) if name.startswith("block-") else None
        kwargs = {"is_causal": spec["causal"], "implementation": impl, "mask": mask}
        fn = _core_fn(backend, spec["step"], kwargs, arrays, spec["tf_mode"])

        def run(fn=fn, block=block):
            # Read at trace time (and at every eager call on PyTorch).
            config.set_attention_block_size(block)
            return fn()

        with observe_paths() as taken:
            run()  # trace / compile
        paths[name] = "+".join(sorted(taken)) or "-"
        runs[name] = run
    config.set_attention_block_size(None)
    # Rounds: at least `repeats`, more (up to 60) while a round is short, so that
    # millisecond-scale points get enough samples for a stable median.
    round_s = common.timed(lambda: [run() for run in runs.values()])
    rounds = max(spec["repeats"], min(60, int(spec["budget_s"] / max(round_s, 1e-6))))
    times = common.interleaved(runs, rounds)
    return {"median_s": common.medians(times), "paths": paths, "rounds": rounds}


def worker(spec):
    if spec["backend"] == "torch":
        # Before torch is imported; see benchmarks/README.md (OpenMP on a loaded machine).
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return time_worker(spec)


# ----------------------------------------------------------------------------
# Driver side.


def _spawn(spec, timeout):
    return common.spawn("benchmarks.crossover", spec, timeout)


def best_of(medians):
    """(best fused-or-blockwise name, its time)."""
    candidates = {n: t for n, t in medians.items() if n == "fused" or n.startswith("block-")}
    name = min(candidates, key=candidates.get)
    return name, candidates[name]


def run_grid(args):
    series = QUICK_SERIES if args.quick else SERIES
    if args.series:
        series = {k: v for k, v in SERIES.items() if any(s in k for s in args.series.split(","))}
    points = []
    for label, (B, H, d, causal, padded, lengths, S) in series.items():
        for T in lengths:
            for step in args.steps.split(","):
                if step == "train" and T > args.train_max_t:
                    continue
                points.append({"series": label, "B": B, "H": H, "d": d, "T": T, "S": S or T,
                               "causal": causal, "padded": padded, "step": step})
    results = []
    start_all = time.perf_counter()
    for i, point in enumerate(points, 1):
        spec = {**point, "backend": args.backend, "repeats": args.rounds,
                "budget_s": args.budget_s,
                "tf_mode": "graph" if args.no_tf_xla else args.tf_mode,
                "names": contenders(point["T"], point["S"], args.block_sizes)}
        start = time.perf_counter()
        out = _spawn(spec, args.timeout)
        results.append({**point, **out})
        if "error" in out:
            status = out["error"]
        else:
            best, t_best = best_of(out["median_s"])
            status = (f"best {best} {t_best * 1e3:.1f} ms, fused x{out['median_s']['fused'] / t_best:.2f}, "
                      f"auto x{out['median_s']['auto'] / t_best:.2f} ({out['paths']['auto']})")
        print(f"[{args.backend} {i}/{len(points)}] {point['series']} T={point['T']} S={point['S']} "
              f"{point['step']}: {status} [{time.perf_counter() - start:.0f} s, "
              f"{time.perf_counter() - start_all:.0f} s total]", flush=True)
    return results


def auto_twin(r):
    """The contender that runs what `auto` ran at this point (same path and block), or None."""
    path = r["paths"]["auto"]
    if path in ("fused", "explicit"):
        return path
    if path != "blockwise":
        return None
    from keras_attn._policy import block_size_for

    block = min(block_size_for((r["B"], r["H"]), r["T"], r["S"], r["causal"]),
                max(r["T"], r["S"]))
    return f"block-{block}" if f"block-{block}" in r["median_s"] else None


def table(results, backend):
    lines = ["| series | T | S | step | fused ms | best blockwise | blockwise / fused | "
             "explicit / best | auto path | auto / best | its twin / best | "
             f"<= {AUTO_TARGET} |",
             "|---|---:|---:|---|---:|---|---:|---:|---|---:|---:|---|"]
    worst, worst_twin = 0.0, 0.0
    for r in results:
        head = f"| {r['series']} | {r['T']} | {r['S']} | {r['step']} |"
        if "error" in r:
            lines.append(f"{head} {r['error']} | | | | | | | |")
            continue
        m = r["median_s"]
        blocks = {n: t for n, t in m.items() if n.startswith("block-")}
        block = min(blocks, key=blocks.get)
        _, t_best = best_of(m)
        auto = m["auto"] / t_best
        twin = auto_twin(r)
        twin_ratio = m[twin] / t_best if twin else auto
        worst, worst_twin = max(worst, auto), max(worst_twin, twin_ratio)
        path = r["paths"]["auto"] + (f" ({twin})" if twin and twin.startswith("block") else "")
        lines.append(f"{head} {m['fused'] * 1e3:.1f} | {block} {blocks[block] * 1e3:.1f} ms | "
                     f"{blocks[block] / m['fused']:.2f} | {m['explicit'] / t_best:.2f} | "
                     f"{path} | {auto:.2f} | {twin_ratio:.2f} | "
                     f"{'yes' if min(auto, twin_ratio) <= AUTO_TARGET else '**no**'} |")
    lines.append("")
    lines.append(f"{backend}: worst auto / best = {worst:.2f}; worst twin / best = {worst_twin:.2f} "
                 f"(target <= {AUTO_TARGET}). 'its twin' is the contender that ran the same path "
                 "and block as auto, timed separately: the spread between the two is the noise.")
    return "\n".join(lines)


def plot(results, backend, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot written", flush=True)
        return
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, step in zip(axes, ("forward", "train")):
        for label in dict.fromkeys(r["series"] for r in results):
            pts = [(r["T"], min(t for n, t in r["median_s"].items() if n.startswith("block-"))
                    / r["median_s"]["fused"])
                   for r in results if r["series"] == label and r["step"] == step and "median_s" in r]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=label)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlabel("query length T")
        ax.set_title(f"{backend} {step}")
    axes[0].set_ylabel("best blockwise time / fused time")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot written to {path}", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_options(parser, backend="one", quick="a few small points, 3 repeats",
                       rounds=("--repeats", None, None),
                       timeout=("--timeout", 600, "seconds per point"))
    parser.add_argument("--series", help="comma-separated substrings of series names to run")
    parser.add_argument("--steps", default="forward,train")
    parser.add_argument("--block-sizes", default=",".join(map(str, BLOCK_SIZES)),
                        type=lambda s: tuple(int(n) for n in s.split(",")))
    parser.add_argument("--train-max-t", type=int, default=2048,
                        help="longest T timed for the train step (longer: forward only)")
    parser.add_argument("--budget-s", type=float, default=4.0,
                        help="timed seconds per point and step (more rounds while they are short)")
    parser.add_argument("--tf-mode", choices=("xla", "graph", "eager"), default="xla",
                        help="TensorFlow: tf.function with XLA, without, or eager")
    parser.add_argument("--no-tf-xla", action="store_true", help="the same as --tf-mode graph")
    parser.add_argument("--from-json", help="print the table (and --plot) of a saved run")
    parser.add_argument("--plot")
    args = parser.parse_args(argv)
    if args.worker:
        common.worker_main(worker, args.worker)
        return
    if args.from_json:
        os.environ["KERAS_BACKEND"] = "numpy"  # the policy's block rule only; no backend runs
        with open(args.from_json) as f:
            saved = json.load(f)
        print(table(saved["results"], saved["backend"]))
        if args.plot:
            plot(saved["results"], saved["backend"], args.plot)
        return
    if args.rounds is None:
        args.rounds = 3 if args.quick else 7
    results = run_grid(args)
    print()
    print(table(results, args.backend))
    if args.json:
        common.write_json(args.json, {"backend": args.backend, "results": results})
    if args.plot:
        plot(results, args.backend, args.plot)


if __name__ == "__main__":
    main()
