"""The whole GPU check in one command, offline: `python tools/gpu_check.py --out DIR`.

A script of the checkout, not part of the package (the wheel ships neither this
file nor the `tests/` and `benchmarks/` it drives). Run it from a checkout with
keras_attn importable (installed, or `PYTHONPATH` set to the checkout).

For a machine that already has the CUDA build of JAX, PyTorch and/or TensorFlow
installed and `keras` importable; it needs no network and installs nothing.
For each backend that sees a GPU (checked in a subprocess,
`python -m keras_attn.parity.worker --check-gpu`), one after the other:

1. `tests`: `pytest tests -x -q -p no:cacheprovider` on the GPU (TF32 off, as
   `tests/conftest.py` always sets) -> `tests-<backend>.log`;
2. `parity-gpu`, `parity-cpu`: `keras-attn parity --device gpu|cpu --dtypes
   float32,bfloat16,float16` (TF32 off in the workers) -> `parity-<device>-<backend>.json`;
3. `compare`: `keras-attn parity --compare` of the two -> `parity-cpu-vs-gpu-<backend>.json`;
4. `bench`: `python -m benchmarks.attention --quick` at the headline sizes with
   `KERAS_ATTN_ALLOW_TF32=1` (TF32 allowed for speed, Keras's flash attention at its
   default, on) -> `bench-<backend>.json`, when `benchmarks/` is present.

Every step's output goes to `<step>-<backend>.log` in DIR, and `summary.md` (plus
`summary.json`) gathers status, seconds and key figures. Steps share one time
budget (`--budget-s`): each step's timeout is what is left minus a reserve for
the steps after it, and once the budget is nearly spent the remaining steps are
marked skipped rather than started.

Exit status: 0 every step that ran passed, 1 a step failed or timed out (or a
backend named in `--backends` sees no GPU), 2 no backend sees a GPU.

This module imports no backend: everything backend-specific runs in subprocesses.
"""

import argparse
import importlib.util
import json
import os
import pathlib
import platform
import re
import signal
import subprocess
import sys
import time

__all__ = ["compare_figures", "main", "write_summary"]

PROG = "python tools/gpu_check.py"
BACKENDS = ("tensorflow", "jax", "torch")
DTYPES = "float32,bfloat16,float16"
HEADLINE_SIZES = "8x256x256x8,1x16384x256x4"
STEPS = ("tests", "parity-gpu", "parity-cpu", "compare", "bench")
# Seconds kept back for each later step when a step's timeout is set, and the
# least a step gets; below MIN_START seconds left, nothing new starts.
RESERVE = {"tests": 60, "parity-gpu": 30, "parity-cpu": 45, "compare": 10, "bench": 60}
MIN_START = 15
CHECK_TIMEOUT = 120
NO_GPU_EXIT = 2
# Several JAX/TensorFlow processes may hold the GPU at once (the parallel checks, the
# suite's own subprocesses): no up-front grab of most of its memory.
SHARE_GPU = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "TF_FORCE_GPU_ALLOW_GROWTH": "true"}


def _progress(start, text):
    print(f"[gpu-check {time.monotonic() - start:6.1f}s] {text}", flush=True)


def _find_root(explicit):
    """The source tree holding tests/ (and benchmarks/): --root, the checkout this
    script lives in (the parent of tools/), or the current directory."""
    if explicit:
        return pathlib.Path(explicit).resolve()
    here = pathlib.Path(__file__).resolve().parents[1]
    for candidate in (here, pathlib.Path.cwd()):
        if (candidate / "tests" / "conftest.py").is_file():
            return candidate
    return pathlib.Path.cwd()


def _env(backend, extra=None):
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2")
    env.update(extra or {})
    return env


