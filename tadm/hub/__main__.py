"""``python -m tadm.hub export MODEL_DIR OUT [--run RUN] [--params PARAMS] [--tokenizer DIR]``
(`tadm.hub.export`). A refusal is one line on stderr, ``error: ...``, exit status 2."""

from __future__ import annotations

import argparse
import sys

from tadm.errors import TadmError


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m tadm.hub", description="hub directories of pipeline checkpoints")
    sub = ap.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("export", help="write a trust_remote_code hub directory from models/<run>")
    ex.add_argument("model_dir", metavar="MODEL_DIR", help="the checkpoint directory (models/<run>)")
    ex.add_argument("out", metavar="OUT", help="the hub directory to write (new or empty)")
    ex.add_argument("--run", default=None, help="the run that trained it (default: MODEL_DIR's name)")
    ex.add_argument("--params", default=None, help="params.yaml of the workspace that trained it (default: the repository's)")
    ex.add_argument("--tokenizer", default=None, help="the tokenizer directory (default: data/tokenizer beside --params)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from tadm.hub.export import export

    try:
        out = export(args.model_dir, args.out, run=args.run, params=args.params, tokenizer=args.tokenizer)
    except TadmError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
