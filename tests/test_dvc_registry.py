"""dvc.yaml's per-method entries against the registries: every run of the default profile's
train.models has its train-stage outputs, every Table 2 row of those runs its sample stage, and
nothing else; a failure prints the exact lines to add to (or drop from) dvc.yaml."""

from __future__ import annotations

import yaml

from tadm import config
from tadm.experiments.table2 import ROWS
from tadm.registry import METHODS


def pipeline() -> dict:
    return yaml.safe_load((config.ROOT / "dvc.yaml").read_text())["stages"]


def default_runs() -> list[str]:
    return list(config.render_profile("default")["train"]["models"])


def train_lines_missing(runs: list[str], stage: dict) -> list[str]:
    """The lines of dvc.yaml's train stage that `runs` need and it lacks."""
    outs = {next(iter(o)) if isinstance(o, dict) else o: o for o in stage["outs"]}
    metrics = {next(iter(m)) if isinstance(m, dict) else m for m in stage.get("metrics", [])}
    missing = []
    for run in runs:
        checkpoint = outs.get(f"checkpoints/{run}")
        if not (isinstance(checkpoint, dict) and checkpoint[f"checkpoints/{run}"].get("persist")):
            missing += ["    outs:", f"      - checkpoints/{run}:", "          persist: true"]
        if f"models/{run}" not in outs:
            missing += ["    outs:", f"      - models/{run}"]
        if f"metrics/train/{run}.json" not in metrics:
            missing += ["    metrics:", f"      - metrics/train/{run}.json:", "          cache: false"]
    return missing


def sample_lines(runs: list[str], foreach: dict) -> tuple[list[str], list[str]]:
    """(lines to add to, entries to drop from) the sample stage's foreach for the rows of `runs`."""
    rows = [r for r in ROWS.values() if r.model is None or r.model in runs]  # Data, then every unit's rows
    want = {r.name: ("data/packed/manifest.json" if r.model is None else f"models/{r.model}") for r in rows}
    add = [f"      {name}: {{dep: {dep}}}" for name, dep in want.items() if (foreach.get(name) or {}).get("dep") != dep]
    drop = [f"      {name}: ..." for name in foreach if name not in want]
    return add, drop


def test_every_run_has_its_train_stage_outputs():
    runs = default_runs()
    assert [r for r in runs if r not in METHODS] == [], "train.models names runs no method unit registers"
    missing = train_lines_missing(runs, pipeline()["train"])
    assert not missing, "dvc.yaml, stage train: add\n" + "\n".join(missing)


def test_every_table2_row_of_the_default_runs_has_its_sample_stage():
    add, drop = sample_lines(default_runs(), pipeline()["sample"]["foreach"])
    assert not add and not drop, ("dvc.yaml, stage sample's foreach:" + ("\nadd\n" + "\n".join(add) if add else "")
                                  + ("\ndrop (no registered row of train.models)\n" + "\n".join(drop) if drop else ""))


def test_a_new_run_gets_the_exact_lines_it_needs():
    """A run the registry knows and dvc.yaml does not: the lines printed are the ones to paste."""
    stages = pipeline()
    assert train_lines_missing(["mdlm", "newrun"], stages["train"]) == [
        "    outs:", "      - checkpoints/newrun:", "          persist: true", "    outs:", "      - models/newrun",
        "    metrics:", "      - metrics/train/newrun.json:", "          cache: false"]
    foreach = {k: v for k, v in stages["sample"]["foreach"].items() if k != "remdm"}
    assert sample_lines(default_runs(), foreach) == (["      remdm: {dep: models/mdlm}"], [])
    assert sample_lines([r for r in default_runs() if r != "sedd"], stages["sample"]["foreach"]) == \
        ([], ["      sedd: ..."])
