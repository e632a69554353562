"""The two computations of `keras_attn.layers.MixtureOfExperts`' routed experts (the same
numbers): "dense", every expert on every token, and "sparse", each token through its k
experts in blocks sorted by expert; and which one `implementation="auto"` takes.

Where the routing weight goes: after the expert (`w_e * expert_e(x)`: Mixtral, Qwen3-MoE,
gpt-oss, DeepSeek V3), or, with `scale_inputs`, on its input (`expert_e(w_e * x)`: Llama 4's
`Llama4TextMoe`, `routed_in = x * router_scores`), the output unweighted. An expert not
chosen contributes nothing either way.

Each function takes the layer (its kernels, biases and activation options),
the `(N, D)` tokens, the `(N, k)` weights and int32 expert indices, and returns `(N, D)`.
"""

import keras
from keras import ops

from keras_attn import _hooks
from keras_attn._observe import record_path

__all__ = ["EXPERT_ACTIVATIONS", "chosen_path", "dense", "gpt_oss_swiglu", "sparse"]

# Rows per block of the sparse dispatch (at most; fewer when there are fewer tokens). Each
# block gathers its expert's weights, so small blocks read the weights many times: a
# forward and backward of E=8, k=2, D=512, F=1408 took 1035 / 358 ms at 64 / 128 rows over
# 512 tokens and 1279 / 914 ms at 64 / 256 rows over 2048 on PyTorch (2 threads), and
# JAX's compiled forward 66 / 49 ms (512 tokens) and 483 / 110 ms (2048) at 64 / 256.
SPARSE_BLOCK_ROWS = 256

# What each expert computes of its gate `g = x W_gate (+ b_gate)` and up `u = x W_up
# (+ b_up)` projections before W_down: "gated", `activation(g) * u` (SwiGLU with "silu");
# "gpt_oss_swiglu", gpt-oss's clamped SwiGLU (transformers' `GptOssExperts._apply_gate`).
EXPERT_ACTIVATIONS = ("gated", "gpt_oss_swiglu")

# "auto" runs every expert on every token up to this many experts, whatever the tokens.
DENSE_UP_TO_EXPERTS = 4
# ... and, for at most 4 experts per chosen one (E / k <= 4: dense does at most 4x the
# matmul work), up to this many tokens N (known when traced), per backend; the sparse
# dispatch above. Measured with `python benchmarks/moe_paths.py` (E=8, k=2, D=512,
# F=1024, a compiled predict_on_batch, medians of 9, 2 CPU threads): sparse / dense at
# N = 1, 16, 128, 512, 2048 was 2.62, 5.18, 1.72, 0.87, 0.57 on PyTorch and 1.39, 1.79,
# 1.51, 0.95, 0.77 on JAX (the sort and the gathers cost more than 4x the matmuls until
# ~400 tokens), and 0.55-0.72 at every N on TensorFlow (sparse always). Not measured on
# NumPy (sparse, as before).
DENSE_UP_TO_TOKENS = {"torch": 256, "jax": 256}
DENSE_UP_TO_EXPERTS_PER_CHOSEN = 4


def chosen_path(implementation, num_experts, num_experts_per_tok, tokens=None):
    """"dense" or "sparse": `implementation` unless it is "auto", else the measured rule
    above for `tokens` (N, static; None: not known when traced, so sparse unless the
    experts are few)."""
    if implementation != "auto":
        return implementation
    if num_experts <= DENSE_UP_TO_EXPERTS:
        return "dense"
    if tokens is not None and tokens * num_experts_per_tok < num_experts:
        return "sparse"  # its gathered form reads fewer experts than dense
    few_tokens = tokens is not None and tokens <= DENSE_UP_TO_TOKENS.get(
        keras.backend.backend(), 0)
    few_experts = num_experts <= DENSE_UP_TO_EXPERTS_PER_CHOSEN * num_experts_per_tok
    return "dense" if few_tokens and few_experts else "sparse"


def gpt_oss_swiglu(gate, up, alpha, limit):
    """gpt-oss's clamped SwiGLU: `g = min(g, limit)`, `u = clip(u, -limit, limit)`,
    `(u + 1) * g * sigmoid(alpha * g)`."""
    gate = ops.minimum(gate, limit)
    up = ops.clip(up, -limit, limit)
    return (up + 1.0) * gate * ops.sigmoid(alpha * gate)


def _hidden(layer, gate, up):
    """An expert's hidden activations from its gate and up projections."""
    if layer.expert_activation == "gpt_oss_swiglu":
        return gpt_oss_swiglu(gate, up, layer.swiglu_alpha, layer.swiglu_limit)
    return layer.activation(gate) * up


