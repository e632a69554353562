"""The `auto` policy as data: every backend's and device's row, under any backend.

`keras_attn._policy.select_implementation` takes the backend name, so the rows of
JAX, TensorFlow, PyTorch and NumPy are all checked here whichever backend runs the
suite. The expectations are the paths that the policy gave before it became a table
(`keras_attn/_paths.py` at dc2eca1, evaluated under each backend name), for shapes
that sit on each measured threshold of benchmarks/crossover.py.

Every test but one takes the backend as an argument and computes nothing with the live
one: they are marked `backend_independent` and run in one tox environment (numpy); the
one that calls `attend` under the live backend runs everywhere.
"""

import threading

import pytest

from keras_attn import _observe, _policy, config
from keras_attn._policy import POLICY, BlockRule, Row, observe_paths, record_path

from ..fixtures import attention_settings_fixture

BACKENDS = ("jax", "tensorflow", "torch", "numpy")
DEVICES = ("cpu", "gpu", "tpu", "cuda", "mps")


# Every test sees the measured policy (no setting).
_measured_policy = attention_settings_fixture()


def _select(backend, device, T, S, lead, implementation="auto", **flags):
    kw = dict(has_mask=False, has_bias=False, is_causal=False, needs_weights=False,
              symbolic=False)
    kw.update(flags)
    return _policy.select_implementation(implementation, backend=backend, lead=lead, T=T, S=S,
                                         device=device, **kw)


