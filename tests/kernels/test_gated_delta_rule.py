"""The gated delta rule (keras_attn.linear_attention): the chunked and recurrent forms against
the float64 token-by-token reference (keras_attn.testing.delta_reference) and against
transformers' torch functions, forward and gradients.

Sizes: B = 2, T = 7, H_k = 1 query/key head serving H = 2 value heads, d_k = 4, d_v = 3;
chunk sizes 3 and 4 (do not divide T: padded), 7 (divides) and 64 (one padded chunk).
"""

import keras
import numpy as np
import pytest

from keras_attn import _device, observe_paths
from keras_attn.linear_attention import chunk_gated_delta_rule, recurrent_gated_delta_rule
from keras_attn.testing import delta_reference as ref
from keras_attn.testing.reference import numerical_gradient

from ..helpers import assert_close

B, T, H_K, H, D_K, D_V = 2, 7, 1, 2, 4, 3

# The rest of the forward numerics (keras.ops written once) run on torch and numpy (the CI
# budget); JAX and TensorFlow run the gradients through the chunked form (jax.jit on
# JAX): the test below.
cheap_backends = pytest.mark.skipif(keras.backend.backend() in ("jax", "tensorflow"),
                                    reason="forward numerics checked on torch and numpy")



def _problem(seed=0, dtype="float32"):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(B, T, H_K, D_K))
    k = ref.l2norm(rng.normal(size=(B, T, H_K, D_K)))  # unit keys, as the layer feeds them
    v = rng.normal(size=(B, T, H, D_V))
    g = -rng.uniform(0.05, 1.0, (B, T, H))
    beta = rng.uniform(0.2, 1.0, (B, T, H))
    state = rng.normal(size=(B, H, D_K, D_V))
    return [x.astype(dtype) for x in (q, k, v, g, beta, state)]


# Chunk 3 (padded: it does not divide T = 7) and 7 (it does) on every backend: issue 35's
# "chunked = the reference on every backend, with chunk sizes that do and do not divide
# the length" (a compile each on JAX and TensorFlow); 4 and 64 on torch and numpy.
@pytest.mark.parametrize("chunk_size", [3, 7, pytest.param(4, marks=cheap_backends),
                                        pytest.param(64, marks=cheap_backends)])
def test_chunked_matches_the_reference(chunk_size):
    q, k, v, g, beta, state = _problem()
    expected, expected_state = ref.gated_delta_rule(q, k, v, g, beta, state)
    with observe_paths() as taken:
        out, final = chunk_gated_delta_rule(q, k, v, g, beta, state, chunk_size=chunk_size)
    assert taken == {"chunked": 1}
    assert_close(out, expected, what="output")
    assert_close(final, expected_state, what="final state")


def test_recurrent_matches_the_reference_and_one_step_at_a_time():  # every backend
    q, k, v, g, beta, state = _problem(1)
    expected, expected_state = ref.gated_delta_rule(q, k, v, g, beta, state)
    with observe_paths() as taken:
        out, final = recurrent_gated_delta_rule(q, k, v, g, beta, state)
        assert_close(out, expected)
        assert_close(final, expected_state, what="final state")
        rows, s = [], state
        for t in range(T):  # the decode form: one token per call, the state carried
            o, s = recurrent_gated_delta_rule(*(x[:, t:t + 1] for x in (q, k, v, g, beta)), s)
            rows.append(keras.ops.convert_to_numpy(o))
    assert taken == {"recurrent": T + 1}
    assert_close(np.concatenate(rows, 1), expected, what="token by token")
    assert_close(s, expected_state, what="token by token state")


@cheap_backends
def test_zero_initial_state_and_l2norm_in_kernel():
    q, k, v, g, beta, _ = _problem(2)
    expected, _ = ref.gated_delta_rule(ref.l2norm(q), ref.l2norm(k), v, g, beta)
    out, _ = chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=4, use_qk_l2norm_in_kernel=True)
    assert_close(out, expected)


