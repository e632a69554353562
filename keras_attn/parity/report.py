"""The parity report: the table on stdout, the JSON file, and summaries.

The JSON report holds the environment (versions, platform, device), every
comparison record with the tolerance it was held to, the determinism check,
and the raw float32 results of every backend (base64), so that two reports
made on different machines can be compared later (`--compare`).
"""

import base64
import json

import numpy as np

from keras_attn.parity.compare import REFERENCE

__all__ = ["decode_arrays", "encode_arrays", "format_table", "load", "save", "summary"]

SHORT = {"tensorflow": "tf", "jax": "jax", "torch": "torch", "numpy": "np",
         REFERENCE: "ref"}


def encode_arrays(arrays):
    return {key: {"shape": list(v.shape), "dtype": "float32",
                  "data": base64.b64encode(np.ascontiguousarray(v, np.float32).tobytes())
                  .decode("ascii")}
            for key, v in arrays.items()}


def decode_arrays(encoded):
    return {key: np.frombuffer(base64.b64decode(v["data"]), v["dtype"]).reshape(v["shape"])
            for key, v in encoded.items()}


def save(path, report):
    with open(path, "w") as f:
        json.dump(report, f, indent=1)


def load(path):
    """A saved report; ValueError naming the file if it is not one."""
    try:
        with open(path) as f:
            report = json.load(f)
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read a parity report from {path!r}: {error}. "
                         f"Received: {path!r}") from None
    if not isinstance(report, dict) or "arrays" not in report or "device" not in report:
        raise ValueError(f"{path!r} is not a keras-attn parity report (no 'arrays' or "
                         f"'device'). Received: {path!r}")
    return report


def _short(name):
    prefix, _, rest = name.rpartition(":")  # "A:tensorflow" in --compare
    return (prefix + ":" if prefix else "") + SHORT.get(rest, rest)


def _label(a, b):
    return f"{_short(a)}-{_short(b)}"


def _fmt(value):
    return "-" if value is None else f"{value:.1e}"


def format_table(records):
    """Rows = dtype/case, columns = pairs: worst max abs error (`!` = FAIL),
    then the worst error as a fraction of its tolerance and ok/FAIL."""
    columns, rows = [], {}
    for r in records:
        column = _label(r["a"], r["b"])
        if column not in columns:
            columns.append(column)
        row = rows.setdefault((r["dtype"], r["case"]), {})
        cell = row.setdefault(column, {"max_abs": None, "ok": True})
        if r["max_abs"] is not None:
            cell["max_abs"] = max(cell["max_abs"] or 0.0, r["max_abs"])
        cell["ok"] &= r["ok"]
        row.setdefault("_ratio", 0.0)
        row["_ratio"] = max(row["_ratio"], r["ratio"] if r["ratio"] is not None
                            else float("inf"))
    name_width = max([len(f"{d} {c}") for d, c in rows] + [10])
    width = max([len(c) for c in columns] + [8]) + 1
    head = "case".ljust(name_width) + "".join(c.rjust(width) for c in columns)
    lines = [head + "  worst/tol  status", "-" * (len(head) + 19)]
    for (dtype, case), row in rows.items():
        cells = []
        for column in columns:
            cell = row.get(column)
            text = "" if cell is None else _fmt(cell["max_abs"]) + ("" if cell["ok"] else "!")
            cells.append(text.rjust(width))
        ok = all(row[c]["ok"] for c in columns if c in row)
        lines.append(f"{dtype} {case}".ljust(name_width) + "".join(cells)
                     + f"{row['_ratio']:11.2f}  " + ("ok" if ok else "FAIL"))
    return "\n".join(lines)


def summary(records):
    """Worst figures per dtype, quantity and kind (cross-backend / vs reference)."""
    out = {}
    for r in records:
        if r["max_abs"] is None:
            continue
        kind = "vs_reference" if r["b"] == REFERENCE else "cross_backend"
        quantity = "gradient" if r["name"].startswith("grad/") else "output"
        slot = out.setdefault(r["dtype"], {}).setdefault(kind, {}).setdefault(
            quantity, {"max_abs": 0.0, "max_rel": 0.0, "ratio": 0.0, "where": None,
                       "atol": r["atol"], "rtol": r["rtol"]})
        if r["max_abs"] >= slot["max_abs"]:
            slot["max_abs"] = r["max_abs"]
            slot["where"] = f"{r['case']} {r['name']} ({r['a']} vs {r['b']})"
        slot["max_rel"] = max(slot["max_rel"], r["max_rel"])
        slot["ratio"] = max(slot["ratio"], r["ratio"])
    return out


def format_summary(summ):
    lines = []
    for dtype, kinds in summ.items():
        for kind, quantities in kinds.items():
            for quantity, s in quantities.items():
                lines.append(
                    f"{dtype:9s} {kind:13s} {quantity:8s} worst abs {s['max_abs']:.2e} "
                    f"(tolerance atol={s['atol']:g} rtol={s['rtol']:g}, worst/tol "
                    f"{s['ratio']:.2f}) at {s['where']}")
    return "\n".join(lines)
