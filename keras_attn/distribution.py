"""Layout maps for `keras.distribution`: tensor-parallel sharding of keras_attn weights.

`get_layout_map(device_mesh)` returns a `keras.distribution.LayoutMap` for
`keras.distribution.ModelParallel`. It is the usual (Megatron-style)
tensor-parallel plan, written for the weight names of every keras_attn layer:

- column-parallel (kernel `(in, out)` split on `out`, bias split with it):
  `query_dense`, `key_dense`, `value_dense` of `MultiHeadAttention`, and
  `intermediate_dense` (and a gated FFN's `gate_dense`) of
  `PositionwiseFeedForward`;
- row-parallel (kernel split on `in`, bias replicated, since it is added
  after the partial products are summed): the attention's and the FFN's
  `output_dense`;
- expert-parallel (split on the expert axis, axis 0): `MixtureOfExperts`'
  `gate_kernel`, `intermediate_kernel` `(E, D, F)` and `output_kernel` `(E, F, D)`,
  and with `use_expert_bias` (gpt-oss) their biases `gate_bias`, `intermediate_bias`
  `(E, F)` and `output_bias` `(E, D)`, each device holding E / M whole experts; its
  router (with its `router_bias`; and a shared expert's kernels, DeepSeek V3's router
  correction bias) is replicated. A layer whose
  `num_experts` is not divisible by M keeps its experts replicated;
- everything else is replicated: LayerNorms (`*_norm/gamma`, `*_norm/beta`),
  embeddings, and any weight the map does not name.

Key and value heads: `key_dense`/`value_dense` project to `H_kv * d`
(`H_kv = num_key_value_heads`, `H` for plain multi-head attention). When
`H_kv` is not divisible by the model-axis size M, splitting their columns
would either fail at variable creation (JAX needs every sharded dimension
to divide; keras-hub #1613) or cut heads across devices, so those two
projections are REPLICATED instead (a little more memory, no extra
communication: each device already has every query head it needs). By the
same rule a layer whose `H` (query and output projections) or whose
`intermediate_dim` (feed-forward) is not divisible by M keeps those
projections replicated rather than crash.

Which layer a weight belongs to is not in the regexes of a `LayoutMap`
(they see variable paths only), so the map returned here checks a rule
when Keras asks for a weight's layout, against the layer creating it (or
against `model`, see `get_layout_map`). When it cannot tell the owner it
replicates key/value weights, which is always safe.

Backends: Keras 3 implements `keras.distribution` on JAX only. On PyTorch
and NumPy it has no backend at all (`keras.distribution.list_devices()`
fails); on TensorFlow it is an unfinished prototype whose layouts are
ignored (variables stay unsharded without any message). `get_layout_map`
therefore raises a `RuntimeError` on any backend but JAX. Data parallelism
needs no layout map: on those backends it runs on their own engines
(DistributedDataParallel, tf.distribute.MirroredStrategy), as the guide
docs/guides/scaling-out.md shows and tests/test_data_parallel.py checks.

This module imports keras only (no backend, no NumPy arrays).
"""

import re

import keras

__all__ = ["COLUMN_PARALLEL", "EXPERT_PARALLEL", "EXPERT_PARALLEL_BIASES", "ROW_PARALLEL",
           "get_layout_map"]

# Sublayer names (public API, see DESIGN.md) and how their kernels split.
COLUMN_PARALLEL = ("query_dense", "key_dense", "value_dense", "intermediate_dense", "gate_dense")
ROW_PARALLEL = ("output_dense",)
# Weights of a mixture of experts stacked on their first axis, E (split across experts).
EXPERT_PARALLEL = ("gate_kernel", "intermediate_kernel", "output_kernel")
# Their per-expert biases (`use_expert_bias`, gpt-oss), `(E, width)`: split with them.
EXPERT_PARALLEL_BIASES = ("gate_bias", "intermediate_bias", "output_bias")
_KEY_VALUE = ("key_dense", "value_dense")

# A weight path is `outer/.../<sublayer>/<weight>` (Functional, Sequential and
# subclassed models alike, with any user layer names: docs/guides/scaling-out.md). The
# regexes must match whole variable paths only: LayoutMap is also asked for
# the layout of layer outputs (`.../output_dense/output`), and weights of
# optimizers (`adam/...`) and other layers must fall through to "replicated".
_PREFIX = r"(?:.*/)?"


