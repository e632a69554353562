"""Print, per transformers family, how a converted `keras_attn.CausalLM` compares with transformers.

    KERAS_BACKEND=torch python tools/family_report.py            # live, against transformers
    KERAS_BACKEND=jax python tools/family_report.py              # from tests/assets/families
    KERAS_BACKEND=torch python tools/family_report.py --fixtures # the stored files on torch

Columns: the logits' relative error (max |keras - transformers| / max |transformers|,
tolerance 1e-4), whether `lm.generate` gives transformers' 16 greedy tokens, the smallest
greedy margin of transformers (top-1 minus top-2 logit), and the relative error of the
family's ablation (tests/family_cases.py: a wrong window, RoPE, norm offset or qk-norm),
which must be far beyond the tolerance. Live (torch with transformers) uses the shapes of
tests/convert/test_families.py (V=128, D=64); the fixtures are the small ones (V=32, D=16).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402

from tests import family_cases as fc  # noqa: E402


def _live(name):
    from keras_attn import convert

    model = fc.build_hf(name)
    ids = fc.token_ids(name)
    logits, tokens, margin = fc.hf_reference(model, ids)
    return convert.causal_lm_from_transformers(model), ids, logits, tokens, margin, fc.P


def _stored(name):
    from tests.convert.test_family_fixtures import load

    lm, stored = load(name)
    return (lm, stored["token_ids"], stored["logits"], stored["tokens"],
            float(stored["margin"]), int(stored["prompt_length"]))


def main(argv):
    live = "--fixtures" not in argv and keras.backend.backend() == "torch"
    if live:
        try:
            import transformers  # noqa: F401
        except ImportError:
            live = False
    source = "live against transformers" if live else "stored transformers outputs (fixtures)"
    print(f"backend {keras.backend.backend()}, keras {keras.__version__}: {source}\n")
    print("| family | logits rel. error | 16 greedy tokens identical | greedy margin "
          "| ablation | ablation rel. error |")
    print("|---|---|---|---|---|---|")
    ok = True
    for name in fc.CASES:
        lm, ids, logits, tokens, margin, P = (_live if live else _stored)(name)
        error = fc.relative_error(keras.ops.convert_to_numpy(lm(ids)), logits)
        ours = keras.ops.convert_to_numpy(lm.generate(ids[:, :P], max_length=tokens.shape[1]))
        same = bool(np.array_equal(ours, tokens))
        ablation = fc.relative_error(keras.ops.convert_to_numpy(fc.ablate(lm, name)(ids)), logits)
        ok &= error <= fc.TOLERANCE and same and ablation > 100 * fc.TOLERANCE
        print(f"| {name} | {error:.2e} | {'yes' if same else 'NO'} | {margin:.3g} "
              f"| {fc.CASES[name][3][0]} | {ablation:.2e} |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