@cheap_backends
def test_ablations_move_the_output_far_past_the_tolerance():
    """Decay removed (g = 0) or the beta gate set to 1: the reference moves by >> 1e-5."""
    q, k, v, g, beta, state = _problem(3)
    out, _ = chunk_gated_delta_rule(q, k, v, g, beta, state, chunk_size=4)
    out = keras.ops.convert_to_numpy(out)
    for name, args in (("g=0", (q, k, v, 0 * g, beta, state)),
                       ("beta=1", (q, k, v, g, 1 + 0 * beta, state))):
        ablated, _ = ref.gated_delta_rule(*args)
        assert np.abs(ablated - out).max() > 0.1, name


@pytest.mark.requires_trainable_backend
@pytest.mark.parametrize("chunk_size", [3, 7])
def test_chunked_gradients_match_central_differences(chunk_size):
    """float64 throughout: the chunked form's gradients w.r.t. every input and the initial
    state = central differences of the token-by-token reference (chunk 3: padded; 7
    divides T)."""
    args = _problem(4, "float64")
    probe = np.random.default_rng(5).normal(size=(B, T, H, D_V))
    state_probe = np.random.default_rng(6).normal(size=(B, H, D_K, D_V))

    def loss(*xs):
        out, final = chunk_gated_delta_rule(*xs, chunk_size=chunk_size)
        return (keras.ops.sum(out * keras.ops.convert_to_tensor(probe))
                + keras.ops.sum(final * keras.ops.convert_to_tensor(state_probe)))

    _, grads = _device.value_and_grad(loss, args)
    for which, grad in enumerate(grads):
        def f(x, which=which):
            xs = list(args)
            xs[which] = x
            out, final = ref.gated_delta_rule(*xs)
            return float((out * probe).sum() + (final * state_probe).sum())
        assert_close(grad, numerical_gradient(f, args[which]), what=f"gradient {which}",
                     quantity="gradient")


@cheap_backends
def test_matches_transformers_torch_functions():
    torch = pytest.importorskip("torch")
    qwen = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    q, k, v, g, beta, state = _problem(7)
    t = [torch.tensor(x) for x in (q, k, v, g, beta, state)]
    for chunk_size in (3, 7):
        expected, expected_state = qwen.torch_chunk_gated_delta_rule(
            *t[:3], g=t[3], beta=t[4], chunk_size=chunk_size, initial_state=t[5],
            output_final_state=True, use_qk_l2norm_in_kernel=True)
        out, final = chunk_gated_delta_rule(q, k, v, g, beta, state, chunk_size=chunk_size,
                                            use_qk_l2norm_in_kernel=True)
        assert_close(out, expected.numpy(), against="transformers")
        assert_close(final, expected_state.numpy(), against="transformers")
    expected, expected_state = qwen.torch_recurrent_gated_delta_rule(
        *t[:3], g=t[3], beta=t[4], initial_state=t[5], output_final_state=True,
        use_qk_l2norm_in_kernel=True)
    out, final = recurrent_gated_delta_rule(q, k, v, g, beta, state, use_qk_l2norm_in_kernel=True)
    assert_close(out, expected.numpy(), against="transformers")
    assert_close(final, expected_state.numpy(), against="transformers")


@pytest.mark.parametrize("bad, message", [
    (dict(chunk_size=0), "chunk_size=0"),
    (dict(g_shape=(B, T, 3)), "g.shape=(2, 7, 3)"),
    (dict(state_shape=(B, H, D_K, 5)), "initial_state.shape=(2, 2, 4, 5)"),
])
def test_bad_input_names_the_argument(bad, message):
    q, k, v, g, beta, state = _problem()
    if "g_shape" in bad:
        g = np.zeros(bad["g_shape"], "float32")
    if "state_shape" in bad:
        state = np.zeros(bad["state_shape"], "float32")
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        chunk_gated_delta_rule(q, k, v, g, beta, state, chunk_size=bad.get("chunk_size", 4))
