"""Write tests/assets/padded/<family>.keras and .npz: transformers' left-padded `generate`.

Run in the torch environment (it needs torch and transformers), from the repository root:

    KERAS_BACKEND=torch python tools/make_padded_fixtures.py

Per family (Llama; GPT-2 for learned absolute positions, which transformers derives from
the mask): tests/family_cases.py's model in its small shape, converted and saved as
`.keras`, and a `.npz` of arrays only: the batch of tests/models/test_padded_batches.py (8
prompts of lengths 3 to 40 padded on the left to P = 40), its mask, and transformers'
greedy `generate(input_ids, attention_mask=...)` of L - P = 8 new tokens, with the smallest
top-2 logit margin over every step and row (refused below 1e-4: a near-tie could flip).
tests/models/test_padded_batches.py decodes the batch under every backend against them.
"""

import os
import sys

os.environ.setdefault("KERAS_BACKEND", "torch")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from make_family_fixtures import deflate  # noqa: E402

from keras_attn import convert  # noqa: E402
from tests import family_cases as fc  # noqa: E402
from tests.models import test_padded_batches as padded  # noqa: E402

OUT = os.path.join(ROOT, "tests", "assets", "padded")
FAMILIES = ("llama", "gpt2")


def main():
    os.makedirs(OUT, exist_ok=True)
    for name in sys.argv[1:] or FAMILIES:
        hf = fc.build_hf(name, small=True)
        vocabulary = fc.config_kwargs(name, small=True)["vocab_size"]
        rows = padded._rows(padded.LENGTHS, seed=5, vocabulary=vocabulary)
        ids, mask = padded._batch(rows, "left")
        with torch.no_grad():
            out = hf.generate(torch.from_numpy(ids).long(),
                              attention_mask=torch.from_numpy(mask).long(), do_sample=False,
                              max_new_tokens=padded.L - padded.P,
                              min_new_tokens=padded.L - padded.P, pad_token_id=padded.PAD,
                              return_dict_in_generate=True, output_logits=True)
        top = np.sort(np.stack([s.float().numpy() for s in out.logits]), axis=-1)
        margin = float((top[..., -1] - top[..., -2]).min())
        if margin <= 1e-4:
            raise SystemExit(f"{name}: a near-tie (margin {margin:.3g}); not written")
        lm = convert.causal_lm_from_transformers(hf)
        ours = keras.ops.convert_to_numpy(lm.generate(ids, padded.L, attention_mask=mask))
        if not np.array_equal(ours, out.sequences.numpy()):
            raise SystemExit(f"{name}: the converted model decodes other tokens; not written")
        path = os.path.join(OUT, name)
        lm.save(path + ".keras")
        deflate(path + ".keras")
        np.savez(path + ".npz", token_ids=ids, mask=mask, sequences=out.sequences.numpy(),
                 margin=np.float32(margin))
        print(f"{name}: margin {margin:.3g}, {os.path.getsize(path + '.keras') // 1024} KB")


if __name__ == "__main__":
    main()
