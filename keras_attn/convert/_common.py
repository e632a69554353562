"""What the three sources share: reading arrays, checking state dicts and arguments, assigning weights.

Every converter checks everything first and assigns last: the readers below
raise a `ValueError` naming the entry and what was received, and `assign`
checks every shape of a plan before it assigns any variable.
"""

import mmap
import re
from collections.abc import Mapping

import keras
import numpy as np

__all__ = ["MHA_DERIVED", "StateDict", "assign", "check_kwargs", "check_num_heads", "cross_check",
           "deferred_variables", "dense_plan", "mha_plan", "norm_plan", "shape_text", "to_numpy"]

# Arguments of keras_attn.MultiHeadAttention the converters derive from the weights;
# passing them in **kwargs is an error.
MHA_DERIVED = ("num_heads", "key_dim", "value_dim", "output_dim", "use_bias")


def to_numpy(value, what):
    """`value` as a numpy array: `numpy.asarray`, else `.detach().cpu().numpy()`."""
    try:
        array = np.asarray(value)
    except (TypeError, ValueError, RuntimeError):  # e.g. a torch tensor that requires grad
        array = None
    if array is None or array.dtype == object:
        detach = getattr(value, "detach", None)
        if detach is None:
            raise ValueError(
                f"{what} could not be read as a numpy array. "
                f"Received: an object of type {type(value).__name__}")
        tensor = detach().cpu()
        try:
            array = np.asarray(tensor.numpy())
        except TypeError:  # a dtype numpy lacks (torch.bfloat16): read it as float32
            array = np.asarray(tensor.float().numpy())
    return array


def shape_text(shape):
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


class StateDict:
    """The entries of a state dict under `prefix`, read once and checked by name."""

    def __init__(self, state_dict, prefix):
        if not isinstance(state_dict, Mapping) and callable(getattr(state_dict, "state_dict", None)):
            state_dict = state_dict.state_dict()  # a torch module: read its state dict
        if not isinstance(state_dict, Mapping):
            raise ValueError(
                "`state_dict` must be a mapping from names to arrays (for example "
                f"`module.state_dict()`). Received: state_dict of type {type(state_dict).__name__}")
        if not isinstance(prefix, str):
            raise ValueError(f"`prefix` must be a string. Received: prefix={prefix!r}")
        if prefix and not prefix.endswith("."):
            prefix += "."
        self.prefix = prefix
        self._keys = [key for key in state_dict if isinstance(key, str)]
        self._raw = {key[len(prefix):]: value for key, value in state_dict.items()
                     if isinstance(key, str) and key.startswith(prefix)}
        self._arrays = {}
        self._used = set()

    def key(self, name):
        return repr(self.prefix + name)

    def has(self, name):
        return name in self._raw

    def received(self):
        names = sorted(self.prefix + name for name in self._raw)
        shown = ", ".join(repr(n) for n in names[:12])
        more = f", ... ({len(names)} in all)" if len(names) > 12 else ""
        return f"Received keys: [{shown}{more}]"

    def prefixes_of(self, names):
        """The prefixes other than `prefix` under which every one of `names` is a key
        of the whole state dict, in natural order ('layers.2.' before 'layers.10.')."""
        found = None
        for name in names:
            here = {key[:-len(name)] for key in self._keys
                    if key.endswith(name) and (key == name or key[-len(name) - 1] == ".")}
            found = here if found is None else found & here
        found = (found or set()) - {self.prefix}
        return sorted(found, key=lambda p: [int(t) if t.isdigit() else t
                                            for t in re.split(r"(\d+)", p)])

    def _where(self, missing):
        """What the state dict holds instead: the prefixes the missing names are found
        under and the `prefix=` to pass, else the keys received."""
        if not self._keys:
            return "Received: an empty state dict."
        lines = []
        if self.prefix and not self._raw:
            starts = sorted({key.split(".")[0] + ("." if "." in key else "") for key in self._keys})
            lines.append(f"No key of state_dict starts with prefix={self.prefix!r} (its "
                         f"{len(self._keys)} keys start with "
                         f"{', '.join(repr(p) for p in starts[:8])}"
                         f"{', ...' if len(starts) > 8 else ''}).")
        prefixes = self.prefixes_of(missing)
        # The likeliest: the received prefix with a leading part removed or added
        # ('model.layers.1.' for a LlamaModel's 'layers.1.', or the other way).
        likely = [p for p in prefixes if self.prefix.endswith(p) or p.endswith(self.prefix)]
        if prefixes:
            what = (repr(missing[0]) if len(missing) == 1 else
                    f"{missing[0]!r} and the other {len(missing) - 1} missing entries")
            shown = ", ".join(repr(p) for p in prefixes[:6])
            more = f", ... ({len(prefixes)} in all)" if len(prefixes) > 6 else ""
            lines.append(f"{what} {'is' if len(missing) == 1 else 'are'} found under "
                         f"{'the prefix' if len(prefixes) == 1 else 'the prefixes'} "
                         f"{shown}{more}: pass the one you mean as `prefix`, for example "
                         f"prefix={(likely or prefixes)[0]!r} (received prefix={self.prefix!r}).")
        elif self._raw or not self.prefix:
            lines.append(self.received())
        return " ".join(lines)

    def require(self, *names, hint=""):
        missing = [name for name in names if name not in self._raw]
        if missing:
            raise ValueError(
                f"state_dict is missing {', '.join(self.key(n) for n in missing)}{hint}. "
                + self._where(missing))

    def get(self, name):
        self.require(name)
        if name not in self._arrays:
            self._arrays[name] = to_numpy(self._raw[name], f"state_dict entry {self.key(name)}")
        self._used.add(name)
        return self._arrays[name]

    def shaped(self, name, letters, shape):
        """The entry `name`, which must have `shape` (written `letters` in the message)."""
        array = self.get(name)
        if array.shape != tuple(shape):
            raise ValueError(
                f"state_dict entry {self.key(name)} must have shape {letters} = "
                f"{shape_text(shape)}. Received: shape {shape_text(array.shape)}")
        return array

    def rank(self, name, rank, letters):
        array = self.get(name)
        if array.ndim != rank:
            raise ValueError(
                f"state_dict entry {self.key(name)} must have shape {letters}. "
                f"Received: shape {shape_text(array.shape)}")
        return array

    def check_all_used(self):
        extra = sorted(set(self._raw) - self._used)
        if extra:
            raise ValueError(
                "state_dict has unexpected entries "
                f"{', '.join(self.key(n) for n in extra)}, which the converted layer has no "
                "weights for (an unsupported option of the source module, or the wrong `prefix`).")


