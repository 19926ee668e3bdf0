"""``python -m tadm.hub export MODEL_DIR OUT [--run RUN] [--params PARAMS] [--tokenizer DIR]``
(`tadm.hub.export`) and ``python -m tadm.hub export-fusion FUSION_DIR OUT --base BASE [--params
PARAMS]`` (`tadm.hub.export_fusion`). A refusal is one line on stderr, ``error: ...``, exit status 2."""

from __future__ import annotations

import argparse
import sys

from tadm.errors import TadmError
from tadm.hub.export import export


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m tadm.hub", description="hub directories of pipeline checkpoints")
    sub = ap.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("export", help="write a trust_remote_code hub directory from models/<run>")
    ex.add_argument("model_dir", metavar="MODEL_DIR", help="the checkpoint directory (models/<run>)")
    ex.add_argument("out", metavar="OUT", help="the hub directory to write (new or empty)")
    ex.add_argument("--run", default=None, help="the run that trained it (default: MODEL_DIR's name)")
    ex.add_argument("--params", default=None, help="params.yaml of the workspace that trained it (default: the repository's)")
    ex.add_argument("--tokenizer", default=None, help="the tokenizer directory (default: data/tokenizer beside --params)")
    fx = sub.add_parser("export-fusion", help="write a trust_remote_code hub directory of a TADM:Post-train fusion")
    fx.add_argument("fusion_dir", metavar="FUSION_DIR", help="the fusion directory (models/dg_tadm)")
    fx.add_argument("out", metavar="OUT", help="the hub directory to write (new or empty)")
    # required, but checked by export_fusion so that its absence is a one-line error like the others
    fx.add_argument("--base", default=None,
                    help="the frozen DiffusionGemma it was trained on: a hub id or a local directory")
    fx.add_argument("--params", default=None,
                    help="params.yaml of the workspace that trained it (default: the repository's)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)

    try:
        if args.command == "export-fusion":
            from tadm.hub.export_fusion import export_fusion  # lazy: loads transformers' DiffusionGemma; export doesn't

            out = export_fusion(args.fusion_dir, args.out, base=args.base, params=args.params)
        else:
            out = export(args.model_dir, args.out, run=args.run, params=args.params, tokenizer=args.tokenizer)
    except TadmError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
