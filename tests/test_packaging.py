"""The distribution's metadata agrees with itself: the floors pyproject.toml declares are
the versions `tox -e min-deps` installs."""

import configparser
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _pyproject():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _floors(requirements):
    """{"keras": "3.9", ...} from ["keras>=3.9", ...]."""
    floors = {}
    for requirement in requirements:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)(?:\[[^]]*\])?>=([0-9.]+)(?:,<[0-9.]+)?", requirement)
        if match:
            floors[match.group(1)] = match.group(2)
    return floors


def _min_deps_pins():
    config = configparser.ConfigParser(interpolation=None)
    config.read(ROOT / "tox.ini")
    deps = config["testenv:min-deps"]["deps"].split("\n")
    return dict(d.strip().split("==") for d in deps if "==" in d)


def _same_version(pin, floor):
    return [int(x) for x in pin.split(".")] == (
        [int(x) for x in floor.split(".")] + [0] * 3)[:len(pin.split("."))]


def test_min_deps_installs_exactly_the_declared_floors():
    meta = _pyproject()["project"]
    floors = _floors(meta["dependencies"])
    floors.update(_floors(meta["optional-dependencies"]["jax"]))
    pins = _min_deps_pins()
    assert {"keras", "numpy", "jax"} <= set(floors), floors
    for name, floor in floors.items():
        assert name in pins, f"tox -e min-deps does not pin {name} (declared >= {floor})"
        assert _same_version(pins[name], floor), f"{name}: pinned {pins[name]}, declared >= {floor}"
    assert pins["jaxlib"] == pins["jax"], "jaxlib must match jax"
