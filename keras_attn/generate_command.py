"""`keras-attn generate PATH --prompt "..."`: a checkpoint folder's text, streamed as it comes.

Loads the folder with `keras_attn.convert.causal_lm_from_pretrained` (no torch or
transformers), its `tokenizer.json` with `tokenizers`, its stop tokens from
`generation_config.json` / `config.json` (`keras_attn.text`), then prints the
prompt and the new text to stdout token by token. Progress (loading, timing) goes
to stderr, so stdout is the text alone.
"""

import sys
import time

__all__ = ["add_arguments", "run"]


def add_arguments(parser):
    parser.add_argument("path", help="a Hugging Face checkpoint folder (config.json, "
                                     "model.safetensors or its shards, tokenizer.json)")
    parser.add_argument("--prompt", required=True, help="the text to continue")
    parser.add_argument("--max-new-tokens", type=int, default=32,
                        help="how many tokens at most to generate (default 32)")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="0 (default) for greedy decoding, else the sampling temperature")
    parser.add_argument("--top-k", type=int, default=None,
                        help="with sampling, only among the k most likely tokens")
    parser.add_argument("--top-p", type=float, default=None,
                        help="with sampling, only among the most likely tokens whose "
                             "probabilities add up to p (nucleus sampling)")
    parser.add_argument("--seed", type=int, default=0, help="the sampling seed (default 0)")
    parser.add_argument("--dtype", default=None,
                        help="the model's dtype (default: the checkpoint's)")


def run(args):
    from keras_attn import text
    from keras_attn.convert import causal_lm_from_pretrained

    started = time.perf_counter()
    print(f"keras-attn generate: loading {args.path} ...", file=sys.stderr, flush=True)
    try:
        tokenizer = text.load_tokenizer(args.path)
        stops = text.stop_token_ids(args.path)
        lm = causal_lm_from_pretrained(args.path, dtype=args.dtype)
    except (ValueError, ImportError) as error:
        print(f"keras-attn generate: {error}", file=sys.stderr)
        return 2
    print(f"keras-attn generate: loaded in {time.perf_counter() - started:.1f} s; "
          f"generating up to {args.max_new_tokens} tokens", file=sys.stderr, flush=True)
    options = {}
    if args.temperature > 0:
        options = {"temperature": args.temperature, "top_k": args.top_k, "seed": args.seed}
        if args.top_p is not None:
            options["top_p"] = args.top_p
    sys.stdout.write(args.prompt)
    sys.stdout.flush()
    started = time.perf_counter()
    try:
        generated = text.generate_text(
            lm, tokenizer, args.prompt, args.max_new_tokens, end_token_id=stops or None,
            on_text=lambda piece: (sys.stdout.write(piece), sys.stdout.flush()), **options)
    except ValueError as error:
        print(f"\nkeras-attn generate: {error}", file=sys.stderr)
        return 2
    sys.stdout.write("\n")
    print(f"keras-attn generate: {len(generated)} characters in "
          f"{time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0
