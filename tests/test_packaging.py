"""The distribution: metadata that agrees with itself, and (in `tox -e packaging`) the
sdist and wheel that `python -m build` makes, checked by twine and installed in a
fresh virtual environment.

The build tests need `build`, `twine` and the package index (the fresh venv installs
keras and jax), so they run only with KERAS_ATTN_PACKAGING=1, which the `packaging`
tox environment sets; that environment runs pytest with --noconftest (it has no
keras). The other tests read files only and run everywhere.
"""

import configparser
import email
import os
import pathlib
import re
import subprocess
import sys
import venv
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGING = os.environ.get("KERAS_ATTN_PACKAGING") == "1"
needs_packaging = pytest.mark.skipif(
    not PACKAGING, reason="builds and installs the package: `tox -e packaging` "
    "(KERAS_ATTN_PACKAGING=1)")
# The oldest setuptools the build requirement allows, and the newest (pip's pick).
SETUPTOOLS = ("77.0.3", None)


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


def test_transformers_oldest_pins_the_floor_the_torch_environment_allows():
    """tox's `transformers-oldest` runs the converter tests at the lowest transformers the
    `torch` environment accepts (its `transformers>=X.Y` floor), with torch's pin, in CI's
    env_list."""
    config = configparser.ConfigParser(interpolation=None)
    config.read(ROOT / "tox.ini")
    floor = re.search(r"torch: transformers>=([0-9.]+)", config["testenv"]["deps"]).group(1)
    deps = config["testenv:transformers-oldest"]["deps"].split("\n")
    pins = dict(d.strip().split("==") for d in deps if "==" in d)
    assert pins["transformers"].split(".")[:2] == floor.split(".")[:2], (pins, floor)
    assert "torch: torch==" + pins["torch"] in config["testenv"]["deps"]
    assert "transformers-oldest" in config["tox"]["env_list"]


def test_the_version_has_one_source():
    meta = _pyproject()
    assert "version" not in meta["project"] and meta["project"]["dynamic"] == ["version"]
    assert meta["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "keras_attn.__version__"}
    assert re.search(r'^__version__ = "[0-9]+\.[0-9]+\.[0-9]+"$',
                     (ROOT / "keras_attn" / "__init__.py").read_text(), re.MULTILINE)


def test_license_and_classifiers():
    meta = _pyproject()["project"]
    assert meta["license"] == "Apache-2.0" and meta["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    # PEP 639: a license expression replaces the license classifiers.
    assert not [c for c in meta["classifiers"] if c.startswith("License ::")]
    trove = pytest.importorskip("trove_classifiers")
    unknown = [c for c in meta["classifiers"] if c not in trove.classifiers]
    assert not unknown, f"PyPI rejects unknown classifiers: {unknown}"
    versions = {c.rsplit(" :: ", 1)[1] for c in meta["classifiers"]
                if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)}
    assert min(versions, key=lambda v: int(v.split(".")[1])) == \
        meta["requires-python"].removeprefix(">=")


def _run(*command, env=None, cwd=None, timeout=900):
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=timeout)
    assert done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


_BUILDS = {}


def _build(setuptools, out):
    """`python -m build` (the sdist, then the wheel built from the sdist), once per
    setuptools version (None: the newest the build requirement allows)."""
    if setuptools in _BUILDS:
        return _BUILDS[setuptools]
    env = dict(os.environ)
    if setuptools:
        constraints = out / "constraints.txt"
        constraints.write_text(f"setuptools=={setuptools}\n")
        env["PIP_CONSTRAINT"] = str(constraints)  # read by the isolated build env's pip
    _run(sys.executable, "-m", "build", "--outdir", out, ROOT, env=env)
    sdists, wheels = sorted(out.glob("*.tar.gz")), sorted(out.glob("*.whl"))
    assert len(sdists) == len(wheels) == 1, sorted(out.iterdir())
    with zipfile.ZipFile(wheels[0]) as archive:
        generator = next(archive.read(n).decode() for n in archive.namelist()
                         if n.endswith(".dist-info/WHEEL"))
    used = re.search(r"^Generator: setuptools \(([^)]+)\)$", generator, re.MULTILINE).group(1)
    assert setuptools is None or used == setuptools, generator
    _BUILDS[setuptools] = sdists[0], wheels[0], used
    return _BUILDS[setuptools]


@pytest.fixture(scope="module", params=SETUPTOOLS, ids=lambda v: f"setuptools-{v or 'newest'}")
def dist(request, tmp_path_factory):
    if not PACKAGING:
        pytest.skip("builds the package: `tox -e packaging` (KERAS_ATTN_PACKAGING=1)")
    sdist, wheel, used = _build(request.param, tmp_path_factory.mktemp("dist"))
    print(f"built with setuptools {used}: {sdist.name}, {wheel.name}")
    return sdist, wheel