def cross_check(entries, name, shape, expected, fields):
    """Entry `name` of `entries` (a `StateDict`) with `shape`, else a `ValueError` naming it,
    both shapes and the config `fields` they come from (`expected`: its letters, "(V, D)")."""
    array = entries.rank(name, len(shape), expected)
    if array.shape != tuple(shape):
        raise ValueError(
            f"The config and the weights disagree: {fields} give {expected} = "
            f"{shape_text(shape)} for state_dict entry {entries.key(name)}, which has "
            f"shape {shape_text(array.shape)}.")
    return array


def check_kwargs(kwargs, derived, source):
    clash = [name for name in derived if name in kwargs]
    if clash:
        raise ValueError(
            f"{', '.join(f'`{n}`' for n in clash)} cannot be passed here: it is read from the "
            f"{source}. Received: " + ", ".join(f"{n}={kwargs[n]!r}" for n in clash))


def assign(plan):
    """Check every `(variable, array, what)` shape, then assign them all.

    Variables made under `deferred_variables()` (not initialised yet) take their array as
    their first value, one at a time; the rest of that scope's variables (none of the plan's:
    RNG seeds, buffers) are then initialised as Keras would have. Other variables are
    assigned."""
    for variable, array, what in plan:
        if tuple(variable.shape) != tuple(array.shape):
            raise ValueError(
                f"{what} has shape {shape_text(array.shape)} but the layer's variable "
                f"'{variable.path}' has shape {shape_text(tuple(variable.shape))}.")
    deferred = False
    for variable, array, _ in plan:
        if _uninitialised(variable):
            variable._initializer = _loader(array)  # read by Keras's deferred initialisation
            deferred = True
        else:
            variable.assign(keras.ops.cast(array, variable.dtype))
            _release_mapped_pages(array)
    if deferred:
        _initialise_deferred()


def _uninitialised(variable):
    return getattr(variable, "_value", False) is None and hasattr(variable, "_initializer")


