"""The parity matrix's cached-decoding cases, run in this backend against the float64 reference.

The worker runs them as a prefill then one-token calls over a key/value cache;
the reference is the uncached forward, so a cache that mixes up positions,
slots or masks shows up here before the matrix compares backends.
"""

import keras
import numpy as np
import pytest

from keras_attn.parity import arrays, cases, expected, worker
from keras_attn.testing.tolerances import tolerance

CACHED = [c for c in cases.CASES if "cached_prefill" in c.call]


def test_there_are_cached_cases_of_both_layers():
    assert {c.kind for c in CACHED} == {"mha", "decoder", "mla", "gdn"}


@pytest.mark.skipif(keras.backend.backend() == "jax",
                    reason="eager JAX compiles every op of these calls (about 16 s); "
                           "`tox -e parity` checks them on JAX against the same reference")
@pytest.mark.parametrize("case", CACHED, ids=lambda c: c.name)
def test_cached_case_matches_the_uncached_reference(case):
    inputs, masks, weights = arrays.case_arrays(case)
    result = worker.run_case(case, "float32", inputs, masks, weights, gradients=False)
    want = expected.reference_forward(case, inputs, masks, weights)
    tol = tolerance("float32", "output", "cpu")
    np.testing.assert_allclose(result["output"], want, rtol=tol["rtol"], atol=tol["atol"])