B, F, E = "blockwise", "fused", "explicit"
# case -> (T, S, lead, flags), then per backend (path on a CPU, path on any other device).
CASES = {
    "small scores stay fused": (
        (16, 16, (1, 1), dict(is_causal=True)),
        dict(jax=(F, F), tensorflow=(F, F), torch=(F, F), numpy=(F, F))),
    "JAX's smallest blockwise scores, 32 x 32": (
        (32, 32, (1, 1), dict(is_causal=True)),
        dict(jax=(B, F), tensorflow=(F, F), torch=(F, F), numpy=(F, F))),
    "just below 32 x 32": (
        (31, 32, (1, 1), dict(is_causal=True)),
        dict(jax=(F, F), tensorflow=(F, F), torch=(F, F), numpy=(F, F))),
    "a training batch, B=8 H=8 T=256 causal": (
        (256, 256, (8, 8), dict(is_causal=True)),
        dict(jax=(B, F), tensorflow=(F, F), torch=(F, F), numpy=(F, F))),
    "16 queries over a long memory": (
        (16, 1024, (2, 8), {}),
        dict(jax=(B, F), tensorflow=(F, F), torch=(F, F), numpy=(F, F))),
    "15 queries over a long memory: too few for the loop": (
        (15, 1024, (2, 8), {}),
        dict(jax=(F, F), tensorflow=(F, F), torch=(F, F), numpy=(F, F))),
    "TensorFlow's smallest causal, 512 x 512": (
        (512, 512, (1, 4), dict(is_causal=True)),
        dict(jax=(B, F), tensorflow=(B, F), torch=(F, F), numpy=(F, F))),
    "a window counts as banded, 512 x 512": (
        (512, 512, (1, 4), dict(has_window=True)),
        dict(jax=(B, F), tensorflow=(B, F), torch=(F, F), numpy=(F, F))),
    "below TensorFlow's smallest full one": (
        (512, 1024, (2, 8), {}),
        dict(jax=(B, F), tensorflow=(F, F), torch=(F, F), numpy=(F, F))),
    "TensorFlow's smallest full, 1024 x 1024": (
        (1024, 1024, (1, 4), {}),
        dict(jax=(B, F), tensorflow=(B, F), torch=(F, F), numpy=(F, F))),
    "one long sequence, B=1 T=2048 H=4 causal": (
        (2048, 2048, (1, 4), dict(is_causal=True)),
        dict(jax=(B, F), tensorflow=(B, F), torch=(F, F), numpy=(F, F))),
    "a soft-cap where the policy says fused goes explicit": (
        (2048, 2048, (1, 4), dict(is_causal=True, has_soft_cap=True)),
        dict(jax=(B, E), tensorflow=(B, E), torch=(E, E), numpy=(E, E))),
    "a decode step over a cache": (
        (1, 768, (1, 8), dict(is_causal=False, has_mask=True, cached=True)),
        dict(jax=(E, F), tensorflow=(E, F), torch=(E, F), numpy=(E, F))),
    "15 queries over a cache": (
        (15, 768, (1, 8), dict(has_mask=True, cached=True)),
        dict(jax=(E, F), tensorflow=(E, F), torch=(E, F), numpy=(E, F))),
    "a prefill into a cache follows the ordinary rule": (
        (512, 768, (1, 8), dict(is_causal=True, has_mask=True, cached=True)),
        dict(jax=(B, F), tensorflow=(B, F), torch=(F, F), numpy=(F, F))),
    "one query without a cache stays fused": (
        (1, 768, (1, 8), dict(has_mask=True)),
        dict(jax=(F, F), tensorflow=(F, F), torch=(F, F), numpy=(F, F))),
    "above the memory bound, unmasked: PyTorch's flash kernel": (
        (8192, 8192, (1, 4), dict(is_causal=True)),
        dict(jax=(B, B), tensorflow=(B, B), torch=(F, F), numpy=(B, B))),
    "above the memory bound, masked": (
        (8192, 8192, (1, 4), dict(is_causal=True, has_mask=True)),
        dict(jax=(B, B), tensorflow=(B, B), torch=(B, B), numpy=(B, B))),
    "above the memory bound with a bias": (
        (8192, 8192, (1, 4), dict(has_bias=True)),
        dict(jax=(B, B), tensorflow=(B, B), torch=(B, B), numpy=(B, B))),
    "above the memory bound, causal with T != S needs a mask": (
        (4096, 8192, (1, 4), dict(is_causal=True)),
        dict(jax=(B, B), tensorflow=(B, B), torch=(B, B), numpy=(B, B))),
    "an unknown batch counts as 1: at the memory bound": (
        (4096, 4096, (None, 4), {}),
        dict(jax=(B, F), tensorflow=(B, F), torch=(F, F), numpy=(F, F))),
    "an unknown batch counts as 1: above the memory bound": (
        (4097, 4097, (None, 4), {}),
        dict(jax=(B, B), tensorflow=(B, B), torch=(F, F), numpy=(B, B))),
    "unknown lengths: fused": (
        (None, 2048, (1, 4), dict(is_causal=True)),
        dict(jax=(F, F), tensorflow=(F, F), torch=(F, F), numpy=(F, F))),
    "unknown lengths with a soft-cap: explicit": (
        (2048, None, (1, 4), dict(has_soft_cap=True)),
        dict(jax=(E, E), tensorflow=(E, E), torch=(E, E), numpy=(E, E))),
    "scores requested: explicit": (
        (8192, 8192, (1, 4), dict(needs_weights=True)),
        dict(jax=(E, E), tensorflow=(E, E), torch=(E, E), numpy=(E, E))),
    "symbolic inputs: explicit": (
        (2048, 2048, (1, 4), dict(symbolic=True)),
        dict(jax=(E, E), tensorflow=(E, E), torch=(E, E), numpy=(E, E))),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.backend_independent
def test_every_row_gives_the_measured_path(case, backend, device):
    (T, S, lead, flags), expected = CASES[case]
    cpu_path, elsewhere = expected[backend]
    assert _select(backend, device, T, S, lead, **flags) == (
        cpu_path if device == "cpu" else elsewhere)


@pytest.mark.backend_independent
def test_the_rows_hold_the_measured_numbers():
    assert POLICY["jax"]["cpu"].blockwise_min_scores == (32 * 32, 32 * 32)
    assert POLICY["tensorflow"]["cpu"].blockwise_min_scores == (512 * 512, 1024 * 1024)
    for backend in ("torch", "numpy", "default"):
        assert POLICY[backend]["cpu"].blockwise_min_scores is None
    for backend, rows in POLICY.items():
        assert rows["cpu"].decode_explicit_below == 16, backend
        assert rows["default"].blockwise_min_scores is None, backend
        assert rows["default"].decode_explicit_below is None, backend
        for row in rows.values():
            assert row.max_scores == config.DEFAULT_BLOCKWISE_THRESHOLD == 2**26
            assert row.blockwise_min_queries == 16
            assert row.flash_unmasked == (backend == "torch")


@pytest.mark.backend_independent
def test_rows_are_found_by_backend_and_device():
    assert _policy.policy_row("jax", "cpu") is POLICY["jax"]["cpu"]
    assert _policy.policy_row("jax", "tpu") is POLICY["jax"]["default"]
    assert _policy.policy_row("torch", "mps") is POLICY["torch"]["default"]
    assert _policy.policy_row("openvino", "cpu") is POLICY["default"]["cpu"]
    # A backend without a row of its own: the rules every backend shares.
    assert _select("openvino", "cpu", 1, 768, (1, 8), has_mask=True, cached=True) == E
    assert _select("openvino", "cpu", 2048, 2048, (1, 4), is_causal=True) == F
    assert _select("openvino", "gpu", 8192, 8192, (1, 4)) == B


@pytest.mark.backend_independent
def test_tensorflow_rows_follow_the_execution_mode():
    """XLA (and an unknown mode) keep the XLA-measured row; a plain tf.function goes
    blockwise by the scores of the whole call, causal only; eager never by speed."""
    assert _policy.policy_row("tensorflow", "cpu", "xla") is POLICY["tensorflow"]["cpu"]
    assert _policy.policy_row("tensorflow", "cpu", None) is POLICY["tensorflow"]["cpu"]
    assert _policy.policy_row("tensorflow", "cpu", "graph") is POLICY["tensorflow"]["cpu/graph"]
    assert _policy.policy_row("tensorflow", "gpu", "graph") is POLICY["tensorflow"]["default"]
    assert _policy.policy_row("jax", "cpu", "graph") is POLICY["jax"]["cpu"]  # no such row
    assert POLICY["tensorflow"]["cpu/graph"].blockwise_min_call_scores == (2**24, None)

    def tf(mode, T, lead, **flags):
        return _select("tensorflow", "cpu", T, T, lead, mode=mode, **flags)

    causal = dict(is_causal=True)
    # B=1, H=4, T=512 causal (Keras's predict of a 512-token prompt on a CPU): the
    # XLA rule goes blockwise, which costs 1.2-1.4x fused in a plain tf.function.
    assert tf("xla", 512, (1, 4), **causal) == tf(None, 512, (1, 4), **causal) == B
    assert tf("graph", 512, (1, 4), **causal) == tf("eager", 512, (1, 4), **causal) == F
    # 2**24 scores in the call: B=1, H=4 from T=2048; B=8, H=8 from T=512.
    assert tf("graph", 2047, (1, 4), **causal) == F
    assert tf("graph", 2048, (1, 4), **causal) == tf("graph", 512, (8, 8), **causal) == B
    assert tf("graph", 512, (8, 8), has_window=True) == B   # banded, like causal
    assert tf("graph", 2048, (1, 4)) == F                   # full attention: fused
    assert tf("graph", 2048, (1, 4), has_soft_cap=True) == E
    assert tf("graph", 2048, (1, 4), has_soft_cap=True, **causal) == B
    assert tf("eager", 4096, (1, 4), **causal) == F          # eager: by memory only
    assert tf("eager", 8192, (1, 4), **causal) == B
    # Decoding over a cache and the memory bound do not depend on the mode.
    for mode in ("xla", "graph", "eager"):
        assert _select("tensorflow", "cpu", 1, 768, (1, 8), mode=mode, has_mask=True,
                       cached=True) == E


@pytest.mark.backend_independent
def test_the_table_drives_the_choice(monkeypatch):
    """Change a row and the choice follows: nothing else holds a threshold."""
    monkeypatch.setitem(POLICY, "numpy", {"cpu": Row(blockwise_min_scores=(16 * 16, 16 * 16)),
                                          "default": Row(max_scores=100)})
    assert _select("numpy", "cpu", 16, 16, (1, 1)) == B
    assert _select("numpy", "cpu", 15, 16, (1, 1)) == F
    assert _select("numpy", "cpu", 1, 768, (1, 8), has_mask=True, cached=True) == F
    assert _select("numpy", "gpu", 10, 10, (1, 1)) == F   # 100 scores: at the bound
    assert _select("numpy", "gpu", 11, 10, (1, 1)) == B
    monkeypatch.setitem(POLICY, "jax", {"cpu": Row(blockwise_min_queries=1024), "default": Row()})
    assert _select("jax", "cpu", 2048, 2048, (1, 4), is_causal=True) == F  # no speed rule
    monkeypatch.setitem(POLICY, "jax", {"cpu": Row(blockwise_min_scores=(1, 1),
                                                   blockwise_min_queries=1024),
                                        "default": Row(flash_unmasked=True)})
    assert _select("jax", "cpu", 1023, 2048, (1, 4)) == F
    assert _select("jax", "cpu", 1024, 2048, (1, 4)) == B
    assert _select("jax", "gpu", 8192, 8192, (1, 4)) == F


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.backend_independent
def test_a_set_threshold_replaces_every_row(backend):
    config.set_blockwise_threshold(100)
    for device in DEVICES:
        assert _select(backend, device, 16, 16, (1, 1), has_mask=True) == B
        assert _select(backend, device, 10, 10, (1, 1), has_mask=True) == F
        assert _select(backend, device, 10, 10, (1, 1), has_soft_cap=True) == E
        assert _select(backend, device, 1, 768, (1, 1), has_mask=True, cached=True) == B
        assert _select(backend, device, 1, 50, (1, 1), has_mask=True, cached=True) == F
        # Unmasked PyTorch keeps its flash kernel above any bound.
        assert _select(backend, device, 16, 16, (1, 1), is_causal=True) == (
            F if backend == "torch" else B)
    config.set_blockwise_threshold(2**30)
    assert _select(backend, "cpu", 2048, 2048, (1, 4), is_causal=True) == F
    config.set_blockwise_threshold(None)
    assert _select(backend, "cpu", 2048, 2048, (1, 4), is_causal=True) == (
        B if backend in ("jax", "tensorflow") else F)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.backend_independent
def test_requested_paths_are_kept_or_refused(backend):
    for path in ("explicit", "fused", "blockwise"):
        assert _select(backend, "cpu", 64, 64, (1, 1), implementation=path) == path
        assert _select(backend, "gpu", 64, 64, (1, 1), implementation=path,
                       needs_weights=True) == E
    with pytest.raises(ValueError, match="cannot soft-cap"):
        _select(backend, "cpu", 64, 64, (1, 1), implementation="fused", has_soft_cap=True)
    with pytest.raises(ValueError, match="static"):
        _select(backend, "cpu", None, 64, (1, 1), implementation="blockwise")
    with pytest.raises(ValueError, match="Received: implementation='flash'"):
        _select(backend, "cpu", 64, 64, (1, 1), implementation="flash")


@pytest.mark.backend_independent
def test_block_sizes_follow_the_block_rule_unless_set():
    size = _policy.block_size_for
    assert size((1, 4), 4096, 4096) == 512
    assert size((1, 4), 4096, 4096, banded=True) == 256
    assert size((8, 8), 256, 256, banded=True) == 64
    assert size((8, 8), 512, 512, banded=True) == 128
    assert size((8, 8), 1, 128, banded=True) == 128
    rule = BlockRule(sizes=(96, 32), tile_scores=4 * 96 * 96, one_block=16, max_small_blocks=2)
    assert size((1, 4), 4096, 4096, blocks=rule) == 96
    assert size((1, 8), 4096, 4096, blocks=rule) == 32
    assert size((1, 8), 10, 10, blocks=rule) == 16      # one block
    config.set_attention_block_size(64)
    assert size((1, 4), 4096, 4096) == 64
    assert size((1, 4), 4096, 4096, blocks=rule) == 64


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.backend_independent
def test_long_causal_sequences_keep_the_full_tile_on_jax_only(backend):
    size, rule = _policy.block_size_for, _policy.block_rule(backend)
    jax = backend == "jax"
    # Causal over 8 or more full-tile blocks (512 at B=1, H=4; 256 at B=2, H=8).
    assert size((1, 4), 4096, 4096, banded=True, blocks=rule) == (512 if jax else 256)
    assert size((1, 4), 16384, 16384, banded=True, blocks=rule) == (512 if jax else 256)
    assert size((2, 8), 2048, 2048, banded=True, blocks=rule) == (256 if jax else 128)
    # Fewer blocks, or a window (its band is W, not the sequence): the half tile.
    assert size((1, 4), 4095, 4095, banded=True, blocks=rule) == 256
    assert size((1, 4), 16384, 16384, banded=True, blocks=rule, sliding_window=1024) == 256
    assert size((1, 4), 4096, 4096, blocks=rule) == 512  # full attention: unchanged
    config.set_attention_block_size(64)
    assert size((1, 4), 4096, 4096, banded=True, blocks=rule) == 64


def test_a_blockwise_call_takes_the_block_of_its_backends_rule(monkeypatch):
    import keras
    from keras import ops

    from keras_attn import attention

    seen = []

    def spy(query, key, value, **kwargs):  # records the block; no attention computed
        seen.append(kwargs["block_size"])
        return value

    monkeypatch.setattr(attention, "blockwise_attention", spy)
    x = ops.zeros((1, 4, 4096, 8))
    attention.attend("blockwise", x, x, x, is_causal=True)
    attention.attend("blockwise", x, x, x, is_causal=True, sliding_window=1024)
    attention.attend("blockwise", x, x, x)
    causal = 512 if keras.backend.backend() == "jax" else 256
    assert seen == [causal, 256, 512]


# ----------------------------------------------------------------------------
# The observer.


@pytest.mark.backend_independent
def test_nothing_is_recorded_without_an_observer():
    assert _observe._OBSERVERS.get() == ()
    assert record_path("fused") == "fused"
    _select("jax", "cpu", 32, 32, (1, 1))
    with observe_paths() as taken:
        pass
    assert taken == {}


@pytest.mark.backend_independent
def test_observers_count_what_happens_inside_and_nest():
    with observe_paths() as outer:
        _select("jax", "cpu", 32, 32, (1, 1), is_causal=True)
        with observe_paths() as inner:
            _select("torch", "cpu", 32, 32, (1, 1))
            record_path("cached")
        _select("numpy", "cpu", 32, 32, (1, 1), needs_weights=True)
    _select("numpy", "cpu", 32, 32, (1, 1))
    assert inner == {"fused": 1, "cached": 1}
    assert outer == {"blockwise": 1, "fused": 1, "cached": 1, "explicit": 1}
    assert _observe._OBSERVERS.get() == ()


@pytest.mark.backend_independent
def test_an_observer_is_scoped_to_its_context():
    with observe_paths() as taken:
        worker = threading.Thread(target=record_path, args=("fused",))
        worker.start()
        worker.join()
        record_path("explicit")
    assert taken == {"explicit": 1}