def _run(cmd, env, cwd, log, timeout):
    """Run `cmd` in its own session, output to `log`; (returncode | "timeout", seconds)."""
    start = time.monotonic()
    with open(log, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        process = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=f, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            code = process.wait(timeout=max(1, timeout))
        except subprocess.TimeoutExpired:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(process.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    process.wait(timeout=10)
                    break
                except subprocess.TimeoutExpired:
                    continue
            f.write(f"\n[gpu-check] killed after the step's timeout of {timeout:.0f}s\n")
            code = "timeout"
    return code, time.monotonic() - start


def _tail(path, n=1):
    try:
        lines = [x for x in pathlib.Path(path).read_text(errors="replace").splitlines()
                 if x.strip()]
    except OSError:
        return ""
    return " | ".join(lines[-n:])


# ---------------------------------------------------------------------------
# Key figures, read from each step's outputs.


def _load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def pytest_figures(log):
    """pytest's closing line, e.g. "812 passed, 14 skipped in 201.3s"."""
    text = pathlib.Path(log).read_text(errors="replace") if os.path.exists(log) else ""
    lines = [x.strip(" =") for x in text.splitlines()
             if re.search(r"\d+ (passed|failed|error)", x)]
    return lines[-1] if lines else ""


def parity_figures(path):
    """Device and worst error / tolerance per dtype (1 = at the tolerance)."""
    report = _load(path)
    if not report:
        return ""
    devices = sorted({b["info"]["device"] for b in report.get("backends", {}).values()})
    parts = []
    for dtype, kinds in report.get("summary", {}).items():
        ratio = max((q["ratio"] for quantities in kinds.values()
                     for q in quantities.values()), default=0.0)
        parts.append(f"{dtype} {ratio:.2f}")
    failed = sum(not r["ok"] for r in report.get("records", []))
    return (", ".join(devices) + "; worst/tol " + ", ".join(parts)
            + (f"; {failed} comparison(s) FAIL" if failed else ""))


def compare_figures(path):
    """Worst CPU-vs-GPU max abs error per dtype, output and gradients."""
    report = _load(path)
    if not report:
        return ""
    parts = []
    for dtype, kinds in report.get("summary", {}).items():
        quantities = kinds.get("cross_backend", {})
        items = [f"{short} {quantities[q]['max_abs']:.1e}"
                 for q, short in (("output", "out"), ("gradient", "grad")) if q in quantities]
        ratio = max((q["ratio"] for q in quantities.values()), default=0.0)
        parts.append(f"{dtype}: " + " ".join(items) + f" (x{ratio:.2f} tol)")
    return "; ".join(parts)


def bench_figures(path):
    """GEMM throughput and keras_attn's median time (and ratio to Keras's layer)."""
    report = _load(path)
    if not report:
        return ""
    rows = report.get("rows", [])
    by_key = {(tuple(r["size"]), r["mode"], r["contender"]): r for r in rows}
    parts = []
    if report.get("gemm_gflops"):
        parts.append(f"GEMM {report['gemm_gflops']:.0f} GFLOP/s (TF32 {report.get('tf32', '?')})")
    for r in rows:
        if r["contender"] != "keras_attn" or "median_s" not in r:
            continue
        keras_row = by_key.get((tuple(r["size"]), r["mode"], "keras"), {})
        ratio = (f", /keras {r['median_s'] / keras_row['median_s']:.2f}"
                 if "median_s" in keras_row else "")
        parts.append(f"{'x'.join(map(str, r['size']))} {r['mode']} "
                     f"{r['median_s'] * 1e3:.2f} ms{ratio}")
    return "; ".join(parts)


# ---------------------------------------------------------------------------
# The summary.


def write_summary(out, results, meta):
    """Write `summary.md` and `summary.json` in `out`; returns the Markdown text.

    `results`: dicts with backend, step, status ("ok", "FAIL", "timeout",
    "skipped", "no GPU", ...), seconds (or None), figures and output (file names).
    `meta`: started, budget_s, spent_s, command, root, devices ({backend: text}).
    """
    out = pathlib.Path(out)
    failed = [r for r in results if r["status"] in ("FAIL", "timeout")]
    skipped = [r for r in results if r["status"] == "skipped"]
    lines = ["# keras_attn GPU check", "",
             f"- started: {meta.get('started', '?')}; host: {platform.node()} "
             f"({platform.platform()}), Python {platform.python_version()}",
             f"- command: `{meta.get('command', '?')}`",
             f"- budget: {meta.get('budget_s', 0):.0f}s, spent: {meta.get('spent_s', 0):.1f}s",
             "- TF32: off for the tests and parity runs, allowed for the benchmark",
             ""]
    for backend, device in meta.get("devices", {}).items():
        lines.append(f"- {backend}: {device}")
    lines += ["", "| backend | step | status | seconds | key figures | output |",
              "|---|---|---|---:|---|---|"]
    for r in results:
        seconds = "" if r.get("seconds") is None else f"{r['seconds']:.1f}"
        figures = str(r.get("figures") or "").replace("|", "/")
        lines.append(f"| {r['backend']} | {r['step']} | {r['status']} | {seconds} | "
                     f"{figures} | {r.get('output') or ''} |")
    verdict = ("FAILED: " + ", ".join(f"{r['backend']} {r['step']}" for r in failed)
               if failed else "ok")
    if skipped:
        verdict += f" ({len(skipped)} step(s) skipped, see the table)"
    lines += ["", f"Result: {verdict}", ""]
    text = "\n".join(lines)
    (out / "summary.md").write_text(text)
    with open(out / "summary.json", "w") as f:
        json.dump({"meta": meta, "results": results, "ok": not failed}, f, indent=1)
    return text


# ---------------------------------------------------------------------------
# Driver.


def _check_gpus(backends, root, timeout):
    """{backend: (sees_gpu, text)}; the checks run in parallel subprocesses."""
    found, running = {}, {}
    for backend in backends:
        if importlib.util.find_spec(backend) is None:
            found[backend] = (False, "not installed")
            continue
        running[backend] = subprocess.Popen(
            [sys.executable, "-m", "keras_attn.parity.worker", "--check-gpu"],
            env=_env(backend, SHARE_GPU), cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, start_new_session=True)
    for backend, process in running.items():
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            found[backend] = (False, f"the GPU check timed out after {timeout}s")
            continue
        lines = [x for x in (stdout + stderr).splitlines() if x.strip()]
        text = lines[-1] if lines else "(no output)"
        if process.returncode == 0:
            found[backend] = (True, stdout.strip().splitlines()[-1])
        elif process.returncode == NO_GPU_EXIT:
            found[backend] = (False, "no GPU: " + text)
        else:
            found[backend] = (False, f"cannot start (exit {process.returncode}): {text}")
    return {b: found[b] for b in backends}


def _plan(backend, out, root, args):
    """[(step, command, extra env, output files)] for one backend."""
    py = sys.executable
    parity = [py, "-m", "keras_attn", "parity", "--backends", backend, "--dtypes", DTYPES]
    gpu_json, cpu_json = out / f"parity-gpu-{backend}.json", out / f"parity-cpu-{backend}.json"
    share = SHARE_GPU
    steps = []
    if not args.skip_tests:
        steps.append(("tests", [py, "-m", "pytest", "tests", "-x", "-q", "-p", "no:cacheprovider"],
                      share, []))
    steps += [("parity-gpu", parity + ["--device", "gpu", "--json", str(gpu_json)], share,
               [gpu_json]),
              ("parity-cpu", parity + ["--device", "cpu", "--json", str(cpu_json)], share,
               [cpu_json]),
              ("compare", [py, "-m", "keras_attn", "parity", "--compare", str(cpu_json),
                           str(gpu_json), "--json",
                           str(out / f"parity-cpu-vs-gpu-{backend}.json")], {},
               [out / f"parity-cpu-vs-gpu-{backend}.json"])]
    bench = root / "benchmarks" / "attention.py"
    if not args.skip_bench and bench.is_file():
        cmd = [py, "-m", "benchmarks.attention", "--backend", backend, "--quick",
               "--sizes", args.bench_sizes]
        outputs = []
        if "--json" in bench.read_text():
            outputs = [out / f"bench-{backend}.json"]
            cmd += ["--json", str(outputs[0])]
        steps.append(("bench", cmd, {"KERAS_ATTN_ALLOW_TF32": "1"}, outputs))
    return steps


def _figures(step, log, outputs):
    if step == "tests":
        return pytest_figures(log)
    path = outputs[0] if outputs else None
    if step.startswith("parity-"):
        return parity_figures(path) if path else ""
    if step == "compare":
        return compare_figures(path) if path else ""
    if step == "bench":
        return bench_figures(path) if path else _tail(log)
    return ""


def _parser():
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Run the test suite, the parity cases (GPU vs CPU) and the benchmark "
        "on every backend that sees a GPU, offline, and write every report to one folder.")
    parser.add_argument("--out", required=True, help="output folder (created)")
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help="comma-separated, from tensorflow,jax,torch (default: all; "
                        "those not installed or without a GPU are skipped, and fail the "
                        "check only when named here)")
    parser.add_argument("--budget-s", type=float, default=480.0,
                        help="total time budget in seconds (default 480)")
    parser.add_argument("--skip-tests", action="store_true", help="do not run the test suite")
    parser.add_argument("--skip-bench", action="store_true", help="do not run the benchmark")
    parser.add_argument("--bench-sizes", default=HEADLINE_SIZES,
                        help=f"benchmark sizes BxTxDxH (default: the headline {HEADLINE_SIZES})")
    parser.add_argument("--root", default=None,
                        help="the source tree with tests/ and benchmarks/ (default: the "
                        "checkout holding this script, else the current directory)")
    return parser


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    bad = [b for b in backends if b not in BACKENDS]
    if not backends or bad:
        _parser().error(f"--backends takes a comma-separated list from {list(BACKENDS)}. "
                        f"Received: {args.backends!r}")
    explicit = any(a == "--backends" or a.startswith("--backends=") for a in argv)
    start = time.monotonic()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    root = _find_root(args.root)
    meta = {"started": time.strftime("%Y-%m-%d %H:%M:%S %z"), "budget_s": args.budget_s,
            "command": " ".join([PROG] + argv),
            "root": str(root), "devices": {}}
    results = []

    def left():
        return args.budget_s - (time.monotonic() - start)

    _progress(start, f"checking which of {', '.join(backends)} see a GPU (root {root}) ...")
    found = _check_gpus(backends, root, min(CHECK_TIMEOUT, max(10, left() / 2)))
    for backend, (ok, text) in found.items():
        meta["devices"][backend] = text
        _progress(start, f"{backend}: {text}")
        results.append({"backend": backend, "step": "check-gpu",
                        "status": "ok" if ok else ("FAIL" if explicit else "no GPU"),
                        "seconds": None, "figures": text, "output": ""})
    with_gpu = [b for b, (ok, _) in found.items() if ok]
    if not with_gpu:
        for r in results:
            r["status"] = "no GPU"
        meta["spent_s"] = round(time.monotonic() - start, 1)
        write_summary(out, results, meta)
        print("gpu-check: no backend sees a GPU (" + "; ".join(
            f"{b}: {t}" for b, (_, t) in found.items()) + "). Nothing was run. Install the "
            "CUDA build of JAX, PyTorch or TensorFlow and make a GPU visible "
            f"(summary: {out / 'summary.md'}).", file=sys.stderr, flush=True)
        return 2

    plans = [(b, step) for b in with_gpu for step in _plan(b, out, root, args)]
    for index, (backend, (step, cmd, extra, outputs)) in enumerate(plans):
        log = out / f"{step}-{backend}.log"
        row = {"backend": backend, "step": step, "seconds": None, "figures": "",
               "output": ""}
        results.append(row)
        if step == "compare" and not all(p.exists() for p in (
                out / f"parity-gpu-{backend}.json", out / f"parity-cpu-{backend}.json")):
            row.update(status="skipped", figures="a parity report is missing")
            _progress(start, f"{backend} {step}: skipped (a parity report is missing)")
            continue
        remaining = left()
        if remaining < MIN_START:
            row.update(status="skipped", figures=f"budget spent ({max(0, remaining):.0f}s left)")
            _progress(start, f"{backend} {step}: skipped, budget spent")
            continue
        reserve = sum(RESERVE[s] for _, (s, *_rest) in plans[index + 1:])
        timeout = min(remaining, max(RESERVE[step], remaining - reserve))
        if step == "bench":
            # The benchmark's own per-configuration timeout stays inside the step's.
            cmd = cmd + ["--timeout-s", str(max(1, int(timeout)))]
        _progress(start, f"{backend} {step}: running (timeout {timeout:.0f}s) -> {log.name}")
        code, seconds = _run(cmd, _env(backend, extra), root, log, timeout)
        status = "ok" if code == 0 else ("timeout" if code == "timeout" else "FAIL")
        row.update(status=status, seconds=round(seconds, 1), output=", ".join(
            [p.name for p in outputs if p.exists()] + [log.name]),
                   figures=_figures(step, log, outputs) or _tail(log))
        _progress(start, f"{backend} {step}: {status} in {seconds:.1f}s"
                  + (f" (exit {code})" if status == "FAIL" else "")
                  + (f": {row['figures']}" if row["figures"] else ""))
    meta["spent_s"] = round(time.monotonic() - start, 1)
    text = write_summary(out, results, meta)
    print(text.rstrip().splitlines()[-1] + f"  (summary: {out / 'summary.md'})", flush=True)
    return 1 if any(r["status"] in ("FAIL", "timeout") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