def _path_regex(sublayers, weight):
    return _PREFIX + "(?:" + "|".join(map(re.escape, sublayers)) + ")/" + weight


def _key_value_heads(layer):
    return getattr(layer, "num_key_value_heads", None) or layer.num_heads


def _check_backend():
    backend = keras.backend.backend()
    if backend != "jax":
        raise RuntimeError(
            "keras_attn.distribution.get_layout_map needs the JAX backend: Keras "
            f"{keras.__version__} implements keras.distribution (DeviceMesh, LayoutMap, "
            "DataParallel, ModelParallel) on JAX only. On torch and numpy it has no "
            "implementation, and on tensorflow it is an unfinished prototype that "
            "ignores layouts (nothing would be sharded). Set KERAS_BACKEND=jax. Data "
            "parallelism needs no layout map: on torch use DistributedDataParallel, on "
            "tensorflow tf.distribute.MirroredStrategy (docs/guides/scaling-out.md). "
            f"Received: backend={backend!r}"
        )


def _check_axis(device_mesh, argument, axis):
    if axis not in device_mesh.axis_names:
        raise ValueError(
            f"`{argument}` must name an axis of the device mesh, whose axes are "
            f"{tuple(device_mesh.axis_names)}. Received: {argument}={axis!r}"
        )


def _required_divisor(owner, sublayer):
    """The count that must divide the model axis for `sublayer` of `owner` to split.

    Heads for attention projections (`num_key_value_heads` for keys and
    values), `intermediate_dim` for a feed-forward layer's projections; None
    when `owner` is not a layer this module knows.
    """
    if owner is None:
        return None
    if hasattr(owner, "num_heads") and sublayer in ("query_dense", "output_dense"):
        return owner.num_heads
    if hasattr(owner, "num_heads") and sublayer in _KEY_VALUE:
        return _key_value_heads(owner)
    if hasattr(owner, "intermediate_dim") and not hasattr(owner, "num_heads"):
        return owner.intermediate_dim
    return None


class _LayoutMap(keras.distribution.LayoutMap):
    """A `LayoutMap` whose rules look at the head count of the layer they shard.

    Exact paths (from `model`) win over the regexes, as in any LayoutMap.
    A path that a rule matches is checked against the layer that owns the
    sublayer whose weights Keras is creating: Keras builds every variable
    inside the name scopes of its layers, and those scopes record the layer
    (the same stack that makes `variable.path`). A sublayer whose split
    count (heads, key/value heads, `intermediate_dim`) does not divide the
    model axis is replicated; key/value weights with no layer to ask are
    replicated too (always safe).
    """

    def __init__(self, device_mesh, model_size, replicated):
        super().__init__(device_mesh)
        self._model_size = model_size
        self._replicated = replicated  # (sublayer kind, weight) -> replicated layout

    def layout_for(self, owner, sublayer, weight, default):
        """The layout of `owner`'s `sublayer/weight`, given the rule's `default`."""
        divisor = _required_divisor(owner, sublayer)
        kind = "row" if sublayer in ROW_PARALLEL else "column"
        if divisor is None:
            return self._replicated[kind, weight] if sublayer in _KEY_VALUE else default
        return default if divisor % self._model_size == 0 else self._replicated[kind, weight]

    def expert_layout_for(self, owner, default, weight="kernel"):
        """The layout of an expert `weight` ("kernel" or "bias") of `owner`: split if its
        `num_experts` divides the model axis, else (or when `owner` is not known)
        replicated."""
        experts = getattr(owner, "num_experts", None)
        if isinstance(experts, int) and experts % self._model_size == 0:
            return default
        return self._replicated["expert", weight]

    def __getitem__(self, key):
        if key in self._layout_map:
            return self._layout_map[key]
        layout = super().__getitem__(key)
        if layout is not None and _EXPERT_WEIGHT.fullmatch(key):
            return self.expert_layout_for(_layer_at(key.rsplit("/", 1)[0]), layout)
        if layout is not None and _EXPERT_BIAS.fullmatch(key):
            return self.expert_layout_for(_layer_at(key.rsplit("/", 1)[0]), layout, "bias")
        match = _WEIGHT.fullmatch(key)
        if layout is None or match is None:
            return layout
        return self.layout_for(_owner_being_built(key), match["sublayer"], match["weight"], layout)


