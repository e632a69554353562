"""The backend boundary: the one package that talks to TF, JAX or torch directly.

The layers never import a backend. Tools that must look at devices or take
gradients of arbitrary functions (the test suite, the parity runner, the
benchmarks, the demo) come here; each function imports only the active backend,
and only when called. (The demo's data-parallel training with each backend's own
engine is the demo's: `keras_attn/demo/data_parallel.py`.) Three serve the library
itself, registered here as named hooks (`keras_attn._hooks`) so that the policy, the
kernels and the layers stay free of backend code and `import keras_attn` imports no
backend: `execution_mode`, for the `auto` policy; `eager_compiler`, for the kernels'
compiled eager calls (`keras_attn._kernels.compiled`); `trace_step`
(`traced_step.py`), for `CausalLM.generate` on PyTorch; and `predict_on_one_replica`
(`strategy.py`), for `CausalLM.generate` under a `tf.distribute` strategy; and
`owned_cache` (`owned_cache.py`), the cache `CausalLM.generate` writes in place on
PyTorch. The first hook looked up imports this package.
"""

import json
import platform

import keras

from keras_attn import _hooks
from keras_attn._device.owned_cache import owned_cache
from keras_attn._device.strategy import predict_on_one_replica
from keras_attn._device.traced_step import TracedStep, trace_step

__all__ = ["allow_tf32", "compile_inference", "describe", "devices", "disable_tf32",
           "eager_compiler", "execution_mode", "gpu_available", "grouped_dot_product_attention",
           "print_devices", "projection_form", "single_cpu_thread_for_small_ops", "trace_step",
           "TracedStep", "value_and_grad"]

# The decoding step's tracer is defined in traced_step.py; registered here with the rest.
_hooks.provide("trace_step")(trace_step)
_hooks.provide("predict_on_one_replica")(predict_on_one_replica)
_hooks.provide("owned_cache")(owned_cache)


def _backend():
    return keras.backend.backend()


@_hooks.provide("float64_dot_product_attention")
def float64_dot_product_attention(query, key, value, *, bias=None, mask=None, scale=None,
                                  is_causal=False):
    """`ops.dot_product_attention` of float64 `(B, T, H, d)` tensors in float64: PyTorch's
    own `scaled_dot_product_attention`, where Keras 3.15's computes in float32
    (keras-team/keras#23704); `ops.dot_product_attention` on the other backends."""
    if _backend() != "torch":
        return keras.ops.dot_product_attention(query, key, value, bias=bias, mask=mask,
                                               scale=scale, is_causal=is_causal)
    import torch

    q, k, v = (keras.ops.convert_to_tensor(x).transpose(1, 2) for x in (query, key, value))
    # torch's attn_mask: a bool mask (True: may attend) or an additive float bias.
    attn_mask = bias if bias is not None else mask
    if attn_mask is not None:
        attn_mask = keras.ops.convert_to_tensor(attn_mask)
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, is_causal=bool(is_causal), scale=scale)
    return out.transpose(1, 2)  # (B, T, H, d_v)


# How `_projection.project_heads` / `project_output` run the plain q/k/v/o projections:
# "einsum" over the (in, H, d) kernel view or "matmul" over the 2-D kernel (the same
# weights). Chosen by `python -m benchmarks.projection_forms` (interleaved medians of a
# 4-layer D=512 Llama's prefill, decode and train step; the figures in
# benchmarks/README.md, "Projection forms"). A backend not listed keeps "einsum".
# matmul / einsum in two runs on a 2-CPU machine (2026-12-06; prefill, decode, train):
# JAX 0.95, 0.86, 1.00 and 1.03, 0.92, 1.00: the decode step faster both times, but
# `benchmarks.attention --baseline` then measured the MultiHeadAttention layer's train
# step at B=8, T=128 and 256, D=256 1.12 and 1.14x the einsum's (an earlier measurement
# found the same, 8-10%), so JAX keeps the einsum; PyTorch 1.12, 1.03, 1.04 and 1.16,
# 1.07, 0.90 (the matmul form's prefill slower both times); TensorFlow 0.93, 1.10, 1.05
# and 1.04, 0.98, 1.01 (no consistent winner).
PROJECTION_FORMS = {"jax": "einsum", "tensorflow": "einsum", "torch": "einsum",
                    "numpy": "einsum"}


@_hooks.provide("projection_form")
def projection_form():
    """`"einsum"` or `"matmul"`: the measured faster form of the projections here."""
    return PROJECTION_FORMS.get(_backend(), "einsum")