def _loader(array):
    """A Keras initializer that gives `array` (cast), then drops the file pages it came from."""
    def initializer(shape, dtype=None):
        # A C-ordered copy of its own: a backend may keep a numpy array's memory and strides
        # (PyTorch's `as_tensor`), and a variable must neither alias the checkpoint's file
        # pages nor keep a transposed view's strides (its matmuls would round otherwise).
        value = keras.ops.cast(np.array(array, order="C", copy=True), dtype)
        _release_mapped_pages(array)
        return value
    return initializer


def _initialise_deferred():
    """Initialise every variable made under `deferred_variables()`: leaving a top-level
    `keras.StatelessScope` runs Keras's deferred initialisation (each variable's initializer,
    in the order they were made)."""
    with keras.StatelessScope():
        pass


class deferred_variables:
    """A scope in which the variables a converter builds are made without a value.

    A converter builds the model (Keras would initialise every variable, randomly) and then
    assigns the checkpoint: the random values and the checkpoint's coexist, and freed
    buffers are not all handed back to the system. Loading a 0.92 GiB float32 checkpoint
    folder peaked at 1.9x its size on JAX and 1.5x on PyTorch (benchmarks/loading.py; the
    JAX allocator kept the replaced buffers). Under this scope (Keras's
    `StatelessScope(initialize_variables=False)`, the mechanism Keras uses to make a model
    without allocating it) the variables wait; `assign` gives each its checkpoint array as
    its first value. Where a distribution is set (a variable's layout shards it at
    initialisation, in a compiled initializer that would embed the array) or a Keras
    release lacks the mechanism, nothing is deferred and the variables are assigned as
    before. Inside a caller's own stateless scope the variables are initialised when that
    scope ends, as Keras does. On an error the scope initialises what it deferred (Keras's
    own initializers), so no half-made variable is left behind.
    """

    def __enter__(self):
        self._scope = None
        if keras.distribution.distribution() is None:
            try:
                self._scope = keras.StatelessScope(initialize_variables=False)
            except TypeError:  # a Keras without the argument: no deferral
                return self
            self._scope.__enter__()
        return self

    def __exit__(self, kind, error, traceback):
        if self._scope is not None:
            self._scope.__exit__(kind, error, traceback)
            if kind is not None:
                _initialise_deferred()
        return False


def _release_mapped_pages(array):
    """Drop from this process's memory the file pages a memory-mapped `array` was read from.

    A checkpoint folder's tensors are `numpy.memmap` views (`convert.pretrained`); the pages
    read stay resident, and counted in the process's RSS, while the plan holds the maps, so
    loading a 0.92 GiB float32 checkpoint peaked at 2.58x its size (the mapped file beside the
    model's variables; benchmarks/loading.py). Once a variable holds its copy, the pages are
    advised away (`MADV_DONTNEED`: clean file pages, read again from the file if another
    entry of the same tensor needs them). Other arrays are left alone.
    """
    while isinstance(array, np.ndarray):
        if isinstance(array, np.memmap):
            mapped = getattr(array, "_mmap", None)
            if mapped is not None and hasattr(mapped, "madvise") and hasattr(
                    mmap, "MADV_DONTNEED"):
                try:
                    mapped.madvise(mmap.MADV_DONTNEED)
                except (OSError, ValueError):  # closed, or a platform that refuses it
                    pass
        array = array.base


def dense_plan(dense, kernel, bias, what):
    plan = [(dense.kernel, kernel, f"{what} kernel")]
    if bias is not None:
        plan.append((dense.bias, bias, f"{what} bias"))
    return plan


def norm_plan(norm, gamma, beta, what):
    return [(norm.gamma, gamma, f"{what} weight"), (norm.beta, beta, f"{what} bias")]


def mha_plan(layer, weights):
    """Assignments of `weights[part] = (kernel, bias)` (keras_attn layouts, bias maybe None)
    onto the query, key, value and output projections of a keras_attn MultiHeadAttention
    (no "value" for a layer with `attention_k_eq_v`, which has no `value_dense`)."""
    plan = []
    for part in ("query", "key", "value", "output"):
        if part not in weights:
            continue
        kernel, bias = weights[part]
        plan += dense_plan(getattr(layer, part + "_dense"), kernel, bias, part)
    return plan


def check_num_heads(num_heads):
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads <= 0:
        raise ValueError(f"`num_heads` must be a positive integer. Received: num_heads={num_heads!r}")
