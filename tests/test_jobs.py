"""The train stage's job pool (`tadm.runtime.run_jobs`, runtime.jobs): independent runs side by
side with the CPU's threads split between them, the longest first, and a failure that stops new
starts, lets the running ones finish and names itself."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tadm import cli, config, runtime
from tadm.errors import TadmError

SCRIPT = """
import os, sys, time
out, seconds, rc = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
start = time.time()
time.sleep(seconds)
open(out, "w").write(f"{start} {time.time()} {os.environ.get('OMP_NUM_THREADS')}")
sys.exit(rc)
"""


def _job(tmp_path: Path, name: str, seconds: float, rc: int = 0) -> tuple[str, list[str]]:
    return name, [sys.executable, "-c", SCRIPT, str(tmp_path / name), str(seconds), str(rc)]


def _record(tmp_path: Path, name: str) -> tuple[float, float, str]:
    start, end, threads = (tmp_path / name).read_text().split()
    return float(start), float(end), threads


def test_jobs_run_side_by_side_with_the_threads_split(tmp_path):
    seconds = runtime.run_jobs([_job(tmp_path, n, 1.0) for n in ("a", "b", "c")], jobs=2, log=lambda *_: None)
    assert set(seconds) == {"a", "b", "c"}
    a, b, c = (_record(tmp_path, n) for n in "abc")
    assert a[0] < b[1] and b[0] < a[1]  # a and b overlapped
    assert c[0] >= min(a[1], b[1]) - 0.05  # c waited for a free slot
    assert {a[2], b[2], c[2]} == {str(runtime.job_threads(2))}


def test_one_job_at_a_time_keeps_the_threads(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    runtime.run_jobs([_job(tmp_path, n, 0.2) for n in ("a", "b")], jobs=1, log=lambda *_: None)
    a, b = _record(tmp_path, "a"), _record(tmp_path, "b")
    assert b[0] >= a[1] - 0.05 and a[2] == "None"


def test_a_failed_job_stops_new_starts_lets_the_running_finish_and_names_itself(tmp_path):
    jobs = [_job(tmp_path, "broken", 0.1, rc=3), _job(tmp_path, "slow", 1.5), _job(tmp_path, "never", 0.1)]
    with pytest.raises(TadmError, match=r"1 job\(s\) failed: broken \(exit code 3"):
        runtime.run_jobs(jobs, jobs=2, log=lambda *_: None)
    assert (tmp_path / "slow").is_file()  # finished, not killed: its checkpoints would stay
    assert not (tmp_path / "never").exists()


def test_job_threads_split_the_cores():
    assert runtime.job_threads(2, cores=2) == 1 and runtime.job_threads(2, cores=8) == 4
    assert runtime.job_threads(3, cores=2) == 1 and runtime.job_threads(1, cores=2) == 2
    # what run_jobs sets and the train stage records: the inherited setting for one job at a time
    assert runtime.threads_per_job(1) is None and runtime.threads_per_job(2) == runtime.job_threads(2)


def test_a_job_after_another_waits_for_it_and_the_free_slot_goes_to_the_next_ready(tmp_path):
    jobs = [_job(tmp_path, "base", 0.6), _job(tmp_path, "fusion", 0.2), _job(tmp_path, "other", 0.2)]
    runtime.run_jobs(jobs, jobs=2, log=lambda *_: None, after={"fusion": ["base"]})
    base, fusion, other = (_record(tmp_path, n) for n in ("base", "fusion", "other"))
    assert other[0] < base[1]  # "fusion" was not ready, so "other" took the second slot
    assert fusion[0] >= base[1] - 0.05


def test_a_job_whose_prerequisite_failed_never_starts_and_unknown_names_are_errors(tmp_path):
    with pytest.raises(TadmError, match=r"1 job\(s\) failed: base"):
        runtime.run_jobs([_job(tmp_path, "base", 0.1, rc=1), _job(tmp_path, "fusion", 0.1)], jobs=2,
                         log=lambda *_: None, after={"fusion": ["base"]})
    assert not (tmp_path / "fusion").exists()
    with pytest.raises(TadmError, match="after names \\['nowhere'\\]"):
        runtime.run_jobs([_job(tmp_path, "a", 0.1)], jobs=1, log=lambda *_: None, after={"a": ["nowhere"]})
    with pytest.raises(TadmError, match="wait for each other"):
        runtime.run_jobs([_job(tmp_path, "a", 0.1), _job(tmp_path, "b", 0.1)], jobs=2, log=lambda *_: None,
                         after={"a": ["b"], "b": ["a"]})


def test_the_train_stage_runs_every_network_the_longest_first():
    from argparse import Namespace

    p = config.from_dict(config.render_profile("default"))
    jobs = cli.train_jobs(p, Namespace(runs=[], params="params.yaml", data="data/packed", restart=False))
    replicates = [f"{r}-s{s}" for r in p.train.replicate_models for s in range(1, p.train.replicates)]
    assert p.train.replicates >= 3 and set(p.train.replicate_models) == {"mdlm", "tadm", "tadm_gamma0"}
    assert [name for name, _, _ in jobs][:len(p.train.models) + len(replicates) + 5] == [
        *p.train.models, *replicates, "evaluator", "dg_base", "asrd_model", "dg_posttrain", "dg_posttrain_fresh"]
    by_name = {name: (argv, c) for name, argv, c in jobs}
    # a replicate: the same run with --replicate k (seed + k), at the main run's cost
    assert by_name["tadm-s2"][0][-5:-2] == ["tadm", "--replicate", "2"] and by_name["tadm-s2"][1] == by_name["tadm"][1]
    assert by_name["dg_posttrain_fresh"][0][-2:] == ["dg-posttrain", "--fresh-anchor"]
    assert "--fresh-anchor" not in by_name["dg_posttrain"][0]
    # the fusion replicates (posttrain.replicates), after the tables' fusions
    fusions = [f"{n}-s{s}" for s in range(1, p.posttrain.replicates) for n in ("dg_posttrain", "dg_posttrain_fresh")]
    assert [name for name, _, _ in jobs][len(p.train.models) + len(replicates) + 5:] == fusions
    assert set(cli.TRAIN_AFTER) == {"dg_posttrain", "dg_posttrain_fresh"}  # on the frozen base
    assert all(after == ("dg_base",) for after in cli.TRAIN_AFTER.values())
    cost = {name: c for name, _, c in jobs}
    # the order of the one-thread times (metrics/train/jobs.json): the judge (4 layers, 1500 steps of
    # 64: 685 s, benchmarks/results/judge.md) ~ dg_base 698 s > TADM 447, ADLM 399 > the ASRD model
    # 356 > MDLM-sized runs 253-267 > the fusions 108-117 (which wait for dg_base anyway)
    assert cost["evaluator"] > cost["dg_base"] > cost["tadm"] == cost["tadm_gamma0"] == cost["adlm"]
    assert cost["adlm"] > cost["mdlm"] == cost["sedd"] == cost["ar"]
    assert cost["asrd_model"] > cost["mdlm"] > cost["dg_posttrain"] == cost["dg_posttrain_fresh"]
    assert cost["evaluator"] / cost["mdlm"] == pytest.approx(685 / 253, rel=0.15)
    # a fusion step-token costs 0.62 of a base step-token (measured: 108 s / (200 x 16) against
    # 698 s / (400 x 32)); the proxy's rollout + forward + backward through the denoiser: 38 / 60
    b, pt = p.posttrain.base, p.posttrain
    per_token = (cost["dg_posttrain"] / (pt.steps * pt.batch_size)) / (cost["dg_base"] / (b.steps * b.batch_size))
    assert per_token == pytest.approx(0.62, abs=0.05)
    assert jobs[0][1][:3] == [sys.executable, "-m", "tadm"] and "--restart" not in jobs[0][1]
    only = cli.train_jobs(p, Namespace(runs=["mdlm", "tadm"], params="params.yaml", data="d", restart=True))
    assert [name for name, _, _ in only] == ["mdlm", "tadm"] and only[0][1][-4:] == ["mdlm", "--data", "d", "--restart"]


def test_the_train_stage_lists_every_run_of_the_default_profile_and_the_other_networks():
    stage = yaml.safe_load((config.ROOT / "dvc.yaml").read_text())["stages"]["train"]
    outs = [next(iter(o)) if isinstance(o, dict) else o for o in stage["outs"]]
    runs = config.render_profile("default")["train"]["models"]
    others = {"evaluator", "dg_base", "asrd_mdlm"}
    assert sorted(o.split("/")[1] for o in outs if o.startswith("models/")) == sorted([*runs, *others, "dg_tadm", "dg_fresh",
                                                                                      "replicates"])
    assert sorted(o.split("/")[1] for o in outs if o.startswith("checkpoints/")) == \
        sorted([*runs, *others, "dg_posttrain", "dg_posttrain_fresh", "replicates"])
    assert "metrics/train/replicates" in outs
    assert {f"metrics/train/{r}.json" for r in runs} <= {next(iter(m)) for m in stage["metrics"]}
    assert "data/asrd" in outs and "metrics/train/jobs.json" in outs


def _tadm_at_default(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    """`python -m tadm argv` on the default profile's params (written here: the checkout's
    params.yaml may be switched to another profile), from the repository root."""
    params = config.write_profile("default", tmp_path / "params.yaml")
    return subprocess.run([sys.executable, "-m", "tadm", "--params", str(params), *argv], capture_output=True,
                          text=True, cwd=config.ROOT)


def test_a_run_outside_train_models_is_one_line(tmp_path):
    out = _tadm_at_default(tmp_path, "train", "mdlm", "gpt5")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().count("\n") == 0 and "train.models: has no run 'gpt5'" in out.stderr


def test_a_replicate_outside_train_replicates_or_of_several_runs_is_one_line(tmp_path):
    for argv, message in ((["train", "mdlm", "--replicate", "7"], "train.replicates: is 3: there is no training replicate 7"),
                          (["train", "mdlm", "tadm", "--replicate", "1"], "--replicate needs exactly one run")):
        out = _tadm_at_default(tmp_path, *argv)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert out.stderr.strip().count("\n") == 0 and message in out.stderr, out.stderr


def test_a_run_named_twice_is_one_line(tmp_path):
    out = _tadm_at_default(tmp_path, "train", "mdlm", "mdlm")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().count("\n") == 0 and "run 'mdlm' named more than once" in out.stderr
