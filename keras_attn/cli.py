"""The `keras-attn` command (also `python -m keras_attn`).

Each subcommand lives in its own module, which provides
`add_arguments(parser)` and `run(args) -> int`; register it in `COMMANDS`.
"""

import argparse
import importlib
import sys

__all__ = ["main"]

# name -> (module, one-line help)
COMMANDS = {
    "example": ("keras_attn.example", "build a small model from these layers and print its output"),
    "parity": ("keras_attn.parity.cli",
               "run the same cases on every backend and compare them with each other "
               "and with the float64 reference"),
    "demo": ("keras_attn.demo", "train an encoder-decoder Transformer to reverse digit "
                                 "sequences (or, with --task add, a decoder-only one to add)"),
}


def _parser():
    parser = argparse.ArgumentParser(
        prog="keras-attn",
        description="keras_attn: attention layers written once against keras.ops. "
        "The backend is chosen by the KERAS_BACKEND environment variable.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        module = importlib.import_module(module_name)
        module.add_arguments(sub.add_parser(name, help=help_text, description=help_text))
    return parser


def main(argv=None):
    args = _parser().parse_args(argv)
    module = importlib.import_module(COMMANDS[args.command][0])
    return module.run(args)


if __name__ == "__main__":
    sys.exit(main())
