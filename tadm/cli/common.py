"""What every command of the command line shares: the stage outputs' default paths, the parser
(no prefix matching, one-line errors), the flag types that read a flag as its params key reads a
value, the params file of a command, and the relaunch under torchrun."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tadm import config
from tadm.config import notebook as nb  # the parameters' checks that key_type's flags read
from tadm.errors import TadmError

# Stage outputs, relative to the repository root (the working directory of `dvc repro`).
CORPUS_DIR = Path("data/corpus")
TOKENIZER_DIR = Path("data/tokenizer")
PACKED_DIR = Path("data/packed")
SFT_DIR = Path("data/sft")


class Parser(argparse.ArgumentParser):
    """The command line's parser: no prefix matching (``--ref`` is not ``--refresh-every``) and
    every error one line, exit 2 (argparse prints the usage first otherwise)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def key_type(key: str, *, entry: bool = False):
    """An argparse `type` that reads a flag as the params key `key` reads a value (`entry`: one
    entry of that list key): its type -- an integer is never truncated from a float -- and its
    ranges and registry, from the declaration params.yaml is checked against."""
    def parse(text: str):
        tp = nb.field_type(key, entry=entry)
        value: object = text
        if tp is int:
            try:
                value = int(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"expected an integer (as {key}), got {text!r}") from None
        elif tp is float:
            try:
                value = float(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"expected a number (as {key}), got {text!r}") from None
        try:
            return nb.parameter(key, value, key, entry=entry)
        except TadmError as e:
            raise argparse.ArgumentTypeError(getattr(e, "detail", str(e)) + f" (as {key})") from None

    parse.__name__ = key  # argparse names the type in "invalid <type> value" messages
    return parse


def block_index(text: str) -> int:
    """--block, --replicate: an index, a whole number in [0, 65535] (argparse's one-line error
    otherwise; whether that block or replicate exists is checked where it is used)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 0 <= value <= 0xFFFF:
        raise argparse.ArgumentTypeError(f"must be in [0, 65535] (an index of a block or a replicate), got {value}")
    return value


def load_params(args) -> config.Params:
    """The params file of the command (--params)."""
    return config.load(args.params)


def relaunched(p: config.Params, args, *command: str) -> bool:
    """runtime.nproc > 1 and not yet under torchrun: run this command again as nproc processes
    (``torchrun --nproc_per_node=N -m tadm ...``), wait for them and report True. Under torchrun
    (or with nproc 1) False: this process is one rank and does its share."""
    from tadm import runtime  # lazy: tadm.runtime imports torch (~1.5 s); only a command that may relaunch needs it

    argv = ["tadm", "--params", str(args.params), *command, *(["--restart"] if args.restart else [])]
    return runtime.relaunch(p.runtime.nproc, argv)


def add_restart(p: argparse.ArgumentParser) -> None:
    p.add_argument("--restart", action="store_true",
                   help="start over: move the run's checkpoints aside to checkpoints/<run>.old-<step> (nothing is deleted) "
                   "instead of resuming; needed after a change of the settings the checkpoints were trained with")
