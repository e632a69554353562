"""What the benchmarks share: worker processes, peak RSS, timing and the common options.

A benchmark's driver runs each configuration (or backend) in a fresh process,
`python -m benchmarks.NAME --worker SPEC` with SPEC as JSON, through `spawn`; the
worker side (`worker_main`) prints its result as one JSON object, the last line of
its stdout that starts with `{`.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

BACKENDS = ("tensorflow", "jax", "torch")
ERROR_TAIL_CHARS = 300


# ----------------------------------------------------------------------------
# Worker processes.


def spawn(module, spec, timeout, *, backend=None, tree=None):
    """`python -m module --worker JSON(spec)` in a fresh process: its result, or `{"error": ...}`.

    The worker's environment is this one's with KERAS_BACKEND set to `backend` (default
    `spec["backend"]`; neither: the environment's) and TF_CPP_MIN_LOG_LEVEL=2. `tree`, a
    checkout's root, runs that checkout's code instead of this one's (cwd and
    PYTHONPATH). The result is the last line of stdout that starts with `{` and parses;
    without one, the error is the exit status and the last line of stderr (or stdout).
    """
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    backend = backend or spec.get("backend")
    if backend:
        env["KERAS_BACKEND"] = backend
    if tree:
        env["PYTHONPATH"] = os.path.abspath(tree)
    command = [sys.executable, "-m", module, "--worker", json.dumps(spec)]
    try:
        done = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout}s"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
    return {"error": f"exit {done.returncode}: {tail[0][:ERROR_TAIL_CHARS]}"}


def import_tree(root):
    """Import `keras_attn` from checkout `root`, forgetting any other one imported before.

    For before/after figures in one process (`--baseline`): objects built from the
    first checkout keep working after the second is imported, since their functions
    hold their own module globals.
    """
    import importlib

    for name in [n for n in sys.modules if n == "keras_attn" or n.startswith("keras_attn.")]:
        del sys.modules[name]
    sys.path.insert(0, os.path.abspath(root))
    try:
        return importlib.import_module("keras_attn")
    finally:
        sys.path.pop(0)


def worker_main(worker, spec_json):
    """The worker side of `spawn`: print `worker(spec)`'s result as one JSON line; 0."""
    print(json.dumps(worker(json.loads(spec_json))), flush=True)
    return 0


# ----------------------------------------------------------------------------
# Memory.


def save_with_reference(model, spec, folder):
    """Save a transformers `model` to `folder` as safetensors, with its reference outputs
    (`reference.npz`): the logits of a seeded random prompt of `spec["prompt"]` tokens and
    its `spec["new"]` greedy tokens, which every contender is checked against."""
    import numpy as np
    import torch

    model.save_pretrained(folder, safe_serialization=True)
    prompt = np.random.default_rng(0).integers(1, spec["vocab"], (1, spec["prompt"]))
    with torch.no_grad():
        ids = torch.as_tensor(prompt)
        logits = model(ids).logits.numpy()
        tokens = model.generate(ids, max_new_tokens=spec["new"], min_new_tokens=spec["new"],
                                do_sample=False, pad_token_id=0).numpy()
    np.savez(os.path.join(folder, "reference.npz"), prompt=prompt, logits=logits,
             tokens=tokens)


def peak_rss_gib():
    """This process's RSS high-water mark (`resource.getrusage` `ru_maxrss`), in GiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB


def current_rss_gib():
    """This process's resident set size now (`/proc/self/statm`), in GiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


# ----------------------------------------------------------------------------
# Timing.


