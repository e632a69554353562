"""The inputs and weights of a parity case, and the cotangent of its loss.

Everything here is plain NumPy: inputs and weights are drawn once from a fixed
seed, written to a file and loaded into every backend, so no result depends on
a backend's random number generator. Weights are named like the reference's
parameter dicts, flattened with "/" (for example
"self_attention/query/kernel"); the worker loads them into the layer's
variables by those names.

The scalar loss of every case is `sum(output * cotangent)` with a fixed random
`cotangent` of the output's shape, so that every gradient is non-trivial (a
plain sum would give LayerNorm outputs zero gradients).
"""

import numpy as np

from keras_attn.testing.layout import LAYOUT

__all__ = ["case_arrays", "cotangent", "weight_shapes"]

SEED = 20240607
WEIGHT_SCALE = 0.5


def _dense(prefix, n_in, n_out, bias=True):
    shapes = {f"{prefix}/kernel": (n_in, n_out)}
    if bias:
        shapes[f"{prefix}/bias"] = (n_out,)
    return shapes


def _mha(prefix, q_dim, k_dim, v_dim, heads, key_dim, value_dim=None, output_dim=None,
         bias=True, kv_heads=None, qk_norm=None, output_bias=None, gate=False, sinks=False,
         qk_norm_full_width=False):
    value_dim = value_dim or key_dim
    output_dim = output_dim or q_dim
    kv_heads = kv_heads or heads
    p = prefix + "/" if prefix else ""
    sizes = {"query": (q_dim, heads * key_dim), "key": (k_dim, kv_heads * key_dim),
             "value": (v_dim, kv_heads * value_dim), "output": (heads * value_dim, output_dim)}
    if gate:  # Keras's use_gate, on the query input
        sizes["gate"] = (q_dim, heads * value_dim)
    shapes = {}
    for part in LAYOUT["MultiHeadAttention"]["dense"]:
        if part in sizes:
            has_bias = bias if part != "output" or output_bias is None else output_bias
            shapes.update(_dense(p + part, *sizes[part], has_bias))
    if qk_norm not in (None, "l2"):  # "l2" has no weights
        # Over d, or over the whole projection: H * d queries, H_kv * d keys (OLMo 2).
        widths = ({"query_norm": heads * key_dim, "key_norm": kv_heads * key_dim}
                  if qk_norm_full_width else {})
        for part in LAYOUT["MultiHeadAttention"]["norms"]:
            shapes.update(_norm(p + part, widths.get(part, key_dim), qk_norm))
    if sinks:  # `use_sinks`: a logit per query head
        shapes[p + "sinks"] = (heads,)
    return shapes


def _ffn(prefix, dim, inter, output_dim=None, bias=True, gated=False):
    p = prefix + "/" if prefix else ""
    sizes = {"intermediate": (dim, inter), "output": (inter, output_dim or dim)}
    shapes = {}
    if gated:
        sizes["gate"] = (dim, inter)
    for part in LAYOUT["PositionwiseFeedForward"]["dense"]:
        if part in sizes:
            shapes.update(_dense(p + part, *sizes[part], bias))
    return shapes


def _mla(dim, c):
    """MultiHeadLatentAttention's weights (biases on query_a, key_value_a, output only)."""
    H, r, rope = c["num_heads"], c["kv_lora_rank"], c["qk_rope_head_dim"]
    d_qk, q_r, bias = c["qk_nope_head_dim"] + rope, c.get("q_lora_rank"), c.get("use_bias", False)
    shapes = {}
    if q_r is None:
        shapes.update(_dense("query", dim, H * d_qk, False))
    else:
        shapes.update({**_dense("query_a", dim, q_r, bias), **_norm("query_a_norm", q_r, "rms"),
                       **_dense("query_b", q_r, H * d_qk, False)})
    shapes.update({**_dense("key_value_a", dim, r + rope, bias),
                   **_norm("key_value_a_norm", r, "rms"),
                   **_dense("key_value_b", r, H * (c["qk_nope_head_dim"] + c["v_head_dim"]),
                            False),
                   **_dense("output", H * c["v_head_dim"], c.get("output_dim") or dim, bias)})
    return shapes


def _gdn(dim, c):
    """GatedDeltaNet's weights (no biases): the projections, the convolution, the gates."""
    h_k, h = c["linear_num_key_heads"], c["linear_num_value_heads"]
    d_k, d_v = c["linear_key_head_dim"], c["linear_value_head_dim"]
    conv = 2 * h_k * d_k + h * d_v
    return {"in_proj_qkv/kernel": (dim, conv), "in_proj_z/kernel": (dim, h * d_v),
            "in_proj_b/kernel": (dim, h), "in_proj_a/kernel": (dim, h),
            "out_proj/kernel": (h * d_v, dim),
            "conv1d_kernel": (conv, c.get("linear_conv_kernel_dim", 4)), "dt_bias": (h,),
            "A_log": (h,), "norm_scale": (d_v,)}


