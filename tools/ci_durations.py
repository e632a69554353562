"""Per-environment and per-file test time from the JUnit files tox writes.

Every test environment in tox.ini passes `--junitxml={toxworkdir}/junit/{env_name}.xml`
to pytest; after `tox run-parallel` (or `bash .ci/run`) this prints, per environment
and pytest run, the tests that ran (deselected ones are not in the file), those skipped
and failed, the summed test time, and the files that took longest:

    python tools/ci_durations.py .tox/junit            # every environment
    python tools/ci_durations.py .tox/junit --top 10   # the 10 slowest files of each

The tables in tests/README.md were made with it.
"""

import argparse
import collections
import pathlib
import xml.etree.ElementTree as ET


def test_file(classname):
    """The test file of a JUnit `classname`, relative to tests/ and without `.py`.

    `tests.kernels.test_masks.TestX` -> `kernels/test_masks`, `tests.test_cli` -> `test_cli`
    (the tests follow the modules they test: tests/kernels, layers, models, convert).
    """
    parts = classname.split(".")
    if parts[0] == "tests":
        parts = parts[1:]
    for i, part in enumerate(parts):
        if part.startswith("test_"):
            return "/".join(parts[:i + 1])
    return parts[0] if parts else classname


def summarize(path):
    """`(counts, seconds by file)` of one JUnit file."""
    root = ET.parse(path).getroot()
    counts = collections.Counter()
    per_file = collections.Counter()
    for case in root.iter("testcase"):
        per_file[test_file(case.get("classname", ""))] += float(case.get("time", 0.0))
        counts["tests"] += 1
        if case.find("skipped") is not None:
            counts["skipped"] += 1
        elif case.find("failure") is not None or case.find("error") is not None:
            counts["failed"] += 1
    return counts, per_file


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=pathlib.Path, help="the folder of JUnit files")
    parser.add_argument("--top", type=int, default=5, help="slowest files per environment")
    args = parser.parse_args(argv)
    files = sorted(args.folder.glob("*.xml"))
    if not files:
        parser.error(f"no JUnit files in {args.folder}")
    print("| environment | file | tests | skipped | failed | test time (s) | slowest files (s) |")
    print("|---|---|---:|---:|---:|---:|---|")
    for path in files:
        counts, per_file = summarize(path)
        slowest = ", ".join(f"{name} {t:.0f}" for name, t in per_file.most_common(args.top))
        env, _, part = path.stem.partition(".")
        print(f"| {env} | {part or 'tests'} | {counts['tests']} | {counts['skipped']} | "
              f"{counts['failed']} | {sum(per_file.values()):.0f} | {slowest} |")


if __name__ == "__main__":
    main()
