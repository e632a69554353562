"""Write tests/assets/deepseek_v3_attention.keras and .npz: transformers' DeepseekV3Attention
converted by `keras_attn.convert.multi_head_latent_attention_from_transformers`, and its output.

Run in the torch environment (it needs torch and transformers), from the repository root:

    KERAS_BACKEND=torch python tools/make_latent_attention_fixture.py

The case `tests/latent_cases.FIXTURE` (low-rank queries, yarn RoPE with mscale, interleaved):
the converted layer in a one-layer Functional model saved as `.keras`, and a `.npz` of
arrays only (no pickle): the input `x` `(B, T, D)` and transformers' causal output over it.
tests/convert/test_latent_attention_fixture.py checks them under every backend, without
transformers.
"""

import os
import sys

os.environ.setdefault("KERAS_BACKEND", "torch")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))

import keras  # noqa: E402
import numpy as np  # noqa: E402
from make_family_fixtures import deflate  # noqa: E402

from keras_attn import convert  # noqa: E402
from tests import latent_cases as lc  # noqa: E402

OUT = os.path.join(ROOT, "tests", "assets", "deepseek_v3_attention")


def main():
    config, attention = lc.build_hf(lc.FIXTURE)
    x = lc.inputs()
    expected = lc.hf_output(config, attention, x)
    layer = convert.multi_head_latent_attention_from_transformers(attention, config)
    inputs = keras.Input((None, lc.D))
    model = keras.Model(inputs, layer(inputs, use_causal_mask=True))
    error = lc.relative_error(keras.ops.convert_to_numpy(model(x)), expected)
    if error > lc.TOLERANCE:
        raise SystemExit(f"the conversion is off by {error:.3g}; not written")
    model.save(OUT + ".keras")
    deflate(OUT + ".keras")
    np.savez(OUT + ".npz", x=x, output=expected.astype("float32"))
    print(f"{lc.FIXTURE}: relative error {error:.2e}, {os.path.getsize(OUT + '.keras') // 1024} KB")


if __name__ == "__main__":
    main()