@_hooks.provide("grouped_dot_product_attention")
def grouped_dot_product_attention(query, key, value, *, bias=None, mask=None, scale=None,
                                  is_causal=False):
    """`ops.dot_product_attention` of `(B, T, H, d)` queries over `(B, S, H_kv, d)` keys and
    values (H a multiple of H_kv), without repeating them: PyTorch's
    `scaled_dot_product_attention(..., enable_gqa=True)` (torch 2.5 and later). None on
    other backends and older torch: the caller repeats the keys and values."""
    if _backend() != "torch":
        return None
    import torch

    if not _torch_has_enable_gqa(torch.__version__):
        return None
    q, k, v = (keras.ops.convert_to_tensor(x) for x in (query, key, value))
    dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    q, k, v = (x.to(dtype).transpose(1, 2) for x in (q, k, v))  # (B, H|H_kv, L, d)
    # torch's attn_mask: a bool mask (True: may attend) or an additive float bias.
    attn_mask = bias if bias is not None else mask
    if attn_mask is not None:
        attn_mask = keras.ops.convert_to_tensor(attn_mask)
        if attn_mask.dtype != torch.bool:
            attn_mask = attn_mask.to(dtype)
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, is_causal=bool(is_causal), scale=scale, enable_gqa=True)
    return out.transpose(1, 2)  # (B, T, H, d_v)


def grouped_matmul(x, weights, ends):
    """`(A, N)`: rows `x` `(A, K)` sorted by group times their group's `weights` `(G, K, N)`,
    `ends` int32 `(G,)` the end of each group's rows (a cumulative count). PyTorch on a CPU
    only, in float32 or bfloat16: `torch._grouped_mm`, which reads each group's weights in
    place (transformers 5 runs its experts through it); inside a trace (`make_fx`, the
    decoding step of `CausalLM.generate`) the same kernel as the custom op
    `keras_attn::grouped_mm`, since the fake-tensor rule of `torch._grouped_mm` refuses
    float32. None elsewhere, and for rows that are not a multiple of 16 bytes (the
    kernel's rule): the caller's own form. Not on a GPU, whose kernel needs bfloat16 and
    more alignment (not measured here).

    Why: a `MixtureOfExperts` step that gathers its experts' weights copies them first.
    Mixtral-shaped (E=8, k=2, D=512, F=1408), a decode step copied 2 experts' 8.6 MB per
    layer (`index_select`, 5.0 of 17.98 ms per token, 1.26x transformers), and the
    sorted blocks of a 512-token prefill copied 16 (684 against transformers' 367 ms).
    """
    if _backend() != "torch":
        return None
    import torch

    op = _torch_grouped_mm()
    x, weights, ends = (keras.ops.convert_to_tensor(a) for a in (x, weights, ends))
    if (op is None or x.device.type != "cpu" or x.dtype not in (torch.float32, torch.bfloat16)
            or weights.dtype != x.dtype
            # its kernel's rule: every row of x and of each group's weights a multiple of 16
            # bytes ("strides should be multiple of 16 bytes" otherwise)
            or (x.shape[-1] * x.element_size()) % 16 or (weights.shape[-1] * x.element_size()) % 16):
        return None
    from torch.fx.experimental.proxy_tensor import get_proxy_mode

    x, weights, ends = x.contiguous(), weights.contiguous(), ends.to(torch.int32)
    if get_proxy_mode() is not None or torch.compiler.is_compiling():
        return op(x, weights, ends)
    return torch._grouped_mm(x, weights, offs=ends)  # with its own gradient


# Registered on PyTorch only, so that elsewhere the sparse path does not sort for it first.
if keras.backend.backend() == "torch":
    _hooks.provide("grouped_matmul")(grouped_matmul)

_GROUPED_MM: list = []  # the custom op, once made


