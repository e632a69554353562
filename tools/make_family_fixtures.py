"""Write tests/assets/families/<family>.keras and .npz: converted transformers models and their outputs.

Run in the torch environment (it needs torch and transformers), from the repository root:

    KERAS_BACKEND=torch python tools/make_family_fixtures.py [NAME ...]

(NAMEs: only those cases; a fixture already written is a contract, so new cases are
written alone.)

Per case of tests/family_cases.py, in its small shape (V=32, D=16, 2 layers: each fixture
well under 100 KB), with the same random weights far from identity: the model converted by
`keras_attn.convert.causal_lm_from_transformers`, saved as `.keras`, and a `.npz` of arrays
only (no pickle) with the token ids, transformers' logits over them, the 16 tokens of
transformers' greedy `generate` after the first P ids, and the smallest greedy margin.
tests/convert/test_family_fixtures.py checks them under every backend, without transformers.
"""

import os
import sys
import zipfile

os.environ.setdefault("KERAS_BACKEND", "torch")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_attn import convert  # noqa: E402
from tests import family_cases as fc  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                   "tests", "assets", "families")


def deflate(path):
    """Re-store the `.keras` zip with deflate (Keras writes it uncompressed; its HDF5
    weights file is mostly empty headers): the same members, a third of the size."""
    with zipfile.ZipFile(path) as source:
        members = [(info.filename, source.read(info)) for info in source.infolist()]
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as out:
        for filename, data in members:
            out.writestr(filename, data)


def main():
    os.makedirs(OUT, exist_ok=True)
    for name in sys.argv[1:] or fc.CASES:
        model = fc.build_hf(name, small=True)
        ids = fc.token_ids(name, small=True)
        logits, tokens, margin = fc.hf_reference(model, ids)
        lm = convert.causal_lm_from_transformers(model)
        error = fc.relative_error(keras.ops.convert_to_numpy(lm(ids)), logits)
        if error > fc.TOLERANCE:
            raise SystemExit(f"{name}: the conversion is off by {error:.3g}; not written")
        path = os.path.join(OUT, name)
        lm.save(path + ".keras")
        deflate(path + ".keras")
        np.savez(path + ".npz", token_ids=ids, logits=logits.astype("float32"),
                 tokens=tokens, margin=np.float32(margin), prompt_length=np.int32(fc.P))
        print(f"{name}: relative error {error:.2e}, margin {margin:.3g}, "
              f"{os.path.getsize(path + '.keras') // 1024} KB")


if __name__ == "__main__":
    main()
