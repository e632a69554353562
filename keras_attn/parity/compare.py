"""Comparison logic of the parity matrix: pure NumPy, no backend.

Every comparison is held to `keras_attn.testing.tolerances.tolerance(dtype,
quantity, device)` and records which tolerance that was. A comparison fails
when any element is outside `atol + rtol * |expected|`, when either side has
a NaN or an infinity, when the shapes differ, or when a result is missing.
"""

import numpy as np

from keras_attn.testing.tolerances import tolerance

__all__ = ["compare_arrays", "compare_backends", "compare_reports", "quantity_of"]

REFERENCE = "reference"


def quantity_of(name):
    """"output" for the forward output, "gradient" for "grad/..." entries."""
    return "gradient" if name.startswith("grad/") else "output"


def compare_arrays(actual, expected, dtype="float32", quantity="output", device="cpu"):
    """Max absolute and relative error of `actual` against `expected`.

    Returns a dict: max_abs, max_rel (`|a - e| / max(|e|, atol)`), ratio
    (the worst `|a - e| / (atol + rtol * |e|)`, so <= 1 passes), atol, rtol,
    ok, and `why` when not ok.
    """
    tol = tolerance(dtype, quantity, device)
    record = {"max_abs": None, "max_rel": None, "ratio": None, **tol, "ok": False}
    if actual is None or expected is None:
        record["why"] = "missing result"
        return record
    a = np.asarray(actual, np.float64)
    e = np.asarray(expected, np.float64)
    if a.shape != e.shape:
        record["why"] = f"shape {a.shape} != {e.shape}"
        return record
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(e))):
        record["why"] = "non-finite values (NaN or inf)"
        return record
    if a.size == 0:
        record.update(max_abs=0.0, max_rel=0.0, ratio=0.0, ok=True)
        return record
    diff = np.abs(a - e)
    allowed = tol["atol"] + tol["rtol"] * np.abs(e)
    ratio = float(np.max(diff / allowed))
    record.update(
        max_abs=float(diff.max()),
        max_rel=float(np.max(diff / np.maximum(np.abs(e), tol["atol"]))),
        ratio=ratio,
        ok=bool(np.all(diff <= allowed)),
    )
    if not record["ok"]:
        record["why"] = "exceeds tolerance"
    return record


def _pairs(names):
    return [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]


def compare_backends(results, reference, dtypes, cases, device="cpu", errors=None):
    """Every backend pair and every backend against the reference.

    results: backend -> {"<dtype>/<case>/<quantity name>": array}.
    reference: case -> {"output": array, "grad/<name>": array} (float64).
    errors: backend -> {"<dtype>/<case>": message} from the workers.
    Returns a list of records: dtype, case, name, a, b, and compare_arrays'
    figures. A backend without gradients (numpy) is compared on outputs only.
    """
    errors = errors or {}
    backends = list(results)
    records = []
    for dtype in dtypes:
        for case in cases:
            names = list(reference[case])
            for backend in backends:
                message = errors.get(backend, {}).get(f"{dtype}/{case}")
                if message:
                    records.append({"dtype": dtype, "case": case, "name": "run",
                                    "a": backend, "b": REFERENCE, "ok": False,
                                    "why": message, "max_abs": None, "max_rel": None,
                                    "ratio": None})
            for a, b in [*_pairs(backends), *[(x, REFERENCE) for x in backends]]:
                for name in names:
                    key = f"{dtype}/{case}/{name}"
                    actual = results[a].get(key)
                    if b == REFERENCE:
                        expected = reference[case][name]
                    else:
                        expected = results[b].get(key)
                    if quantity_of(name) == "gradient" and (
                            not _has_gradients(results[a]) or
                            (b != REFERENCE and not _has_gradients(results[b]))):
                        continue
                    record = compare_arrays(actual, expected, dtype, quantity_of(name), device)
                    records.append({"dtype": dtype, "case": case, "name": name,
                                    "a": a, "b": b, **record})
    return records


def _has_gradients(result):
    return any("/grad/" in key for key in result)


def compare_reports(report_a, report_b, arrays_a, arrays_b):
    """Case-by-case comparison of two saved reports (for example CPU and GPU).

    Backends present in both are compared with each other; if the reports
    share no backend, every backend of A is compared with every one of B.
    The tolerance is the dtype's, for the device "gpu" if either report ran
    on a GPU.
    """
    device = "gpu" if "gpu" in (report_a["device"], report_b["device"]) else "cpu"
    common = [b for b in arrays_a if b in arrays_b]
    pairs = [(b, b) for b in common] or [(a, b) for a in arrays_a for b in arrays_b]
    records = []
    for a, b in pairs:
        keys = [k for k in arrays_a[a] if k in arrays_b[b]]
        for key in keys:
            dtype, case, name = key.split("/", 2)
            record = compare_arrays(arrays_a[a][key], arrays_b[b][key], dtype,
                                    quantity_of(name), device)
            records.append({"dtype": dtype, "case": case, "name": name,
                            "a": "A:" + a, "b": "B:" + b, **record})
    return records