_WEIGHT = re.compile(_PREFIX + "(?P<sublayer>" + "|".join(COLUMN_PARALLEL + ROW_PARALLEL)
                     + ")/(?P<weight>kernel|bias)")


_EXPERT_WEIGHT = re.compile(_PREFIX + "(?:" + "|".join(EXPERT_PARALLEL) + ")")
_EXPERT_BIAS = re.compile(_PREFIX + "(?:" + "|".join(EXPERT_PARALLEL_BIASES) + ")")


def _layer_at(path):
    """The layer at `path` among the layers on Keras's name-scope stack (and their
    sublayers), or None: the owner of a weight it creates itself (`add_weight`)."""
    try:
        from keras.src.backend.common import global_state

        stack = global_state.get_global_attribute("name_scope_stack") or []
    except Exception:  # pragma: no cover - a Keras without these internals
        return None
    for scope in reversed(stack):
        caller = getattr(scope, "caller", None)
        if not isinstance(caller, keras.layers.Layer):
            continue
        for layer in caller._flatten_layers(include_self=True, recursive=True):
            if layer.path == path:
                return layer
    return None


def _owner_being_built(path):
    """The layer that owns the sublayer whose weight `path` Keras is laying out, or None.

    Read from Keras's name-scope stack, which records the layers being
    built (the same stack that makes `variable.path`). When Keras creates
    the weight inside its layers' build, the stack ends with the sublayer
    (`.../key_dense`) and the owner just before it. When Keras defers
    initialization (a subclassed model's first call builds symbolically and
    lays out the variables afterwards), only outer layers are on the stack:
    the owner is then looked up among their sublayers by its path. The stack
    is internal to Keras; if it moves, this returns None and the map falls
    back to replicating key/value weights (safe, more memory). The tests
    check that a multi-head layer's key/value weights are in fact sharded
    in Functional and subclassed models, so such a change would show.
    """
    try:
        from keras.src.backend.common import global_state
        from keras.src.backend.common.name_scope import current_path

        stack = global_state.get_global_attribute("name_scope_stack") or []
        here = current_path()
    except Exception:  # pragma: no cover - a Keras without these internals
        return None
    sublayer_path = path.rsplit("/", 1)[0]
    if len(stack) >= 2 and here == sublayer_path:
        return getattr(stack[-2], "caller", None)
    owner_path = sublayer_path.rsplit("/", 1)[0] if "/" in sublayer_path else None
    for scope in stack:
        caller = getattr(scope, "caller", None)
        if owner_path is None or not isinstance(caller, keras.layers.Layer):
            continue
        for layer in caller._flatten_layers(include_self=True, recursive=True):
            if layer.path == owner_path:
                return layer
    return None


def _owned_sublayers(model):
    """`(owner, sublayer name, sublayer)` for every built sublayer a rule names."""
    for owner in model._flatten_layers(include_self=True, recursive=True):
        for name in COLUMN_PARALLEL + ROW_PARALLEL:
            sublayer = getattr(owner, name, None)
            if isinstance(sublayer, keras.layers.Layer) and sublayer.built:
                yield owner, name, sublayer


