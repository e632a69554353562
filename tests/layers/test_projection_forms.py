"""The two forms of the plain projections (`_projection.projection_form`): the same numbers.

`"einsum"` over the `(in, H, d)` kernel view or `"matmul"` over the 2-D kernel; the
`"projection_form"` hook picks one per backend (`keras_attn._device.PROJECTION_FORMS`).
Each form is forced here through the hook (a spy that counts how often it is asked, so
the form in force is the one that ran) and checked against the float64 reference, with
grouped heads, biases, a gate and the heads-first output layout of the decode step.
"""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn import _hooks
from keras_attn.testing.weights import randomize_weights, reference_params

from .. import reference
from ..helpers import assert_close, randn, rng, to_numpy

B, T, D, H, H_KV = 2, 5, 24, 4, 2


@pytest.fixture(params=["einsum", "matmul"])
def form(request):
    asked = []
    previous = _hooks.get("projection_form")
    _hooks.set("projection_form", lambda: asked.append(request.param) or request.param)
    yield request.param, asked
    _hooks.set("projection_form", previous)


@pytest.mark.parametrize("options", [{}, {"use_bias": True, "use_gate": True}],
                         ids=["plain", "bias+gate"])
def test_both_forms_match_the_reference(form, options):
    name, asked = form
    x = randn(rng(0), B, T, D)
    layer = keras_attn.MultiHeadAttention(H, D // H, num_key_value_heads=H_KV, **options)
    layer.build(x.shape)
    randomize_weights(layer, seed=5)
    asked.clear()
    out = to_numpy(layer(x, use_causal_mask=True))
    assert asked and set(asked) == {name}  # every projection asked, and took, this form
    expected, _ = reference.multi_head_attention(
        reference_params(layer), x, num_heads=H, num_key_value_heads=H_KV, is_causal=True,
        **{k: v for k, v in options.items() if k not in ("use_bias", "use_gate")})
    assert_close(out, expected, what=f"{name} {options}")


def test_both_forms_decode_as_they_prefill(form):
    """A cached step (the heads-first output projection on the explicit path)."""
    name, _ = form
    x = randn(rng(1), B, T, D)
    layer = keras_attn.MultiHeadAttention(H, D // H, num_key_value_heads=H_KV,
                                          implementation="explicit")
    layer.build(x.shape)
    randomize_weights(layer, seed=6)
    full = to_numpy(layer(x, use_causal_mask=True))
    cache = keras_attn.KVCache.empty(B, T, H_KV, D // H)
    for position in range(T):
        out, cache = layer(x[:, position:position + 1], cache=cache,
                           cache_update_index=position, use_causal_mask=True)
        np.testing.assert_allclose(to_numpy(out), full[:, position:position + 1],
                                   rtol=1e-5, atol=1e-5, err_msg=f"{name} step {position}")


def test_the_table_names_a_known_form_for_this_backend():
    from keras_attn import _device

    assert _device.PROJECTION_FORMS.get(keras.backend.backend(), "einsum") in (
        "einsum", "matmul")
    assert _device.projection_form() == _device.PROJECTION_FORMS[keras.backend.backend()]