def _bias(layer, name, experts=None):
    """Expert bias `name` broadcast over the rows of each expert's `(E or blocks, rows,
    width)` activations (`experts`: the block's expert of the sparse path), or 0."""
    if not layer.use_expert_bias:
        return 0.0
    bias = getattr(layer, name)
    if experts is not None:
        bias = ops.take(bias, experts, axis=0)
    return bias[:, None, :]


def dense(layer, tokens, weights, indices, scale_inputs=False):
    """Every expert on every token (`E * N` expert calls), zero for those not chosen."""
    chosen = ops.one_hot(indices, layer.num_experts, dtype=layer.compute_dtype)  # (N, k, E)
    # (N, E) routing weights: w_j at the chosen experts, 0 elsewhere.
    combine = ops.sum(chosen * weights[..., None], axis=1)
    if scale_inputs:  # each expert sees its own scaled copy of the tokens
        x = ops.transpose(combine)[:, :, None] * tokens[None]  # (E, N, D)
        spec = "end,edf->enf"
        combine = ops.sum(chosen, axis=1)  # 0 / 1: the chosen experts' outputs, unweighted
    else:
        x, spec = tokens, "nd,edf->enf"
    gate = ops.einsum(spec, x, layer.gate_kernel) + _bias(layer, "gate_bias")
    up = ops.einsum(spec, x, layer.intermediate_kernel) + _bias(layer, "intermediate_bias")
    expert_out = (ops.einsum("enf,efd->end", _hidden(layer, gate, up), layer.output_kernel)
                  + _bias(layer, "output_bias"))  # (E, N, D)
    return ops.einsum("ne,end->nd", combine, expert_out)