def _torch_grouped_mm():
    """The custom op `keras_attn::grouped_mm` (made once), or None without `torch._grouped_mm`."""
    import torch

    if not hasattr(torch, "_grouped_mm"):
        return None
    if not _GROUPED_MM:
        try:  # registered by an earlier import of this module (benchmarks' --baseline)
            _GROUPED_MM.append(torch.ops.keras_attn.grouped_mm)
            return _GROUPED_MM[0]
        except (AttributeError, RuntimeError):
            pass

        @torch.library.custom_op("keras_attn::grouped_mm", mutates_args=())
        def grouped_mm(x: torch.Tensor, weights: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
            return torch._grouped_mm(x, weights, offs=ends)

        @grouped_mm.register_fake
        def _(x, weights, ends):
            return x.new_empty((x.shape[0], weights.shape[2]))

        _GROUPED_MM.append(grouped_mm)
    return _GROUPED_MM[0]


def _torch_has_enable_gqa(version):
    major, minor = (int(part) for part in version.split("+")[0].split(".")[:2])
    return (major, minor) >= (2, 5)


@_hooks.provide("execution_mode")
def execution_mode():
    """How TensorFlow runs the code being traced now: "eager", "graph" or "xla".

    "xla" inside `tf.function(jit_compile=True)` (Keras's `jit_compile=True`),
    "graph" inside a plain `tf.function` (what Keras's `fit` and `predict`
    run on a CPU-only machine or under a `tf.distribute` strategy, where its
    `jit_compile="auto"` turns XLA off), "eager" outside any. None on the
    other backends (JAX compiles what it traces with XLA; PyTorch and NumPy
    run eagerly: one row of the policy each) and where TensorFlow's marker
    cannot be read.
    """
    if _backend() != "tensorflow":
        return None
    import tensorflow as tf

    if tf.executing_eagerly():
        return "eager"
    try:  # Private, but what tf.function(jit_compile=True) marks its graphs with.
        from tensorflow.python.framework import ops
        from tensorflow.python.ops import control_flow_util

        in_xla = control_flow_util.GraphOrParentsInXlaContext(ops.get_default_graph())
    except (ImportError, AttributeError):
        return None  # another TensorFlow: the policy's default row (measured under XLA)
    return "xla" if in_xla else "graph"


def disable_tf32():
    """Make float32 matmuls true float32 on GPUs (TF32 off), as Keras's tests do."""
    _set_tf32(False)


def allow_tf32():
    """Let float32 matmuls and convolutions use TF32 on GPUs (faster, ~1e-3 relative).

    The opposite of `disable_tf32`, for benchmarks only: the tests and the parity
    workers keep TF32 off. Nothing happens on a CPU.
    """
    _set_tf32(True)


def _set_tf32(enabled):
    name = _backend()
    if name == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.enable_tensor_float_32_execution(enabled)
    elif name == "torch":
        import torch

        torch.backends.cuda.matmul.allow_tf32 = enabled
        torch.backends.cudnn.allow_tf32 = enabled
    elif name == "jax":
        import jax

        jax.config.update("jax_default_matmul_precision",
                          "tensorfloat32" if enabled else "highest")


def single_cpu_thread_for_small_ops():
    """On PyTorch's CPU backend, run each op on one thread; returns whether it did.

    Tiny models (a few 64-wide matrices per op) spend longer in PyTorch's
    intra-op thread hand-offs than in arithmetic: on a shared 2-core
    machine a demo training step was ten times faster on one thread. JAX
    and TensorFlow are left alone (their thread pools are fixed at start-up
    and cope with small ops).
    """
    if _backend() != "torch":
        return False
    import torch

    if torch.cuda.is_available():
        return False
    torch.set_num_threads(1)
    return True


def gpu_available():
    """Whether the active backend sees at least one GPU."""
    name = _backend()
    if name == "tensorflow":
        import tensorflow as tf

        return bool(tf.config.list_physical_devices("GPU"))
    if name == "torch":
        import torch

        return torch.cuda.is_available()
    if name == "jax":
        import jax

        return any(d.platform == "gpu" for d in jax.devices())
    return False


def describe():
    """A short description of the backend, its version and its device."""
    name = _backend()
    device = "cpu (" + (platform.processor() or platform.machine()) + ")"
    version = ""
    if name == "tensorflow":
        import tensorflow as tf

        version = tf.__version__
        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            details = tf.config.experimental.get_device_details(gpus[0])
            device = "gpu (" + details.get("device_name", gpus[0].name) + ")"
    elif name == "torch":
        import torch

        version = torch.__version__
        if torch.cuda.is_available():
            device = "gpu (" + torch.cuda.get_device_name(0) + ")"
    elif name == "jax":
        import jax

        version = jax.__version__
        first = jax.devices()[0]
        if first.platform != "cpu":
            device = first.platform + " (" + first.device_kind + ")"
    else:
        import numpy

        version = numpy.__version__
    return {"backend": name, "backend_version": version, "keras": keras.__version__,
            "device": device}


def devices():
    """`(devices, build)`: every device the active backend sees, as short strings
    ("cpu", "cuda:0 (NVIDIA H100)", ...), and a note on its build ("CUDA 12.6",
    "CPU only", or None)."""
    name = _backend()
    if name == "tensorflow":
        import tensorflow as tf

        found = []
        for device in tf.config.list_physical_devices():
            text = device.name.replace("/physical_device:", "").lower()
            if device.device_type == "GPU":
                details = tf.config.experimental.get_device_details(device)
                text += f" ({details.get('device_name', 'GPU')})"
            found.append(text)
        build = tf.sysconfig.get_build_info()
        cuda = build.get("cuda_version") if build.get("is_cuda_build") else None
        return found, (f"CUDA {cuda}" if cuda else "CPU only")
    if name == "torch":
        import torch

        found = ["cpu"]
        if torch.cuda.is_available():
            found += [f"cuda:{i} ({torch.cuda.get_device_name(i)})"
                      for i in range(torch.cuda.device_count())]
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            found.append("mps")
        cuda = torch.version.cuda
        return found, (f"CUDA {cuda}" if cuda else "CPU only")
    if name == "jax":
        import jax

        found = [f"{d.platform}:{d.id} ({d.device_kind})" for d in jax.devices()]
        return found, f"default backend {jax.default_backend()}"
    return ["cpu"], None


def print_devices():
    """Print `describe()` and `devices()` as one JSON line (`keras-attn info` runs
    this in a subprocess per backend)."""
    found, build = devices()
    print(json.dumps({**describe(), "devices": found, "build": build}), flush=True)


def value_and_grad(fn, args):
    """`fn(*args)` (a scalar) and its gradients w.r.t. every arg, as NumPy.

    `args` are NumPy arrays (inputs) or `keras.Variable`s (weights); the
    gradients come back in the same order. Not available on the NumPy
    backend, which cannot differentiate.
    """
    name = _backend()
    if name == "jax":
        import jax

        weights = {i for i, a in enumerate(args) if isinstance(a, keras.Variable)}
        values = [a.value if i in weights else jax.numpy.asarray(a)
                  for i, a in enumerate(args)]

        def pure(vs):
            # Weights are read from the traced values inside a stateless scope.
            mapping = [(args[i], vs[i]) for i in weights]
            with keras.StatelessScope(state_mapping=mapping):
                return fn(*[args[i] if i in weights else v for i, v in enumerate(vs)])

        # One compiled program instead of one small compile per eager op (JAX compiles
        # each primitive per shape): about 3x faster on the suite's many small shapes.
        out, grads = jax.jit(jax.value_and_grad(pure))(values)
        return float(out), [keras.ops.convert_to_numpy(g) for g in grads]
    if name == "tensorflow":
        import tensorflow as tf

        watched = [a if isinstance(a, keras.Variable) else tf.convert_to_tensor(a)
                   for a in args]
        targets = [w.value if isinstance(w, keras.Variable) else w for w in watched]
        with tf.GradientTape() as tape:
            for target in targets:
                tape.watch(target)
            out = fn(*watched)
        grads = tape.gradient(out, targets)
        grads = [tf.zeros_like(t) if g is None else g for g, t in zip(grads, targets, strict=False)]
        return float(out), [keras.ops.convert_to_numpy(g) for g in grads]
    if name == "torch":
        import torch

        leaves = []
        call_args = []
        for a in args:
            if isinstance(a, keras.Variable):
                leaves.append(a.value)
                call_args.append(a)
            else:
                t = torch.tensor(a, requires_grad=True,
                                 device=keras.ops.convert_to_tensor(0.0).device)
                leaves.append(t)
                call_args.append(t)
        out = fn(*call_args)
        grads = torch.autograd.grad(out, leaves, allow_unused=True)
        grads = [torch.zeros_like(leaf) if g is None else g
                 for g, leaf in zip(grads, leaves, strict=False)]
        return float(out.detach().cpu()), [g.detach().cpu().numpy() for g in grads]
    raise RuntimeError(f"the {name} backend cannot compute gradients")


@_hooks.provide("eager_compiler")
def eager_compiler(fn):
    """On JAX, `fn` compiled with `jax.jit` for concrete inputs; None elsewhere.

    What eager attention calls and the blockwise loops are compiled with
    (`keras_attn._kernels.compiled`), so that a call at a shape seen before does not
    compile again op by op, nor trace the loops again. Inputs that are tracers (inside `jax.jit`,
    `jax.grad`, Keras's compiled steps) call `fn` itself, inlined as before: a
    `jax.jit` around the kernel's `custom_gradient` under `jax.grad` fails ("No
    constant handler for type: DynamicJaxprTracer").
    """
    if _backend() != "jax":
        return None
    import jax

    compiled = jax.jit(fn)

    def call(*args):
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(args)):
            return fn(*args)
        return compiled(*args)

    return call


def compile_inference(fn):
    """`fn` as one compiled program for inference: `jax.jit` on JAX, `tf.function`
    on TensorFlow; on PyTorch eager under `torch.no_grad()`; unchanged on NumPy.

    Layers called inside `fn` have their weights read at trace time (JAX) or
    as captured variables (TensorFlow): use it for inference, not training.
    Call it with tensors or NumPy arrays of fixed shapes (each new shape traces
    again).
    """
    name = _backend()
    if name == "jax":
        import jax

        return jax.jit(fn)
    if name == "tensorflow":
        import tensorflow as tf

        return tf.function(fn)  # one trace per input shape (the cache needs a static S_max)
    if name == "torch":
        import torch

        def no_grad(*args, **kwargs):
            with torch.no_grad():
                return fn(*args, **kwargs)

        return no_grad
    return fn
