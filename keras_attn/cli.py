"""The `keras-attn` commands that need a backend: example, parity, demo.

The command starts in `keras_attn_cli` (a top-level module outside this package,
which imports no Keras): it answers `--help`, `--version` and `info`, checks the
backend and hands the other commands to `run_command` here. Importing this module
imports Keras (the package's `__init__` does), so only those commands come here.

Each subcommand lives in its own module, which provides
`add_arguments(parser)` and `run(args) -> int`; register it in
`keras_attn_cli.COMMANDS`. Only the module of the command that runs is imported.
"""

import argparse
import importlib
import sys

from keras_attn_cli import COMMANDS
from keras_attn_cli import main as _main

__all__ = ["main", "run_command"]


def run_command(name, argv):
    """Parse `argv` with the command's own parser and run it; returns the exit status."""
    module_name, help_text = COMMANDS[name]
    if module_name is None:
        raise ValueError(f"`keras-attn {name}` runs in keras_attn_cli, not here")
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=f"keras-attn {name}", description=help_text)
    module.add_arguments(parser)
    return module.run(parser.parse_args(argv))


def main(argv=None):
    """`keras-attn ...` (the same as `keras_attn_cli.main`)."""
    return _main(argv)


if __name__ == "__main__":
    sys.exit(main())
