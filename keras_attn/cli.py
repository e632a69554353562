"""The `keras-attn` command: it starts without Keras or a backend.

`import keras` imports its backend at once: with `KERAS_BACKEND` unset it falls
back to TensorFlow, and crashes where TensorFlow is not installed. The package's
face is lazy (`keras_attn/__init__.py` imports nothing until a name is used), so
this module, inside the package, imports only the standard library: it answers
`--help`, `--version` and `info` itself; `info` reads versions from the installed
distributions' metadata and asks each installed backend for its devices in a
subprocess. Every other command needs a backend: this module checks that the one
Keras would load is installed (or says in one line which variable to set), then
imports the command's module and runs it (`run_command`).

Each subcommand lives in its own module, which provides `add_arguments(parser)`
and `run(args) -> int`; register it in `COMMANDS`. Only the module of the command
that runs is imported.

It also sets `TF_CPP_MIN_LOG_LEVEL=3` when it is unset, before anything imports
Keras and for every process it starts, which hides TensorFlow's C++ start-up
logs (CPU feature notices, and the error-level "failed call to cuInit" of a
CUDA build on a machine without a GPU); Python errors are unaffected. Some
logs ignore that variable: Abseil writes whatever is logged before
`absl::InitializeLog()` to stderr (TensorFlow 2.21's "oneDNN custom operations
are on" on CPUs where oneDNN is on; abseil/abseil-cpp#1957), so while it
imports Keras this module also drops Abseil-format lines from stderr.

`python -m keras_attn` is the same command. (Until issue 32 the front door was a
top-level module, `keras_attn_cli`, because the package's `__init__` imported Keras.)
"""

import argparse
import contextlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

__all__ = ["BACKENDS", "COMMANDS", "REQUIRES", "effective_backend", "installed_backends",
           "main", "quiet_environment", "run_command", "version"]

# The backends keras_attn runs on, in Keras's names.
BACKENDS = ("tensorflow", "jax", "torch", "numpy")
# Keras's NumPy backend imports jax and scipy (keras declares neither): without
# them it cannot start, so numpy counts as installed only when both are there.
REQUIRES = {"tensorflow": ("tensorflow",), "jax": ("jax",), "torch": ("torch",),
            "numpy": ("jax", "scipy")}
# Which installed backend a process that needs one, but none in particular,
# loads (the parity orchestrator, a subcommand's --help): quick imports first.
_PREFERRED = ("jax", "torch", "numpy", "tensorflow")

# name -> (module, one-line help). Every command but `info` needs a backend; its
# module provides `add_arguments(parser)` and `run(args) -> int` (`run_command`).
COMMANDS = {
    "info": (None, "print the versions of keras-attn, Keras and each installed backend, "
                   "and the devices each backend sees (for a bug report); needs no backend"),
    "example": ("keras_attn.example", "build a small model from these layers and print its output"),
    "parity": ("keras_attn.parity.cli",
               "run the same cases on every backend and compare them with each other "
               "and with the float64 reference"),
    "demo": ("keras_attn.demo", "train an encoder-decoder Transformer to reverse digit "
                                 "sequences (or, with --task add, a decoder-only one to add)"),
    "generate": ("keras_attn.generate_command",
                 "continue a prompt with a Hugging Face checkpoint folder's model and "
                 "tokenizer, streaming the text as it comes"),
}

# Environment defaults for this process (before Keras is imported) and the
# processes it starts; a value the user set is kept.
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "3"}

PROBE_TIMEOUT_S = 180


def quiet_environment(environ=None):
    """Set the `QUIET` defaults in `environ` (default `os.environ`) where unset."""
    environ = os.environ if environ is None else environ
    for name, value in QUIET.items():
        environ.setdefault(name, value)
    return environ


def _spec(name):
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a broken package, or a module set to None
        return None


def installed_backends():
    """The backends whose packages are importable (numpy needs jax and scipy).

    Found with `importlib.util.find_spec`, which imports nothing.
    """
    return [b for b in BACKENDS if all(_spec(m) is not None for m in REQUIRES[b])]


def _keras_config_path():
    # Where Keras looks for keras.json (keras/src/backend/config.py).
    if "KERAS_HOME" in os.environ:
        return os.path.join(os.environ["KERAS_HOME"], "keras.json")
    base = os.path.expanduser("~")
    if not os.access(base, os.W_OK):
        base = "/tmp"
    return os.path.join(base, ".keras", "keras.json")


