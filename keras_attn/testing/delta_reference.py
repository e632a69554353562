"""Independent float64 NumPy reference of the gated delta rule and of Qwen 3.5's Gated
DeltaNet layer (Yang et al., Gated Delta Networks, arXiv 2412.06464, Eq. 10; the
Qwen3-Next / Qwen 3.5 layer of transformers 5.24, read as a specification).

Imports NumPy and the standard library only (never `keras` or `keras_attn`), so that a
comparison against it compares two derivations: the recurrence is written here token by
token, exactly as the paper states it, never in the chunked form.

Letters: B batch, T length, H value heads, H_k query/key heads, d_k, d_v head widths.
Weights use the Keras layout (`x @ kernel`).
"""

import numpy as np

__all__ = ["causal_depthwise_conv", "gated_delta_net", "gated_delta_rule", "gated_rms_norm",
           "l2norm"]


def l2norm(x, eps=1e-6):
    x = np.asarray(x, np.float64)
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + eps)


def _silu(x):
    return x / (1.0 + np.exp(-x))


def gated_delta_rule(q, k, v, g, beta, initial_state=None, scale=None):
    """q, k `(B, T, H_k, d_k)`, v `(B, T, H, d_v)`, g, beta `(B, T, H)`; returns
    `(o (B, T, H, d_v), S (B, H, d_k, d_v))`, in float64, one token at a time:
    S <- exp(g) S;  S <- S + beta k (v - S^T k)^T;  o = S^T q / sqrt(d_k)."""
    q, k, v, g, beta = (np.asarray(x, np.float64) for x in (q, k, v, g, beta))
    b, t, h_k, d_k = k.shape
    h, d_v = v.shape[2:]
    rep = h // h_k
    q, k = np.repeat(q, rep, axis=2), np.repeat(k, rep, axis=2)
    scale = d_k ** -0.5 if scale is None else scale
    s = (np.zeros((b, h, d_k, d_v)) if initial_state is None
         else np.array(initial_state, np.float64))
    out = np.zeros((b, t, h, d_v))
    for i in range(b):
        for j in range(h):
            for n in range(t):
                st = s[i, j] * np.exp(g[i, n, j])
                err = v[i, n, j] - st.T @ k[i, n, j]
                st = st + beta[i, n, j] * np.outer(k[i, n, j], err)
                out[i, n, j] = st.T @ (q[i, n, j] * scale)
                s[i, j] = st
    return out, s


def causal_depthwise_conv(x, kernel, state=None):
    """x `(B, T, C)`, kernel `(K, C)`: y_t = sum_i kernel[i] * x_{t - K + 1 + i}, with the
    K - 1 earlier inputs from `state` `(B, K - 1, C)` (zeros when None); returns
    `(y, new_state)`."""
    x, kernel = np.asarray(x, np.float64), np.asarray(kernel, np.float64)
    taps = kernel.shape[0]
    past = np.zeros((x.shape[0], taps - 1, x.shape[2])) if state is None else np.asarray(state)
    full = np.concatenate([past, x], axis=1)
    y = np.zeros_like(x)
    for n in range(x.shape[1]):
        y[:, n] = (full[:, n:n + taps] * kernel[None]).sum(1)
    return y, full[:, full.shape[1] - (taps - 1):]


def gated_rms_norm(x, gate, weight, eps):
    """RMSNorm(x) * weight * silu(gate) over the last axis."""
    x = np.asarray(x, np.float64)
    x = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return x * np.asarray(weight, np.float64) * _silu(np.asarray(gate, np.float64))


def gated_delta_net(x, w, heads, eps=1e-6, state=None, decay=True, beta_gate=True):
    """Qwen 3.5's Gated DeltaNet layer on x `(B, T, D)`.

    `heads` = (H_k, H, d_k, d_v). `w`: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a,
    out_proj (kernels `(in, out)`), conv1d `(K, C)`, A_log, dt_bias `(H,)`, norm `(d_v,)`.
    `state` = (conv_state, recurrent_state) or None. `decay=False` (g = 0) and
    `beta_gate=False` (beta = 1) are the ablations. Returns `(y, (conv, recurrent))`.
    """
    h_k, h, d_k, d_v = heads
    x = np.asarray(x, np.float64)
    b, t, _ = x.shape
    conv_state, rec_state = (None, None) if state is None else state
    mixed, conv_state = causal_depthwise_conv(x @ w["in_proj_qkv"], w["conv1d"], conv_state)
    mixed = _silu(mixed)
    q = mixed[..., :h_k * d_k].reshape(b, t, h_k, d_k)
    k = mixed[..., h_k * d_k:2 * h_k * d_k].reshape(b, t, h_k, d_k)
    v = mixed[..., 2 * h_k * d_k:].reshape(b, t, h, d_v)
    z = (x @ w["in_proj_z"]).reshape(b, t, h, d_v)
    beta = 1.0 / (1.0 + np.exp(-(x @ w["in_proj_b"])))
    a = x @ w["in_proj_a"] + np.asarray(w["dt_bias"], np.float64)
    g = -np.exp(np.asarray(w["A_log"], np.float64)) * np.log1p(np.exp(a))
    g = g if decay else 0 * g
    beta = beta if beta_gate else 0 * beta + 1
    o, rec_state = gated_delta_rule(l2norm(q), l2norm(k), v, g, beta, rec_state)
    o = gated_rms_norm(o, z, w["norm"], eps).reshape(b, t, h * d_v)
    return o @ w["out_proj"], (conv_state, rec_state)
