"""The path observer: which attention path ran, seen from a test or a benchmark.

`observe_paths()` yields a `collections.Counter`: inside it, every choice of
path that `keras_attn._policy.select_implementation` makes (at trace time
under a compiler) is counted. Outside, nothing is recorded.
"""

import collections
import contextlib
import contextvars

__all__ = ["observe_paths", "record_path"]

_OBSERVERS = contextvars.ContextVar("keras_attn_path_observers", default=())


@contextlib.contextmanager
def observe_paths():
    """Count the paths chosen while inside: yields a `collections.Counter`.

    Path name ("explicit", "fused", "blockwise", and "cached" for a call
    over a key/value cache; "grouped" for a fused call that read grouped key/value
    heads without repeating them, PyTorch's `enable_gqa`; "streamed" for a
    `generate` with a streamer) -> the
    number of times it was chosen, at trace time under a compiler. Observers
    nest (each counts what happens inside it) and are scoped to the current
    context (thread, task).
    """
    counter = collections.Counter()
    token = _OBSERVERS.set(_OBSERVERS.get() + (counter,))
    try:
        yield counter
    finally:
        _OBSERVERS.reset(token)


def record_path(path):
    """Count `path` in every active observer (none by default); returns `path`."""
    for counter in _OBSERVERS.get():
        counter[path] += 1
    return path