@pytest.fixture(scope="module")
def newest_wheel(tmp_path_factory):
    if not PACKAGING:
        pytest.skip("builds the package: `tox -e packaging` (KERAS_ATTN_PACKAGING=1)")
    return _build(None, tmp_path_factory.mktemp("dist"))[1]


@needs_packaging
def test_twine_check_accepts_the_sdist_and_the_wheel(dist):
    done = _run(sys.executable, "-m", "twine", "check", "--strict", *dist)
    assert done.stdout.count("PASSED") == 2, done.stdout
    print(done.stdout)


@needs_packaging
def test_the_wheel_holds_the_package_the_front_door_and_the_metadata(dist):
    _, wheel = dist
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        metadata = email.message_from_bytes(archive.read(f"{info}/METADATA"))
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
    assert "keras_attn/cli.py" in names and "keras_attn/py.typed" in names
    assert "keras_attn_cli.py" not in names  # the front door is inside the package
    assert "keras_attn/__init__.py" in names and "keras_attn/parity/cases.py" in names
    assert f"{info}/licenses/LICENSE" in names
    assert not [n for n in names if n.startswith(("tests/", "tools/", "benchmarks/"))]
    assert "keras-attn = keras_attn.cli:main" in entry_points
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata["License-File"] == "LICENSE"
    requires = metadata.get_all("Requires-Dist")
    assert "keras>=3.9" in requires and "numpy>=1.26" in requires
    assert 'jax>=0.4.30; extra == "jax"' in requires
    assert 'matplotlib>=3.8; extra == "notebooks"' in requires
    assert "Typing :: Typed" in metadata.get_all("Classifier")


@needs_packaging
def test_the_sdist_holds_the_license_changelog_and_tests(dist):
    import tarfile

    sdist, _ = dist
    with tarfile.open(sdist) as archive:
        names = {n.split("/", 1)[1] for n in archive.getnames() if "/" in n}
    for name in ("LICENSE", "README.md", "CHANGELOG.md", "CONTRIBUTING.md", "pyproject.toml",
                 "tox.ini", "keras_attn/cli.py", "keras_attn/py.typed", "tests/conftest.py",
                 "tests/assets/saved_by_0_1_0.keras"):
        assert name in names, name


@needs_packaging
def test_the_wheel_installs_in_a_fresh_venv_and_starts_without_a_backend(newest_wheel, tmp_path):
    """`pip install keras_attn-….whl[jax]` alone, KERAS_BACKEND unset (Keras would then
    load TensorFlow, which is absent): --help, --version, info and parity --help work,
    a command that needs a backend says which variable to set, and with
    KERAS_BACKEND=jax the package imports and runs."""
    wheel = newest_wheel
    home = tmp_path / "venv"
    venv.create(home, with_pip=True)
    bin_dir = home / ("Scripts" if os.name == "nt" else "bin")
    python, command = bin_dir / "python", bin_dir / "keras-attn"
    _run(python, "-m", "pip", "install", "--quiet", f"{wheel}[jax]")
    env = {k: v for k, v in os.environ.items()
           if k not in ("KERAS_BACKEND", "TF_CPP_MIN_LOG_LEVEL", "PYTHONPATH")}
    env["KERAS_HOME"] = str(tmp_path)  # no keras.json: Keras's default, tensorflow
    run = tmp_path / "run"
    run.mkdir()  # not the checkout, whose keras_attn would shadow the installed one
    assert _run(python, "-c", "import importlib.util as u; print(u.find_spec('tensorflow'))",
                env=env, cwd=run).stdout.strip() == "None"
    version = _run(command, "--version", env=env, cwd=run).stdout.strip()
    assert re.fullmatch(r"keras-attn \d+\.\d+\.\d+", version), version
    assert "info" in _run(command, "--help", env=env, cwd=run).stdout
    info = _run(command, "info", env=env, cwd=run).stdout
    assert str(home) in info and "devices: cpu" in info, info
    assert "mha_gqa_rope" in _run(command, "parity", "--help", env=env, cwd=run).stdout
    refused = subprocess.run([command, "example"], capture_output=True, text=True, env=env,
                             cwd=run, timeout=300)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "KERAS_BACKEND=jax" in refused.stderr
    env["KERAS_BACKEND"] = "jax"
    assert "logits" in _run(command, "example", env=env, cwd=run).stdout
    imported = _run(python, "-c", "import keras_attn, keras; "
                    "layer = keras_attn.MultiHeadAttention(2, key_dim=4); "
                    "x = keras.ops.ones((1, 3, 8)); print(keras_attn.__file__, "
                    "tuple(layer(x, x).shape))", env=env, cwd=run).stdout
    assert str(home) in imported and "(1, 3, 8)" in imported, imported
    print(version, info, sep="\n")
