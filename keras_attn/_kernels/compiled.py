"""Eager calls compiled once per shape and settings, where the backend compiles (JAX).

Eager JAX compiles every op of a call once per new shape: about 1.4 s for an explicit
attention call of B=2, H=4, T=9 on 2 cores, against 0.3 s for the same call compiled as
one program (fused: 1.7 s against 0.4-0.6 s). The blockwise kernel's loop bodies are
closures made per call, so eager JAX also traced and compiled every loop again at each
call, about 1 s at a shape already seen (B=2, H=4, T=64, block 16: 1.48, 0.89, 0.99,
1.15 s for four calls). The backend boundary registers a compiler (`jax.jit` for
concrete inputs, None elsewhere: the "eager_compiler" hook, `keras_attn._hooks`), and each
function and set of static settings keeps one compiled call. Under an outer trace the
compiled function is inlined as before.
"""

import functools

from keras_attn import _hooks

__all__ = ["compiled", "set_eager_compiler"]

_CACHE: dict = {}


def set_eager_compiler(compiler):
    """Register `compiler(fn) -> fn or None` (None: compile nothing)."""
    _hooks.set("eager_compiler", compiler)
    _CACHE.clear()


def _frozen(value):
    # A frozen dataclass (a `KernelSpec`) is hashable by its fields; its seed must be too.
    params = getattr(value, "__dataclass_params__", None)
    if params is None or not params.frozen:
        return False
    try:
        hash(value)
    except TypeError:
        return False
    return True


def compiled(fn, settings, depends=(), **fixed):
    """`fn` with `settings` and `fixed` bound, compiled; None where nothing compiles.

    `settings` must be None, bools, numbers, strings or frozen dataclasses (a
    `KernelSpec`; otherwise None: the caller runs `fn` itself). `depends`: other
    functions the compiled program calls, part of the key so that a replaced one (a
    test's spy) is not answered by a program traced before it.
    """
    compiler = _hooks.get("eager_compiler")
    if compiler is None:
        return None
    if not all(v is None or isinstance(v, (bool, int, float, str)) or _frozen(v)
               for v in settings.values()):
        return None
    key = (fn, tuple(sorted(settings.items())), tuple(sorted(fixed.items())), *depends)
    if key not in _CACHE:  # None too: a backend that compiles nothing eagerly
        if len(_CACHE) >= 256:
            _CACHE.clear()
        _CACHE[key] = compiler(functools.partial(fn, **fixed, **settings))
    return _CACHE[key]
