"""A decoding step as one traced graph on PyTorch: Keras's dispatch paid once, not per token.

An eager PyTorch decoding step of a small model is overhead-bound: one step
of benchmarks/models.py's Llama (4 blocks, D=512) made about 52,000 Python
calls and 47 `Layer.__call__`s for about 3 ms of matrix work. `trace_step`
records the step once per input shape and replays the recorded aten
operations:

1. `torch.fx.experimental.proxy_tensor.make_fx` with fake tensors runs the
   Keras code once. Fake tensors have shapes but no values, so every value
   the code would read (`keras_attn._validation.concrete_value`, a cache
   index) is refused, exactly as under `jax.jit`: the cache index stays an
   input of the graph, never a constant baked into it. The weights are
   inputs too (through `keras.StatelessScope`), read afresh at every call,
   so a model trained after the trace decodes with its new weights.
2. `torch.jit.trace` of that graph (plain aten calls, no Python logic left to
   freeze) gives a TorchScript function, run by TorchScript's interpreter
   without Python per op.

Measured on that model (one CPU thread, one step at a 640-slot cache): eager
32.4 ms, the make_fx graph 15.0 ms, the TorchScript graph 8.6 ms; tracing
costs about 1.3 s per input shape. Each new graph is checked against the
eager step at the index it was traced at and at a second index, before it is
used; a graph that disagrees is dropped (a warning says so) and the step
runs eagerly.
"""

import warnings

import keras
import numpy as np

__all__ = ["TracedStep", "trace_step"]

# Max |graph - eager| / max |eager| accepted at the check (the graph runs the same aten
# kernels in the same order, so the difference measured is 0).
_TOLERANCE = 1e-5


def trace_step(fn, variables):
    """`fn(token_ids, cache, cache_update_index)` as a `TracedStep` on PyTorch, else None.

    `fn` must be a decoding step whose results depend only on its arguments
    and on `variables` (the weights it reads), as `CausalLM.next_token_logits`
    is. Call the result under `torch.no_grad()`: the graphs record no
    gradients.
    """
    if keras.backend.backend() != "torch":
        return None
    return TracedStep(fn, variables)


