"""Command line: ``python -m tadm <command>`` (also installed as ``tadm``).

DVC stages call these commands; each reads ``params.yaml``, does one stage's work and
writes its outputs atomically. Errors caused by input print one line and exit non-zero.

One module per group of commands, each with its subcommands' parser (``add_commands``):
``setup`` (profile, check, data stages, count), ``models`` (sample, compute-column, train,
evaluator), ``results`` (claims, replicates, throughput, table1-speed) and ``posttrain``
(dg-base, dg-posttrain, asrd-model); ``train_pool`` the train stage's jobs, ``outputs`` the
output-path check every command passes first, ``common`` what they share.
"""

from __future__ import annotations

import argparse
import sys

from tadm import config
from tadm.cli import models, posttrain, results, setup
from tadm.cli.common import Parser
from tadm.cli.outputs import check_outputs, output_paths
from tadm.cli.train_pool import JOBS_RECORD, TRAIN_AFTER, posttrain_after, train_jobs
from tadm.errors import TadmError

GROUPS = (setup, models, results, posttrain)  # the subcommands' groups, in the help's order


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(prog="tadm", description=__doc__.splitlines()[0])
    ap.add_argument("--params", default=str(config.PARAMS_FILE.name), help="params file (default: params.yaml)")
    sub = ap.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.add_commands(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_outputs(args)
        args.func(args)
    except TadmError as e:
        _leave_process_group_on(e)
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt as e:
        _leave_process_group_on(e)
        print("interrupted: outputs are written atomically; rerun the same command to redo the stage", file=sys.stderr)
        return 130
    except Exception as e:
        _leave_process_group_on(e)
        raise
    return 0


def _leave_process_group_on(error: BaseException) -> None:
    """In a torchrun process that joined the process group, end it now, entering no collective
    (`runtime.leave_on_error`: ``error: rank R: ...``); otherwise return. A group needs
    torch.distributed imported, so a command that never imported it does not import torch here."""
    if "torch.distributed" not in sys.modules:
        return
    from tadm import runtime  # lazy: tadm.runtime imports torch (~1.5 s); reached only once torch.distributed is loaded

    if runtime.in_process_group():
        runtime.leave_on_error(error, runtime.exit_code_of(error))


__all__ = ["GROUPS", "JOBS_RECORD", "TRAIN_AFTER", "build_parser", "check_outputs", "main", "output_paths",
           "posttrain_after", "train_jobs"]


if __name__ == "__main__":
    sys.exit(main())