def _grouped(layer, tokens, weights, indices, scale_inputs):
    """The `N * k` token copies sorted by expert, each projection one grouped matmul (the
    "grouped_matmul" hook), the outputs put back in order; None where the hook declines."""
    grouped = _hooks.get("grouped_matmul")
    E, k = layer.num_experts, layer.num_experts_per_tok
    experts = ops.reshape(indices, (-1,))  # (A,) the expert of each token copy
    order = ops.cast(ops.argsort(experts), "int32")  # copies sorted by expert
    sorted_experts = ops.take(experts, order)
    ends = ops.cumsum(ops.sum(ops.one_hot(experts, E, dtype="int32"), axis=0))  # (E,)
    copies = ops.take(tokens, order // k, axis=0)  # sorted copy i is token order[i] // k
    if scale_inputs:  # copy i scaled by its own weight before its expert
        copies = copies * ops.take(ops.reshape(weights, (-1,)), order)[:, None]
    gate = grouped(copies, layer.gate_kernel, ends)
    if gate is None:
        return None
    record_path("moe_grouped")

    def bias(name):  # each row's expert bias, or 0
        return ops.take(getattr(layer, name), sorted_experts, axis=0) if layer.use_expert_bias else 0.0

    gate = gate + bias("gate_bias")
    up = grouped(copies, layer.intermediate_kernel, ends) + bias("intermediate_bias")
    y = grouped(_hidden(layer, gate, up), layer.output_kernel, ends) + bias("output_bias")
    y = ops.take(y, ops.cast(ops.argsort(order), "int32"), axis=0)  # (A, D) in copy order
    y = ops.reshape(y, (-1, k, tokens.shape[-1]))
    if not scale_inputs:
        y = y * weights[..., None]
    return ops.sum(y, axis=1)  # (N, D)


def _gathered(layer, tokens, weights, indices, scale_inputs):
    """Fewer token copies than experts (a decode step: A = N k < E): each copy gathers its
    own expert's weights, so A experts are read, not E (dense) or A + E (the blocks).
    Mixtral's decode step on PyTorch is bound by reading expert weights: 2 of 8 experts
    read instead of 8."""
    record_path("moe_gathered")
    N, k, width = tokens.shape[0], layer.num_experts_per_tok, tokens.shape[-1]
    experts = ops.reshape(indices, (-1,))  # (A,) copy a = token a // k's a % k-th expert
    x = ops.reshape(ops.repeat(tokens, k, axis=0), (N * k, 1, width))  # (A, 1, D)
    if scale_inputs:
        x = x * ops.reshape(weights, (-1, 1, 1))
    gate = ops.matmul(x, ops.take(layer.gate_kernel, experts, axis=0)) + _bias(
        layer, "gate_bias", experts)
    up = ops.matmul(x, ops.take(layer.intermediate_kernel, experts, axis=0)) + _bias(
        layer, "intermediate_bias", experts)
    y = ops.matmul(_hidden(layer, gate, up), ops.take(layer.output_kernel, experts, axis=0)
                   ) + _bias(layer, "output_bias", experts)  # (A, 1, D)
    y = ops.reshape(y, (N, k, width))
    if not scale_inputs:
        y = y * weights[..., None]
    return ops.sum(y, axis=1)  # (N, D)


def sparse(layer, tokens, weights, indices, scale_inputs=False):
    """Each token only through its k experts: the `N * k` token copies sorted by expert
    into blocks of at most 256 rows, one expert per block (each expert's rows padded to
    whole blocks), one batched matmul per block against its expert's gathered weights,
    the outputs gathered back (fewer copies than experts: `_gathered`). Every shape
    follows from the input's."""
    E, k = layer.num_experts, layer.num_experts_per_tok
    static_n = tokens.shape[0]
    assignments = None if static_n is None else static_n * k  # A = N k
    # PyTorch on a CPU: one grouped matmul per projection over the copies sorted by expert,
    # each expert's weights read in place (the "grouped_matmul" hook, `keras_attn._hooks`;
    # None elsewhere). Eagerly and in the traced decoding step alike.
    if _hooks.get("grouped_matmul") is not None:
        out = _grouped(layer, tokens, weights, indices, scale_inputs)
        if out is not None:
            return out
    if assignments is not None and assignments < E:
        return _gathered(layer, tokens, weights, indices, scale_inputs)
    rows = SPARSE_BLOCK_ROWS if assignments is None else max(
        1, min(SPARSE_BLOCK_ROWS, -(-assignments // E)))
    experts = ops.reshape(indices, (-1,))  # (A,) the expert of each token copy
    A = ops.shape(experts)[0]
    # Each expert's rows padded to whole blocks: its first slot in the padded buffer.
    counts = ops.sum(ops.one_hot(experts, E, dtype="int32"), axis=0)  # (E,)
    padded = (counts + rows - 1) // rows * rows
    padded_end = ops.cumsum(padded)
    padded_start = padded_end - padded
    start = ops.cumsum(counts) - counts
    order = ops.cast(ops.argsort(experts), "int32")  # copies sorted by expert
    sorted_experts = ops.take(experts, order)
    rank = ops.arange(A, dtype="int32") - ops.take(start, sorted_experts)
    slot_sorted = ops.take(padded_start, sorted_experts) + rank
    # slot[a]: where copy a sits in the buffer (the inverse of the sort). Not
    # `ops.scatter`, which on PyTorch loops in Python over the rows, reading each index
    # (no traced decoding step for `CausalLM.generate` on PyTorch).
    slot = ops.take(slot_sorted, ops.cast(ops.argsort(order), "int32"))
    # Blocks: A // rows + E bounds the padded total (each expert pads < rows).
    blocks = A // rows + E
    capacity = blocks * rows
    width = tokens.shape[-1]
    # Sorted copy i is token order[i] // k (indices are (N, k) flattened).
    copies = ops.take(tokens, order // k, axis=0)
    if scale_inputs:  # copy i scaled by its own weight before its expert
        copies = copies * ops.take(ops.reshape(weights, (-1,)), order)[:, None]
    buffer = ops.scatter_update(  # each slot written once: an update, not a sum
        ops.zeros((capacity, width), tokens.dtype), slot_sorted[:, None], copies)
    starts = ops.arange(blocks, dtype="int32") * rows
    # A block's expert: the number of padded ranges that end at or before its start
    # (blocks past every range are zeros; any expert will do, clipped to E - 1).
    block_expert = ops.minimum(
        ops.sum(ops.cast(padded_end[None, :] <= starts[:, None], "int32"), axis=1), E - 1)
    x = ops.reshape(buffer, (blocks, rows, -1))
    gate = (ops.matmul(x, ops.take(layer.gate_kernel, block_expert, axis=0))
            + _bias(layer, "gate_bias", block_expert))
    up = (ops.matmul(x, ops.take(layer.intermediate_kernel, block_expert, axis=0))
          + _bias(layer, "intermediate_bias", block_expert))
    # Padding rows get the biases too; no copy's slot points at them.
    y = (ops.matmul(_hidden(layer, gate, up), ops.take(layer.output_kernel, block_expert, axis=0))
         + _bias(layer, "output_bias", block_expert))
    y = ops.reshape(ops.take(ops.reshape(y, (capacity, -1)), slot, axis=0), (-1, k, width))
    if not scale_inputs:
        y = y * weights[..., None]
    return ops.sum(y, axis=1)  # (N, D)
