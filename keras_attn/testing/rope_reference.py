"""Independent float64 NumPy reference of rotary position embeddings (RoPE) and its types.

Part of `keras_attn.testing.reference` (which re-exports both functions): NumPy and
the standard library only, never `keras` or `keras_attn`. Shapes: L sequence length,
d the rotated width.
"""

import math

import numpy as np

__all__ = ["rope_inverse_frequencies", "rotary_embedding"]


def rope_inverse_frequencies(d, max_wavelength=10000.0, scaling_factor=1.0, rope_type="default",
                             low_freq_factor=1.0, high_freq_factor=4.0,
                             original_max_position_embeddings=None, beta_fast=32.0,
                             beta_slow=1.0, attention_factor=None, mscale=None,
                             mscale_all_dim=None, truncate=True, short_factor=None,
                             long_factor=None, seq_len=None, partial_rotary_factor=1.0):
    """The d/2 RoPE frequencies theta_i and the cos/sin multiplier, float64.

    Written from Hugging Face transformers' `modeling_rope_utils.py`
    (`_compute_linear_scaling_rope_parameters`, `_compute_llama3_parameters`,
    `_compute_yarn_parameters`), `scaling_factor` being their `factor` and
    `max_wavelength` their `rope_theta`. "default" divides by
    `scaling_factor` too (keras_attn's meaning before `rope_type`).
    longrope (`_compute_longrope_parameters`): `theta_i / short_factor[i]`, or
    `/ long_factor[i]` when `seq_len > original_max_position_embeddings`; the
    factor `sqrt(1 + ln(scaling_factor) / ln(original))` unless given.
    "proportional" (`_compute_proportional_rope_parameters`, Gemma 4): theta_i as
    "default" for i < floor(partial_rotary_factor * d / 2), 0 past it (only
    this type reads `partial_rotary_factor` here; `rotary_embedding` slices for
    the others).
    """
    if rope_type == "proportional":
        rotated = int(partial_rotary_factor * d // 2)
        theta = [max_wavelength ** (-2.0 * i / d) if i < rotated else 0.0 for i in range(d // 2)]
        return np.array(theta, np.float64) / scaling_factor, 1.0
    theta = [max_wavelength ** (-2.0 * i / d) for i in range(d // 2)]
    theta = np.array(theta, np.float64)
    if rope_type in ("default", "linear"):
        return theta / scaling_factor, 1.0
    context = float(original_max_position_embeddings)
    if rope_type == "longrope":
        factors = long_factor if seq_len is not None and seq_len > context else short_factor
        if len(factors) != d // 2:
            raise ValueError("reference: longrope needs d/2 factors")
        out = np.array([t / float(f) for t, f in zip(theta, factors)], np.float64)
        if attention_factor is None:
            attention_factor = (1.0 if scaling_factor <= 1.0 else
                                math.sqrt(1.0 + math.log(scaling_factor) / math.log(context)))
        return out, float(attention_factor)
    if rope_type == "llama3":
        out = np.empty_like(theta)
        for i, t in enumerate(theta):
            wavelength = 2.0 * math.pi / t
            if wavelength < context / high_freq_factor:  # high frequency: kept
                out[i] = t
            elif wavelength > context / low_freq_factor:  # low frequency: interpolated
                out[i] = t / scaling_factor
            else:  # between: a smooth mix of the two
                s = (context / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
                out[i] = (1.0 - s) * t / scaling_factor + s * t
        return out, 1.0
    if rope_type != "yarn":
        raise ValueError(f"reference has no rope_type {rope_type!r}")

    def dimension(rotations):  # i such that theta_i * context = 2 pi rotations, for theta_i(i)
        return d * math.log(context / (2.0 * math.pi * rotations)) / (2.0 * math.log(max_wavelength))

    lo, hi = dimension(beta_fast), dimension(beta_slow)
    if truncate:
        lo, hi = float(math.floor(lo)), float(math.ceil(hi))
    lo, hi = max(lo, 0.0), min(hi, d - 1.0)
    if hi == lo:
        hi = hi + 0.001
    out = np.empty_like(theta)
    for i, t in enumerate(theta):
        interpolated = min(max((i - lo) / (hi - lo), 0.0), 1.0)  # 0: extrapolate (keep)
        out[i] = interpolated * t / scaling_factor + (1.0 - interpolated) * t

    def m(scale, weight):
        return 1.0 if scale <= 1.0 else 0.1 * weight * math.log(scale) + 1.0

    if attention_factor is None:
        attention_factor = (m(scaling_factor, mscale) / m(scaling_factor, mscale_all_dim)
                            if mscale and mscale_all_dim else m(scaling_factor, 1.0))
    return out, float(attention_factor)


def rotary_embedding(x, positions, max_wavelength=10000.0, scaling_factor=1.0,
                     interleaved=False, partial_rotary_factor=1.0, **rope):
    """Rotary position embedding (RoPE) of `x` `(..., L, d)` at `positions` `(L,)`.

    theta_i = max_wavelength^(-2i/d) / scaling_factor for i < d/2 (other
    `rope_type`s in `**rope`: `rope_inverse_frequencies`); the angle of
    position p is p * theta_i, and cos and sin are multiplied by the type's
    attention factor (yarn). Half-split form (default): pairs (i, i + d/2),
    `x * cos + rotate_half(x) * sin` with `rotate_half(x) = concat(-x2, x1)`;
    interleaved form: pairs (2i, 2i + 1). `partial_rotary_factor` f < 1: only the
    leading r = int(d * f) features rotate, as a head r wide; the others pass.
    longrope's switch is `max(positions) + 1` (all of this call's positions; pass
    `seq_len` in `**rope` to choose otherwise).
    """
    x = np.asarray(x, np.float64)
    d = x.shape[-1]
    if rope.get("rope_type") == "proportional":  # the whole head, some pairs unturned
        rope["partial_rotary_factor"] = partial_rotary_factor
        partial_rotary_factor = 1.0
    r = int(d * partial_rotary_factor)
    if r < d:
        head = rotary_embedding(x[..., :r], positions, max_wavelength, scaling_factor,
                                interleaved, **rope)
        return np.concatenate([head, x[..., r:]], axis=-1)
    if rope.get("rope_type") == "longrope" and rope.get("seq_len") is None:
        rope = {**rope, "seq_len": int(np.max(positions)) + 1}
    theta, factor = rope_inverse_frequencies(d, max_wavelength, scaling_factor, **rope)
    angle = np.asarray(positions, np.float64)[..., None] * theta  # (..., L, d/2)
    cos, sin = np.cos(angle) * factor, np.sin(angle) * factor
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x1 * cos - x2 * sin
        out[..., 1::2] = x2 * cos + x1 * sin
        return out
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
