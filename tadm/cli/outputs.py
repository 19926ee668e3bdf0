"""The output paths of a command and their check before any work: an output flag naming an existing
folder where a file is written, an existing file where a folder is, or a replaced folder holding
what its writer did not write is refused in one line (tadm.io.check_output_path)."""

from __future__ import annotations

from pathlib import Path

from tadm.cli.common import CORPUS_DIR, PACKED_DIR, SFT_DIR, TOKENIZER_DIR


def output_paths(args) -> list[tuple[str, Path, str, tuple[str, ...] | None]]:
    """(flag, path, kind, ours) of every output path of the command in `args`: "file" or "dir"
    where that kind is written, `ours` the names a folder replaced as a whole may hold
    (tadm.io.output_conflict; None: files are written into it)."""
    command, out = args.command, getattr(args, "out", None)
    if command == "profile":
        return [("--params", Path(args.params), "file", None)]
    if command == "corpus":
        out = Path(out or CORPUS_DIR)
        return [("--out", out, "dir", None), *(("--out", out / name, "file", None)
                                               for name in ("train.jsonl", "validation.jsonl", "manifest.json"))]
    if command in ("sft", "claims"):
        return [("--out", Path(out or SFT_DIR), "dir", None)]
    if command == "tokenizer":
        from tadm.data.tokenizer import OUTPUT_FILES  # lazy: CLI start-up loads a command's modules only when it runs

        return [("--out", Path(out or TOKENIZER_DIR), "dir", OUTPUT_FILES)]
    if command == "pack":
        from tadm.data.packing import SHARD_FILES, SPLITS  # lazy: CLI start-up loads a command's modules only when it runs

        out = Path(out or PACKED_DIR)
        return [("--out", out, "dir", None), *(("--out", out / split, "dir", SHARD_FILES) for split in SPLITS),
                ("--out", out / "manifest.json", "file", None)]
    if command == "compute-column":
        return [("--out", Path(out), "dir", None), *(("--out", Path(out) / f"table2_compute.{ext}", "file", None)
                                                     for ext in ("csv", "md")),
                ("--metrics", Path(args.metrics), "file", None)]
    if command == "table1-speed":
        # lazy: CLI start-up loads a command's modules only when it runs
        from tadm.experiments.table1_speed import SPEED_DIR, speed_block_path

        return [("--out", Path(out) if out else speed_block_path(args.block, Path(args.root) / SPEED_DIR), "file", None)]
    if command == "throughput":
        from tadm.experiments import throughput_results  # lazy: CLI start-up loads a command's modules only when it runs

        if args.block is not None:
            paths = [("--out", Path(out or throughput_results.block_path(args.block, args.blocks)), "file", None)]
        else:
            paths = [("--out", Path(out or throughput_results.OUT), "file", None)]
        if args.table or args.block is None:
            paths.append(("--table", Path(args.table or throughput_results.TABLE), "file", None))
        if args.block is not None or args.run_blocks:
            paths.append(("--blocks", Path(args.blocks), "dir", None))
        return paths
    return []


def check_outputs(args) -> None:
    """Refuse, before any work, an output flag naming an existing folder where a file is written,
    an existing file where a folder is, or a folder that is replaced and holds what its writer did
    not write: one ConfigError line naming the flag and the path (tadm.io.check_output_path)."""
    from tadm.io import check_output_path  # lazy: tadm.io (~13 ms) loads once a command runs, not for `python -m tadm --help`

    for flag, path, kind, ours in output_paths(args):
        check_output_path(path, kind, flag, f"python -m tadm {args.command}", ours)
