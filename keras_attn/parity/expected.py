"""What every parity case should give: its output and gradients from the float64 reference.

The forward pass is `keras_attn.testing.reference` on the case's float32 arrays in
float64; gradients of `sum(output * cotangent)` come from central differences on
it, so nothing here shares code with the layers it checks.
"""

import numpy as np

from keras_attn.parity.arrays import cotangent
from keras_attn.parity.cases import _attention_options, has_gradients
from keras_attn.testing import delta_reference, reference

__all__ = ["reference_forward", "reference_result"]

def _nest(flat):
    tree = {}
    for name, value in flat.items():
        *parents, leaf = name.split("/")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = np.asarray(value, np.float64)
    return tree


def reference_forward(case, inputs, masks, weights):
    """The case's output in float64, from `keras_attn.testing.reference`."""
    c, call = case.config, case.call
    params = _nest(weights)
    if case.kind == "sdpa":
        return reference.scaled_dot_product_attention(
            inputs["query"], inputs["key"], inputs["value"], mask=masks.get("mask"),
            bias=inputs.get("bias"), is_causal=c.get("is_causal", False),
            scale=c.get("scale"), sliding_window=c.get("sliding_window"),
            logit_soft_cap=c.get("logit_soft_cap"),
            attention_chunk_size=c.get("attention_chunk_size"))[0]
    if case.kind == "mha":
        return reference.multi_head_attention(
            params, inputs["query"], inputs.get("key"), inputs.get("value"),
            num_heads=c["num_heads"], mask=masks.get("attention_mask"),
            is_causal=call.get("use_causal_mask", False), **_attention_options(c))[0]
    if case.kind == "ffn":
        return reference.feed_forward(params, inputs["inputs"], c.get("activation", "relu"))
    if case.kind == "mla":
        options = {k: v for k, v in c.items() if k not in ("use_bias", "decode")}
        return reference.multi_head_latent_attention(
            params, inputs["query"], mask=masks.get("attention_mask"),
            is_causal=call.get("use_causal_mask", False), **options)[0]
    if case.kind == "gdn":
        w = {name: params[name]["kernel"] for name in (
            "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")}
        w.update(conv1d=params["conv1d_kernel"].T, A_log=params["A_log"],
                 dt_bias=params["dt_bias"], norm=params["norm_scale"])
        heads = tuple(c[f"linear_{n}"] for n in ("num_key_heads", "num_value_heads",
                                                  "key_head_dim", "value_head_dim"))
        return delta_reference.gated_delta_net(inputs["inputs"], w, heads,
                                               eps=c.get("layer_norm_epsilon", 1e-6))[0]
    common = dict(num_heads=c["num_heads"], padding_mask=masks.get("padding_mask"),
                  attention_mask=masks.get("attention_mask"),
                  normalize_first=c.get("normalize_first", False),
                  epsilon=c.get("layer_norm_epsilon", 1e-5),
                  activation_name=c.get("activation", "relu"),
                  attention_options=_attention_options(c))
    if case.kind == "encoder":
        return reference.encoder_layer(params, inputs["inputs"],
                                       is_causal=call.get("use_causal_mask", False), **common)
    return reference.decoder_layer(
        params, inputs["inputs"], memory=inputs.get("memory"),
        memory_padding_mask=masks.get("memory_padding_mask"),
        memory_attention_mask=masks.get("memory_attention_mask"),
        is_causal=call.get("use_causal_mask", True), **common)


def reference_result(case, inputs, masks, weights, step=1e-5):
    """{"output": ..., "grad/<input or weight>": ...}, all float64.

    Gradients of `sum(output * cotangent)` by central differences on the
    float64 reference (error about step**2, far below every tolerance).
    """
    inputs = {n: np.asarray(v, np.float64) for n, v in inputs.items()}
    weights = {n: np.asarray(v, np.float64) for n, v in weights.items()}
    out = reference_forward(case, inputs, masks, weights)
    cot = cotangent(case, out.shape).astype(np.float64)
    result = {"output": out}
    if not has_gradients(case):
        return result

    def loss_with(group, name):
        def loss(array):
            changed = dict(group, **{name: array})
            args = (changed, weights) if group is inputs else (inputs, changed)
            return float(np.sum(reference_forward(case, args[0], masks, args[1]) * cot))
        return loss

    for group in (inputs, weights):
        for name, array in group.items():
            grad = reference.numerical_gradient(loss_with(group, name), array, step)
            result["grad/" + name] = grad
    return result