def timed(fn):
    """Seconds that one call `fn()` takes."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleaved(runs, rounds, warmup=0):
    """`{name: [seconds, ...]}` of `runs` (name -> callable with no arguments), timed in turn.

    Each is called `warmup` times (untimed, one after the other), then they are timed
    A B C A B C ... for `rounds` rounds, so that machine noise hits them alike.
    """
    for run in runs.values():
        for _ in range(warmup):
            run()
    times = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            times[name].append(timed(run))
    return times


def medians(times):
    """`{name: median}` of `{name: [seconds, ...]}`."""
    return {name: statistics.median(values) for name, values in times.items()}


# ----------------------------------------------------------------------------
# Options and output.


def add_options(parser, *, backend=None, quick=None, rounds=None, timeout=None,
                json_help="also write the results here", worker=True, baseline=None):
    """The options the benchmarks share, each under the name that benchmark documents.

    `backend`: "list" (`--backend a,b`, default every one of BACKENDS: `backends(args)`),
    "env" (one name, the driver sets KERAS_BACKEND; default the environment's), "one"
    (one of BACKENDS, default $KERAS_BACKEND or jax) or None (no option). `quick`: the
    help of `--quick`, None for no such option. `rounds`: `(flag, default, help)` of the
    number of timed rounds (`--rounds` or `--repeats`), read as `args.rounds`. `timeout`:
    `(flag, default, help)` of the seconds a worker may take (`--timeout` or
    `--timeout-s`), read as `args.timeout`. `json_help`: `--json PATH`'s help (None: no
    option). `worker`: the hidden `--worker SPEC` of a benchmark that `spawn`s itself
    (`worker_main`). `baseline`: what `--baseline DIR` (another checkout, for before/after
    figures in one run: `import_tree`) does in that benchmark, None for no such option.
    """
    if worker:
        parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    if backend == "list":
        parser.add_argument("--backend", default=None,
                            help=f"comma list of {','.join(BACKENDS)} (default: all)")
    elif backend == "env":
        parser.add_argument("--backend", default=None,
                            help="set KERAS_BACKEND (default: the environment's)")
    elif backend == "one":
        parser.add_argument("--backend", default=os.environ.get("KERAS_BACKEND", "jax"),
                            choices=BACKENDS)
    if quick is not None:
        parser.add_argument("--quick", action="store_true", help=quick)
    if rounds is not None:
        flag, default, text = rounds
        parser.add_argument(flag, dest="rounds", type=int, default=default, metavar="N",
                            help=text)
    if timeout is not None:
        flag, default, text = timeout
        parser.add_argument(flag, dest="timeout", type=int, default=default, metavar="S",
                            help=text)
    if json_help is not None:
        parser.add_argument("--json", default=None, metavar="PATH", help=json_help)
    if baseline is not None:
        parser.add_argument("--baseline", default=None, metavar="DIR",
                            help="another checkout (a `git worktree` of an earlier commit): "
                            + baseline)
    return parser


def run_backends(module, spec, args, table, *, extra=None, started=None):
    """The driver's loop: `module`'s worker once per backend of `args` (`spawn`, with
    `spec`, the backend and `extra`), each backend's `table(results, spec)` printed as it
    finishes, then the machine (and the seconds since `started`, a `perf_counter`) and
    the whole table; the results written to `--json`. Returns the results by backend."""
    tag = module.rsplit(".", 1)[-1]
    results = {}
    for backend in backends(args):
        print(f"[{tag}] {backend} ...", file=sys.stderr, flush=True)
        results[backend] = spawn(module, {**spec, "backend": backend, **(extra or {})},
                                 args.timeout)
        print(table({backend: results[backend]}, spec), flush=True)
    elapsed = "" if started is None else f", {time.perf_counter() - started:.0f} s"
    print(f"\n{machine()}{elapsed}\n")
    print(table(results, spec))
    if args.json:
        write_json(args.json, {"spec": spec, "results": results})
    return results


def backends(args):
    """The backends of a "list" `--backend`: the comma list, or all of BACKENDS."""
    return args.backend.split(",") if args.backend else list(BACKENDS)


def machine():
    """`N CPUs, load L` for a header line."""
    return f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"


def write_json(path, data):
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