def _norm(prefix, dim, kind="layer"):
    if kind == "rms":
        return {f"{prefix}/scale": (dim,)}
    return {f"{prefix}/gamma": (dim,), f"{prefix}/beta": (dim,)}


def weight_shapes(case):
    """name -> shape of every weight of the case's layer."""
    c, s = case.config, case.shapes
    if case.kind == "sdpa":
        return {}
    bias = c.get("use_bias", True)
    if case.kind == "mha":
        q = s["query"][-1]
        k = s.get("key", s["query"])[-1]
        v = s.get("value", s.get("key", s["query"]))[-1]
        shapes = _mha("", q, k, v, c["num_heads"], c["key_dim"], c.get("value_dim"),
                      c.get("output_dim"), bias, c.get("num_key_value_heads"), c.get("qk_norm"),
                      c.get("output_use_bias"), c.get("use_gate", False),
                      c.get("use_sinks", False), c.get("qk_norm_full_width", False))
        if c.get("attention_k_eq_v"):  # the keys' projection is the values' too
            shapes = {name: shape for name, shape in shapes.items()
                      if not name.startswith("value/")}
        return shapes
    if case.kind == "ffn":
        return _ffn("", s["inputs"][-1], c["intermediate_dim"], c.get("output_dim"), bias,
                    c.get("gated", False))
    if case.kind == "mla":
        return _mla(s["query"][-1], c)
    if case.kind == "gdn":
        return _gdn(s["inputs"][-1], c)
    d = s["inputs"][-1]
    head = c.get("key_dim") or d // c["num_heads"]
    norm = c.get("normalization", "layer")
    attention_bias = c.get("attention_use_bias")
    attention_bias = bias if attention_bias is None else attention_bias
    output_bias = c.get("attention_output_use_bias")
    output_bias = attention_bias if output_bias is None else output_bias
    shapes = {**_mha("self_attention", d, d, d, c["num_heads"], head, output_dim=d,
                     bias=attention_bias, kv_heads=c.get("num_key_value_heads"),
                     qk_norm=c.get("qk_norm"), output_bias=output_bias,
                     sinks=c.get("use_sinks", False),
                     qk_norm_full_width=c.get("qk_norm_full_width", False)),
              **_norm("self_attention_norm", d, norm)}
    post = c.get("use_post_attention_norm", False)
    if post:
        shapes.update(_norm("post_attention_norm", d, norm))
    if "memory" in s:
        m = s["memory"][-1]
        shapes.update(_mha("cross_attention", d, m, m, c["num_heads"], head, output_dim=d,
                           bias=attention_bias, output_bias=output_bias))
        shapes.update(_norm("cross_attention_norm", d, norm))
        if post:
            shapes.update(_norm("post_cross_attention_norm", d, norm))
    ffn_bias = c.get("feed_forward_use_bias")
    shapes.update(_ffn("feed_forward", d, c["intermediate_dim"],
                       bias=bias if ffn_bias is None else ffn_bias,
                       gated=c.get("gated_feed_forward", False)))
    shapes.update(_norm("feed_forward_norm", d, norm))
    if c.get("use_post_ffw_norm", False):
        shapes.update(_norm("post_feed_forward_norm", d, norm))
    return shapes


def case_arrays(case, seed=SEED):
    """(inputs, masks, weights): dicts of float32 / bool NumPy arrays."""
    g = np.random.default_rng([seed, _stable_hash(case.name)])
    inputs = {n: g.standard_normal(shape).astype("float32") for n, shape in case.shapes.items()}
    masks = {n: np.asarray(make(g), bool) for n, make in case.masks.items()}
    weights = {}
    for name, shape in weight_shapes(case).items():
        value = g.normal(0.0, WEIGHT_SCALE, size=shape)
        if name.endswith(("gamma", "scale")):
            value = 1.0 + value
        weights[name] = value.astype("float32")
    return inputs, masks, weights


def cotangent(case, shape, seed=SEED):
    """The fixed weights of the scalar loss `sum(output * cotangent)`."""
    g = np.random.default_rng([seed, _stable_hash(case.name), 1])
    return g.standard_normal(tuple(shape)).astype("float32")


def _stable_hash(text):
    return int.from_bytes(text.encode()[:16].ljust(16, b"\0"), "little") % (2**63)
