"""Named hooks: how the library reaches the backend boundary without importing it.

The layers, the policy and the kernels are written against `keras.ops` only; the
things they need that are backend code live in `keras_attn._device`, among them:

- `"execution_mode"`: how TensorFlow runs the code being traced ("eager", "graph",
  "xla"; None elsewhere), read by the `implementation="auto"` policy;
- `"eager_compiler"`: `compiler(fn) -> fn or None`, which compiles eager calls once per
  shape and settings (`jax.jit` on JAX; `keras_attn._kernels.compiled`);
- `"trace_step"`: `trace(fn, variables) -> step or None`, the traced decoding step of
  `CausalLM.generate` on PyTorch;
- `"predict_on_one_replica"`: `predict(loop, inputs) -> outputs or None`, `generate`'s
  kept loop run once under a `tf.distribute` strategy (None: `predict_on_batch`);
- `"grouped_matmul"`: `matmul(x, weights, ends) -> out or None`, rows sorted by group
  times their group's weights (`MixtureOfExperts`' sparse path on PyTorch).
- `"owned_cache"`: `own(kv_cache) -> cache or None`, the cache `CausalLM.generate`
  makes for a block: zeros of the same sizes, written in place (PyTorch).

`_device` registers each where it defines it (`@provide("name")`); `get(name)`
imports `_device` the first time any hook is looked up (when a layer first runs, so
`import keras_attn` itself imports no backend). `set(name, fn)` replaces one (a
test's spy, a user's own compiler); `set(name, None)` turns it off.
"""

import importlib

__all__ = ["get", "provide", "set"]

PROVIDER = "keras_attn._device"
_HOOKS: dict = {}
_loaded = False


def provide(name):
    """Decorator: register the decorated function as hook `name` (where it is defined)."""
    def register(fn):
        _HOOKS.setdefault(name, fn)  # a hook set before the provider loaded is kept
        return fn
    return register


def get(name):
    """The hook `name`, or None; the first lookup imports the provider."""
    global _loaded
    if not _loaded:
        _loaded = True
        importlib.import_module(PROVIDER)
    return _HOOKS.get(name)


def set(name, fn):  # noqa: A001  (the verb the setters of the hooked modules use)
    """Use `fn` as hook `name` from now on (None: no hook)."""
    get(name)  # load the provider first, so that it does not override `fn` later
    _HOOKS[name] = fn