def get_layout_map(device_mesh: keras.distribution.DeviceMesh, model_axis: str = "model",
                   data_axis: str | None = None,
                   model: keras.Model | None = None) -> keras.distribution.LayoutMap:
    """A tensor-parallel `keras.distribution.LayoutMap` for keras_attn layers.

    Use it with `keras.distribution.ModelParallel`, then create the model
    inside the distribution's scope (Keras lays out each variable when it is
    created):

    ```python
    mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"))
    layout_map = keras_attn.distribution.get_layout_map(mesh)
    with keras.distribution.ModelParallel(layout_map=layout_map).scope():
        model = build_model()
        model.compile(...)
    model.fit(...)
    ```

    Weight paths: the rules match the sublayer names of keras_attn's layers
    as the last two components of a variable path, under any prefix:
    `.../query_dense/kernel`, `.../key_dense/bias`,
    `.../intermediate_dense/kernel`, `.../output_dense/kernel`, ... So they
    apply inside Functional, Sequential and subclassed models, nested
    layers and custom layer names; a `Dense` of your own named like one of
    these sublayers is sharded the same way.

    Shapes: M the size of the model axis; kernels are `(in, out)`.

    Args:
        device_mesh: a `keras.distribution.DeviceMesh`.
        model_axis: the mesh axis that splits the weights (tensor
            parallelism).
        data_axis: optionally a second mesh axis that also splits each
            sharded kernel along its other dimension (the batch axis of a
            `ModelParallel` mesh: fully sharded weights, gathered when
            used). Default None: kernels are replicated along every axis
            but `model_axis`.
        model: optionally a built model or layer whose attention layers'
            key/value weights should be decided from their head counts by
            exact variable path. Not needed when the model is created
            inside the distribution's scope (the map then asks each
            attention layer as its weights are created); it exists because
            a `LayoutMap` only sees variable paths, and a path does not say
            how many key/value heads its layer has, so a map used outside
            variable creation (inspection, another Keras) can be told.

    Returns:
        A `keras.distribution.LayoutMap` (a subclass): column-parallel
        kernels `(data_axis, model_axis)` with biases `(model_axis,)`,
        row-parallel kernels `(model_axis, data_axis)` with replicated
        biases. `key_dense`/`value_dense` are replicated on the model axis
        (`(data_axis, None)`, `(None,)`) in a layer whose
        `num_key_value_heads` (or `num_heads`) is not divisible by M; query
        and output projections likewise when `num_heads` is not, and a
        feed-forward layer's projections when `intermediate_dim` is not.
        A mixture of experts' expert kernels `(model_axis, None, None)` and
        expert biases `(model_axis, None)`, replicated when `num_experts` is
        not divisible by M; its router kernel and bias replicated.

    Raises:
        RuntimeError: on any backend but JAX (Keras implements
            `keras.distribution` on JAX only).
        ValueError: if an axis is not in the mesh, or both are the same.
    """
    _check_backend()
    if not isinstance(device_mesh, keras.distribution.DeviceMesh):
        raise ValueError("`device_mesh` must be a keras.distribution.DeviceMesh. "
                         f"Received: device_mesh={device_mesh!r}")
    _check_axis(device_mesh, "model_axis", model_axis)
    if data_axis is not None:
        _check_axis(device_mesh, "data_axis", data_axis)
        if data_axis == model_axis:
            raise ValueError("`data_axis` and `model_axis` must differ. "
                             f"Received: both {model_axis!r}")
    model_size = device_mesh.shape[list(device_mesh.axis_names).index(model_axis)]

    replicated = {
        ("column", "kernel"): (data_axis, None),
        ("row", "kernel"): (None, data_axis),
        ("column", "bias"): (None,),
        ("row", "bias"): (None,),
        ("expert", "kernel"): (None, None, None),
        ("expert", "bias"): (None, None),
    }
    layout_map = _LayoutMap(device_mesh, model_size, {
        key: keras.distribution.TensorLayout(axes, device_mesh)
        for key, axes in replicated.items()})
    layout_map[_path_regex(COLUMN_PARALLEL, "kernel")] = (data_axis, model_axis)
    layout_map[_path_regex(COLUMN_PARALLEL, "bias")] = (model_axis,)
    layout_map[_path_regex(ROW_PARALLEL, "kernel")] = (model_axis, data_axis)
    layout_map[_path_regex(ROW_PARALLEL, "bias")] = (None,)
    layout_map[_EXPERT_WEIGHT.pattern] = (model_axis, None, None)
    layout_map[_EXPERT_BIAS.pattern] = (model_axis, None)
    # LayerNorm weights (`*_norm/gamma|beta`) and everything else: no rule,
    # so ModelParallel replicates them.

    if model is not None:
        for owner, name, sublayer in _owned_sublayers(model):
            for weight in ("kernel", "bias"):
                variable = getattr(sublayer, weight, None)
                if not isinstance(variable, keras.Variable):
                    continue  # no bias, or a LoRA/quantized kernel (a tensor)
                rule = keras.distribution.LayoutMap.__getitem__(layout_map, variable.path)
                if rule is not None:
                    layout_map[variable.path] = layout_map.layout_for(
                        owner, name, weight, rule)
        for owner in model._flatten_layers(include_self=True, recursive=True):
            for name in EXPERT_PARALLEL:
                variable = getattr(owner, name, None)
                if isinstance(variable, keras.Variable):
                    rule = keras.distribution.LayoutMap.__getitem__(layout_map, variable.path)
                    layout_map[variable.path] = layout_map.expert_layout_for(owner, rule)
    return layout_map
