"""`keras-attn parity`: run the cases on every backend, compare, report.

Each backend runs in its own subprocess (`python -m keras_attn.parity.worker`)
with `KERAS_BACKEND` set; the arrays and results travel as .npz/JSON files in
a temporary directory. Exit status: 0 all within tolerance, 1 something is
not, 2 the requested device is unavailable (or a worker could not run).
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

# The backends and how to tell they are installed (numpy needs jax and scipy) are the
# command's front door's, which finds them without importing anything.
from keras_attn.cli import BACKENDS, REQUIRES, installed_backends, quiet_environment
from keras_attn.parity.worker import NO_GPU_EXIT, PROGRESS
from keras_attn.testing.tolerances import TOLERANCES

__all__ = ["BACKENDS", "REQUIRES", "add_arguments", "installed_backends", "run"]

TRAINABLE = ("tensorflow", "jax", "torch")


def _list(kind, choices):
    def parse(text):
        items = [t.strip() for t in text.split(",") if t.strip()]
        bad = [t for t in items if t not in choices]
        if not items or bad:
            raise argparse.ArgumentTypeError(
                f"--{kind} takes a comma-separated list from {list(choices)}. "
                f"Received: {text!r}")
        return list(dict.fromkeys(items))
    return parse


def _case_list(cases):
    width = max(len(c.name) for c in cases)
    return "\n".join(f"  {c.name:{width}s}  {c.description}" for c in cases)


def add_arguments(parser):
    from keras_attn.parity.cases import CASES

    # The case list keeps its lines (one case per line); the options' help is
    # wrapped as usual.
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (f"cases ({len(CASES)}; --cases takes a comma-separated list of "
                     f"these names):\n" + _case_list(CASES))

    parser.add_argument("--backends", type=_list("backends", BACKENDS), default=None,
                        help="comma-separated backends (default: those installed; "
                        "on --device gpu the trainable ones installed)")
    parser.add_argument("--dtypes", type=_list("dtypes", tuple(TOLERANCES)),
                        default=["float32"],
                        help="compute dtypes: float32, bfloat16, float16 (the latter two "
                        "as mixed_* policies with float32 weights); default float32")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                        help="cpu (GPUs hidden from the workers) or gpu (fails with exit "
                        "status 2 if a backend sees no GPU)")
    parser.add_argument("--cases", type=_list("cases", [c.name for c in CASES]),
                        default=None, help="only these cases (default: all; listed below)")
    parser.add_argument("--json", metavar="PATH", default=None,
                        help="write the full report (figures, versions, raw results) here")
    parser.add_argument("--compare", nargs=2, metavar=("A.json", "B.json"), default=None,
                        help="compare two saved reports case by case instead of running")
    parser.add_argument("--repeat", type=int, default=2,
                        help="runs per case in each worker for the determinism check "
                        "(default 2; 1 skips it)")


def _worker_env(backend, device):
    # TensorFlow's C++ start-up logs hidden, unless the user set the level.
    env = quiet_environment(dict(os.environ, KERAS_BACKEND=backend))
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(
        [package_root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["JAX_PLATFORMS"] = "cpu"
    return env


def _progress(text):
    print(text, file=sys.stderr, flush=True)


class _Counter:
    """The running count of (backend, dtype, case) runs done, over all backends."""

    def __init__(self, total):
        self.done, self.total = 0, total
        self.width = len(str(total))

    def follow(self, backend, stream):
        """Print one line per case the worker reports on `stream` (its stdout, read in
        a thread while the parent computes the reference); other lines are dropped."""
        for line in stream:
            if not line.startswith(PROGRESS):
                continue
            try:
                event = json.loads(line[len(PROGRESS):])
            except ValueError:
                continue
            self.done += 1
            outcome = f"raised {event['error']}" if event.get("error") else \
                f"{event['seconds']:.2f}s"
            _progress(f"[parity] {self.done:{self.width}d}/{self.total} {backend} "
                      f"{event['key']} {outcome}")


def _write_arrays(path, cases):
    from keras_attn.parity.arrays import case_arrays

    arrays, per_case = {}, {}
    for case in cases:
        inputs, masks, weights = case_arrays(case)
        per_case[case.name] = (inputs, masks, weights)
        for group, values in (("inputs", inputs), ("masks", masks), ("weights", weights)):
            for name, value in values.items():
                arrays[f"{case.name}/{group}/{name}"] = value
    np.savez(path, **arrays)
    return per_case


def _run_workers(args, backends, cases, tmp):
    """Start the workers one after the other; the reference is computed while
    the first one runs. Returns (results, metas, reference) or an exit code."""
    from keras_attn.parity.expected import reference_result

    per_case = _write_arrays(os.path.join(tmp, "arrays.npz"), cases)
    results, metas, reference = {}, {}, None
    counter = _Counter(len(backends) * len(args.dtypes) * len(cases))
    for backend in backends:
        request = {"arrays": os.path.join(tmp, "arrays.npz"),
                   "cases": [c.name for c in cases], "dtypes": args.dtypes,
                   "device": args.device, "gradients": backend in TRAINABLE,
                   "repeat": args.repeat if args.device == "cpu" else 1,
                   "results": os.path.join(tmp, f"{backend}.npz"),
                   "meta": os.path.join(tmp, f"{backend}.json")}
        request_path = os.path.join(tmp, f"{backend}.request.json")
        with open(request_path, "w") as f:
            json.dump(request, f)
        _progress(f"[parity] {backend}: running {len(cases)} cases x "
                  f"{len(args.dtypes)} dtype(s) on {args.device} ...")
        start = time.perf_counter()
        with open(os.path.join(tmp, f"{backend}.stderr"), "w+") as err:
            process = subprocess.Popen(
                [sys.executable, "-m", "keras_attn.parity.worker", request_path],
                env=_worker_env(backend, args.device), stdout=subprocess.PIPE,
                stderr=err, text=True)
            follower = threading.Thread(target=counter.follow, args=(backend, process.stdout),
                                        daemon=True)
            follower.start()
            if reference is None:
                reference = {name: reference_result(cases_by_name(cases)[name], *arrays)
                             for name, arrays in per_case.items()}
            process.wait()
            follower.join()
            process.stdout.close()
            err.seek(0)
            stderr = err.read()
        seconds = time.perf_counter() - start
        if process.returncode != 0 or not os.path.exists(request["meta"]):
            lines = stderr.strip().splitlines() or ["(no output)"]
            if process.returncode == NO_GPU_EXIT:
                _progress(f"[parity] {backend}: {lines[-1]}")
            else:
                _progress(f"[parity] {backend}: the worker failed (exit status "
                          f"{process.returncode}):\n" + "\n".join(lines[-20:]))
            return 2
        with open(request["meta"]) as f:
            metas[backend] = json.load(f)
        with np.load(request["results"]) as data:
            results[backend] = {k: data[k] for k in data.files}
        errors = len(metas[backend]["errors"])
        _progress(f"[parity] {backend}: done in {seconds:.1f}s on "
                  f"{metas[backend]['info']['device']}"
                  + (f", {errors} case(s) raised" if errors else ""))
    return results, metas, reference


def cases_by_name(cases):
    return {c.name: c for c in cases}


def _environment():
    import keras

    return {"platform": platform.platform(), "python": platform.python_version(),
            "keras": keras.__version__}


def _run_compare(args):
    from keras_attn.parity import report
    from keras_attn.parity.compare import compare_reports

    a, b = (report.load(p) for p in args.compare)
    arrays = [{backend: report.decode_arrays(v) for backend, v in r["arrays"].items()}
              for r in (a, b)]
    records = compare_reports(a, b, *arrays)
    print(f"A: {args.compare[0]} ({a['device']}: "
          f"{', '.join(d['info']['device'] for d in a['backends'].values())})")
    print(f"B: {args.compare[1]} ({b['device']}: "
          f"{', '.join(d['info']['device'] for d in b['backends'].values())})")
    if not records:
        print("The two reports share no results to compare.")
        return 1
    print(report.format_table(records))
    print()
    print(report.format_summary(report.summary(records)))
    ok = all(r["ok"] for r in records)
    if args.json:
        report.save(args.json, {"compare": list(args.compare), "records": records,
                                "summary": report.summary(records), "ok": ok})
    print("\nparity compare: " + ("ok" if ok else "FAIL"))
    return 0 if ok else 1


def run(args):
    from keras_attn.parity import report
    from keras_attn.parity.cases import get_cases
    from keras_attn.parity.compare import compare_backends

    if args.compare:
        return _run_compare(args)
    if args.repeat < 1:
        raise ValueError(f"--repeat must be >= 1. Received: {args.repeat}")
    backends = args.backends or [
        b for b in installed_backends() if args.device == "cpu" or b in TRAINABLE]
    missing = [b for b in backends if b not in installed_backends()]
    if missing:
        raise ValueError(f"--backends names backends that are not installed: {missing}. "
                         f"Received: --backends {','.join(backends)}")
    if args.device == "gpu" and "numpy" in backends:
        raise ValueError("The numpy backend has no GPU; leave it out of --backends with "
                         f"--device gpu. Received: --backends {','.join(backends)}")
    cases = get_cases(args.cases)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="keras-attn-parity-") as tmp:
        outcome = _run_workers(args, backends, cases, tmp)
    if isinstance(outcome, int):
        return outcome
    results, metas, reference = outcome
    errors = {b: m["errors"] for b, m in metas.items()}
    records = compare_backends(results, reference, args.dtypes, [c.name for c in cases],
                               args.device, errors)
    summ = report.summary(records)
    ok = all(r["ok"] for r in records)
    determinism = {b: {"bitwise_identical": all(m["deterministic"].values()),
                       "runs": args.repeat if args.device == "cpu" else 1,
                       "not_identical": [k for k, v in m["deterministic"].items() if not v]}
                   for b, m in metas.items()}
    seconds = time.perf_counter() - start
    print(report.format_table(records))
    print()
    print(report.format_summary(summ))
    print()
    for backend, det in determinism.items():
        if det["runs"] < 2:
            text = "not checked (one run)"
        elif det["bitwise_identical"]:
            text = f"bitwise identical over {det['runs']} runs"
        else:
            text = f"NOT bitwise identical: {', '.join(det['not_identical'])}"
        print(f"determinism {backend}: {text}")
    for backend, errs in errors.items():
        for key, message in errs.items():
            print(f"error {backend} {key}: {message}")
    if args.json:
        report.save(args.json, {
            "environment": _environment(), "device": args.device,
            "dtypes": args.dtypes, "cases": {c.name: c.description for c in cases},
            "backends": metas, "tolerances": TOLERANCES, "ok": ok,
            "seconds": round(seconds, 2), "determinism": determinism, "summary": summ,
            "records": records, "arrays": {b: report.encode_arrays(r)
                                           for b, r in results.items()}})
        print(f"report written to {args.json}")
    print(f"parity: {'ok' if ok else 'FAIL'} ({len(records)} comparisons, "
          f"{sum(not r['ok'] for r in records)} failed, {seconds:.1f}s)")
    return 0 if ok else 1