class TracedStep:
    """`fn` replayed from one TorchScript graph per shape of its tensor arguments.

    Calls whose arguments are not all tensors (a Python int index, say) run
    `fn` itself. Attributes, for tests and benchmarks: `graphs`, the graphs
    by input signature (None where a graph was refused); `graph_calls`, how
    many calls a graph answered.
    """

    def __init__(self, fn, variables):
        self.fn, self.variables = fn, list(variables)
        self.graphs = {}
        self.graph_calls = 0

    def follow(self, variables):
        """Use `variables` from now on; if they are not the same objects as before (a
        LoRA enabled, a model quantized: new weights and a new computation), drop every
        graph, so that none replays the old computation."""
        variables = list(variables)
        if len(variables) != len(self.variables) or any(
                a is not b for a, b in zip(variables, self.variables)):
            self.variables, self.graphs = variables, {}

    def __call__(self, token_ids, cache, cache_update_index):
        import torch

        # A list or tuple of caches (CausalLM's), else a single cache; a cache is a
        # tensor or a named tuple of tensors (`keras_attn.KVCache`). Plain Python here,
        # not keras.tree: this runs at every token (about 1 ms per call with
        # keras.tree's flatten and pack on a 4-block model).
        layout, flat = _flatten(cache)
        leaves = [token_ids, *flat, cache_update_index]
        if not all(isinstance(x, torch.Tensor) for x in leaves):
            return self.fn(token_ids, cache, cache_update_index)
        signature = (layout,) + tuple((tuple(x.shape), x.dtype, x.device) for x in leaves)
        if signature not in self.graphs:
            self.graphs[signature] = self._trace((token_ids, cache, cache_update_index),
                                                 layout, flat)
        graph = self.graphs[signature]
        if graph is None:
            return self.fn(token_ids, cache, cache_update_index)
        self.graph_calls += 1
        logits, new = graph(self._values(), token_ids, flat, cache_update_index)
        return logits, _unflatten(layout, new)

    def _values(self):
        return [v.value.detach() for v in self.variables]

    def _pure(self, values, token_ids, flat, index, layout):
        """The step on a flat list of cache tensors: `(logits, new cache tensors)`."""
        with keras.StatelessScope(state_mapping=list(zip(self.variables, values))):
            logits, new = self.fn(token_ids, _unflatten(layout, flat), index)
        return logits, _flatten(new)[1]

    def _trace(self, args, layout, flat):
        import torch
        from torch.fx.experimental.proxy_tensor import make_fx

        token_ids, cache, index = args

        def pure(values, token_ids, flat, index):
            return self._pure(values, token_ids, flat, index, layout)

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # TracerWarnings about the graph's constants
                with torch.no_grad():
                    graph = make_fx(pure, tracing_mode="fake")(
                        self._values(), token_ids, flat, index)
                    graph = torch.jit.trace(graph, (self._values(), token_ids, flat, index),
                                            strict=False, check_trace=False)
                _simplify(graph.graph)
        except Exception as error:  # a step that reads values (`int(index)`), say
            warnings.warn(
                f"The decoding step could not be traced ({type(error).__name__}: "
                f"{str(error).splitlines()[0] if str(error) else ''}); this shape decodes "
                "eagerly (slower, same tokens).", stacklevel=4)
            return None
        # The check: the first decoding index is >= 1 (after a prompt), so index - 1 is a
        # slot too; at a Python-int-like index a frozen graph would show here.
        # Each run on copies of the caches: a cache written in place (`OwnedKVCache`)
        # would otherwise keep the check's writes.
        other = index - 1 if int(index) > 0 else index + 1
        for at in (index, other):
            with torch.no_grad():
                copy = _unflatten(layout, [x.clone() for x in flat])
                expected = keras.tree.flatten(self.fn(token_ids, copy, at))
                got = keras.tree.flatten(graph(self._values(), token_ids,
                                               [x.clone() for x in flat], at))
            difference = max(_relative_error(a, b) for a, b in zip(expected, got, strict=True))
            if not difference <= _TOLERANCE:
                warnings.warn(
                    f"The traced decoding step disagrees with the eager one at "
                    f"cache_update_index={int(at)} (relative difference {difference:.1e}); "
                    "this shape decodes eagerly (slower, same tokens).", stacklevel=4)
                return None
        return graph


def _is_named(x):
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def _flatten(cache):
    """`(layout, tensors)`: a cache (a tensor, a named tuple of tensors, or a list/tuple
    of those) as a hashable description of its structure and its flat tensors."""
    many = isinstance(cache, list) or (isinstance(cache, tuple) and not _is_named(cache))
    caches = list(cache) if many else [cache]
    kinds = tuple(type(c) if _is_named(c) else None for c in caches)
    flat = [x for c, kind in zip(caches, kinds) for x in (c if kind else (c,))]
    return (type(cache) if many else None, kinds), flat


def _unflatten(layout, flat):
    """The cache of `layout` with the tensors `flat` (what `_flatten` gave)."""
    outer, kinds = layout
    caches, at = [], 0
    for kind in kinds:
        width = len(kind._fields) if kind else 1
        part = flat[at:at + width]
        caches.append(kind(*part) if kind else part[0])
        at += width
    return caches[0] if outer is None else outer(caches)


def _simplify(graph):
    """TorchScript's own clean-up passes, in place: the trace repeats what every block
    computes from the index alone (positions, masks), and keeps the constants' arithmetic.

    On the benchmark model: 3,312 nodes to 957, and 8.8 ms to 7.5 ms a step.
    """
    import torch

    for name in ("_jit_pass_inline", "_jit_pass_constant_propagation", "_jit_pass_cse",
                 "_jit_pass_dce", "_jit_pass_peephole"):
        getattr(torch._C, name)(graph)


def _relative_error(expected, got):
    expected, got = (np.asarray(x.detach().cpu().double().numpy()) for x in (expected, got))
    if expected.shape != got.shape:
        return float("inf")
    scale = max(float(np.max(np.abs(expected), initial=0.0)), 1e-30)
    return float(np.max(np.abs(expected - got), initial=0.0)) / scale