def effective_backend():
    """`(backend, where)`: the backend Keras would load, and where that choice comes
    from ("KERAS_BACKEND", a keras.json path, or "Keras's default"), as Keras
    decides it, without importing it."""
    value = os.environ.get("KERAS_BACKEND")
    if value:
        return value, "KERAS_BACKEND"
    path = _keras_config_path()
    try:
        with open(path) as f:
            backend = json.load(f).get("backend")
        if isinstance(backend, str) and backend:
            return backend, path
    except (OSError, ValueError, AttributeError):
        pass
    return "tensorflow", "Keras's default"


def _package_dir():
    spec = _spec("keras_attn")
    return os.path.dirname(spec.origin) if spec is not None and spec.origin else None


def version():
    """keras_attn's `__version__`, read from the source without importing the package
    (the distribution's metadata if the source cannot be read)."""
    directory = _package_dir()
    if directory is not None:
        try:
            with open(os.path.join(directory, "__init__.py")) as f:
                match = re.search(r'^__version__ = "([^"]+)"', f.read(), re.MULTILINE)
            if match:
                return match.group(1)
        except OSError:
            pass
    return _dist_version("keras-attn") or "unknown"


def _dist_version(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _parser():
    parser = argparse.ArgumentParser(
        prog="keras-attn",
        description="keras_attn: attention layers written once against keras.ops. "
        "The backend is chosen by the KERAS_BACKEND environment variable "
        "(jax, tensorflow, torch, or numpy for inference).",
        epilog="Every command but info needs a Keras backend; `keras-attn COMMAND --help` "
        "describes one. TensorFlow's C++ start-up logs are hidden "
        "(TF_CPP_MIN_LOG_LEVEL=3) unless TF_CPP_MIN_LOG_LEVEL is set.")
    parser.add_argument("--version", action="version", version=f"keras-attn {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                title="commands")
    for name, (_, help_text) in COMMANDS.items():
        # Only the name is parsed here: a command's own parser reads the rest.
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv=None):
    """`keras-attn [--help | --version | COMMAND ...]`; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    quiet = "TF_CPP_MIN_LOG_LEVEL" not in os.environ  # the user's level is kept, and obeyed
    quiet_environment()
    args = _parser().parse_args(argv[:1])  # --help, --version, or which command
    name, rest = args.command, argv[1:]
    if name == "info":
        return _info(rest)
    problem = _choose_backend(name, rest)
    if problem:
        print(f"keras-attn: {problem}", file=sys.stderr)
        return 2
    return run_command(name, rest, quiet=quiet)


# Whether `run_command` drops Abseil's start-up lines (the front door's `quiet`), which
# `set_random_seed` reads.
_quiet = False


def set_random_seed(seed):
    """`keras.utils.set_random_seed(seed)` for the commands, quiet as the front door is.

    Keras seeds TensorFlow too whenever it is installed, importing it on every backend:
    under JAX or PyTorch that printed TensorFlow's Abseil start-up lines (issue 38).
    """
    keras = importlib.import_module("keras")
    with _without_native_start_up_logs() if _quiet else contextlib.nullcontext():
        keras.utils.set_random_seed(seed)


def run_command(name, argv, quiet=False):
    """Parse `argv` with the command's own parser and run it; returns the exit status.

    Importing the command's module imports Keras (with the backend `main` checked);
    `quiet`: drop Abseil's start-up lines from stderr meanwhile.
    """
    global _quiet
    _quiet = quiet
    module_name, help_text = COMMANDS[name]
    if module_name is None:
        raise ValueError(f"`keras-attn {name}` runs in `main`, not here. Received: name={name!r}")
    with _without_native_start_up_logs() if quiet else contextlib.nullcontext():
        module = importlib.import_module(module_name)
        # The rest of what a command runs imports here too, while Abseil's start-up lines
        # are caught: the layers, and the backend boundary behind the library's hooks
        # (TensorFlow logs again when `keras_attn._device` first touches it).
        importlib.import_module("keras_attn").register()
        importlib.import_module("keras_attn._hooks").get("execution_mode")
    parser = argparse.ArgumentParser(prog=f"keras-attn {name}", description=help_text)
    module.add_arguments(parser)
    return module.run(parser.parse_args(argv))


# "I0000 00:00:1796161905.250845    3114 port.cc:153] ...": Abseil's log-line format.
_NATIVE_LOG = re.compile(r"^(WARNING: All log messages before absl::InitializeLog\(\)"
                         r"|[IWE]\d{4} \d\d:\d\d:[\d.]+ +\d+ [\w.]+:\d+\] )")


@contextlib.contextmanager
def _without_native_start_up_logs():
    """While inside, stderr (file descriptor 2, which C++ writes to) goes to a temporary
    file; then every line of it but Abseil's log lines comes back to stderr."""
    sys.stderr.flush()
    with tempfile.TemporaryFile("w+", errors="replace") as caught:
        saved = os.dup(2)
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            kept = [line for line in caught if not _NATIVE_LOG.match(line)]
            sys.stderr.write("".join(kept))


# --- the backend check of the commands that need one ----------------------------------


def _choose_backend(name, argv):
    """None when the command can start; otherwise the one-line reason it cannot,
    naming the variable to set. A subcommand's --help (which does not depend on the
    backend) and the parity orchestrator (whose workers set their own) load any
    installed backend when KERAS_BACKEND is unset and Keras's choice is not
    installed."""
    backend, where = effective_backend()
    installed = installed_backends()
    if backend in installed:
        return None
    wants_help = any(a in ("-h", "--help") for a in argv)
    if installed and (wants_help or (name == "parity" and where != "KERAS_BACKEND")):
        os.environ["KERAS_BACKEND"] = next(b for b in _PREFERRED if b in installed)
        return None
    example = installed[0] if installed else "jax"
    fix = (f"set KERAS_BACKEND to an installed one, e.g. "
           f"`KERAS_BACKEND={example} keras-attn {name}` (installed: {', '.join(installed)})"
           if installed else
           f"none is installed: `pip install \"keras-attn[jax]\"` (or [tensorflow], [torch]), "
           f"then `KERAS_BACKEND=jax keras-attn {name}`")
    if backend not in BACKENDS:
        what = (f"KERAS_BACKEND={backend} is not one of keras-attn's backends "
                f"({', '.join(BACKENDS)})" if where == "KERAS_BACKEND" else
                f"{where} chooses the backend {backend!r}, which is not one of keras-attn's "
                f"({', '.join(BACKENDS)})")
    elif where == "KERAS_BACKEND":
        what = f"KERAS_BACKEND={backend}, but {_missing(backend)} not installed"
    elif where == "Keras's default":
        what = (f"KERAS_BACKEND is unset, so Keras would load its default, {backend}, "
                f"but {_missing(backend)} not installed")
    else:
        what = (f"KERAS_BACKEND is unset and {where} chooses {backend}, "
                f"but {_missing(backend)} not installed")
    return f"`keras-attn {name}` needs a Keras backend: {what}; {fix}."


def _missing(backend):
    names = [m for m in REQUIRES[backend] if _spec(m) is None]
    return " and ".join(names) + (" is" if len(names) == 1 else " are")


# --- `keras-attn info` ----------------------------------------------------------------


def _info_parser():
    parser = argparse.ArgumentParser(prog="keras-attn info", description=COMMANDS["info"][1])
    parser.add_argument("--json", action="store_true", help="print the same as JSON")
    parser.add_argument("--no-devices", action="store_true",
                        help="leave out the devices (they take a subprocess per backend: "
                        "each backend is imported, seconds for TensorFlow)")
    return parser


# Distributions that provide each backend module (the first one installed is shown).
_DISTRIBUTIONS = {"tensorflow": ("tensorflow", "tensorflow-cpu", "tensorflow-macos",
                                 "tensorflow-intel", "tf-nightly", "tf-nightly-cpu"),
                  "jax": ("jax",), "jaxlib": ("jaxlib",), "torch": ("torch",),
                  "scipy": ("scipy",), "numpy": ("numpy",), "keras": ("keras", "keras-nightly")}


def _module_version(module):
    """`(distribution, version)` of the installed distribution providing `module`."""
    try:
        candidates = importlib.metadata.packages_distributions().get(module, [])
    except Exception:  # pragma: no cover - a broken distribution's metadata
        candidates = []
    for name in list(candidates) + list(_DISTRIBUTIONS.get(module, (module,))):
        found = _dist_version(name)
        if found:
            return name, found
    return None, None


def _plugins(prefix):
    """Installed distributions whose names start with `prefix` (JAX's CUDA plugins)."""
    found = {}
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name.startswith(prefix):
            found[name] = dist.version
    return dict(sorted(found.items()))


def _probe_env(backend):
    env = quiet_environment(dict(os.environ, KERAS_BACKEND=backend))
    directory = _package_dir()
    if directory is not None:  # a source checkout imports the same keras_attn
        root = os.path.dirname(directory)
        env["PYTHONPATH"] = os.pathsep.join(
            [root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


_PROBE = "from keras_attn import _device; _device.print_devices()"


def _probe_devices(backends):
    """backend -> {"devices": [...], ...} or {"error": "..."}: each backend imported in
    its own subprocess (Keras and keras_attn on that backend), all at once."""
    started = {}
    for backend in backends:
        try:
            started[backend] = subprocess.Popen(
                [sys.executable, "-c", _PROBE], env=_probe_env(backend),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        except OSError as error:
            started[backend] = error
    deadline = time.monotonic() + PROBE_TIMEOUT_S
    results = {}
    for backend, process in started.items():
        if isinstance(process, OSError):
            results[backend] = {"error": f"could not start: {process}"}
            continue
        try:
            stdout, stderr = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            results[backend] = {"error": f"no answer within {PROBE_TIMEOUT_S} s"}
            continue
        lines = [x for x in stdout.splitlines() if x.startswith("{")]
        try:
            results[backend] = json.loads(lines[-1])
        except (IndexError, ValueError):
            last = [x for x in stderr.strip().splitlines() if x.strip()]
            results[backend] = {"error": (last[-1].strip() if last else
                                          f"exit status {process.returncode}, no output")}
    return results


def _collect(devices):
    backend, where = effective_backend()
    installed = installed_backends()
    report = {
        "keras_attn": {"version": version(), "location": _package_dir()},
        "python": {"version": platform.python_version(),
                   "implementation": platform.python_implementation(),
                   "executable": sys.executable},
        "platform": platform.platform(),
        "machine": platform.machine(),
        "keras": _module_version("keras")[1],
        "numpy": _module_version("numpy")[1],
        "KERAS_BACKEND": os.environ.get("KERAS_BACKEND"),
        "keras_backend": {"name": backend, "from": where, "installed": backend in installed},
        "backends": {},
    }
    for name in BACKENDS:
        entry = {"installed": name in installed}
        if name == "numpy":
            entry["versions"] = {m: _module_version(m)[1] for m in ("jax", "scipy")}
            if name in installed:
                entry["devices"] = ["cpu (inference only)"]
        else:
            dist, found = _module_version(name)
            entry["versions"] = {dist or name: found}
            if name == "jax":
                entry["versions"]["jaxlib"] = _module_version("jaxlib")[1]
                entry["versions"].update(_plugins("jax-cuda"))
        report["backends"][name] = entry
    if devices:
        probed = _probe_devices([b for b in BACKENDS if b in installed and b != "numpy"])
        for name, result in probed.items():
            entry = report["backends"][name]
            if "error" in result:
                entry["error"] = result["error"]
            else:
                entry["devices"] = result["devices"]
                entry["build"] = result.get("build")
    return report


def _format(report):
    ka, py = report["keras_attn"], report["python"]
    lines = [f"keras-attn     {ka['version']} ({ka['location'] or 'not found'})",
             f"python         {py['version']} ({py['implementation']}, {py['executable']})",
             f"platform       {report['platform']}",
             f"keras          {report['keras'] or 'not installed'}",
             f"numpy          {report['numpy'] or 'not installed'}"]
    chosen = report["keras_backend"]
    state = "installed" if chosen["installed"] else "NOT installed: set KERAS_BACKEND"
    source = ("from KERAS_BACKEND" if chosen["from"] == "KERAS_BACKEND" else
              f"KERAS_BACKEND unset, chosen by {chosen['from']}")
    lines.append(f"backend        {chosen['name']} ({source}; {state})")
    lines.append("backends:")
    for name, entry in report["backends"].items():
        versions = ", ".join(f"{k} {v}" for k, v in entry["versions"].items() if v)
        if not entry["installed"]:
            needs = "needs jax and scipy" if name == "numpy" else ""
            text = "not installed" + (f" ({needs}{'; ' + versions if versions else ''})"
                                      if needs else "")
        else:
            text = ("uses " if name == "numpy" else "") + versions
            if "error" in entry:
                text += f"; devices unknown: {entry['error']}"
            elif "devices" in entry:
                build = f" [{entry['build']}]" if entry.get("build") else ""
                text += f"{build}; devices: {', '.join(entry['devices'])}"
        lines.append(f"  {name:12s} {text}")
    return "\n".join(lines)


def _info(argv):
    args = _info_parser().parse_args(argv)
    report = _collect(devices=not args.no_devices)
    print(json.dumps(report, indent=2) if args.json else _format(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
