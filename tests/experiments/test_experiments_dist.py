"""One process against two (torchrun, gloo on the CPU): Table 2's samples and scores, Table 1
and the ASRD comparison come out the same, the work split over the processes in batches and
gathered in order (`tadm.experiments.worker`)."""

from __future__ import annotations

import json

import numpy as np
import torch
import pytest

from tadm import config
from tadm.data.tokenizer import load_tokenizer
from tadm.experiments import jobs, table2, worker
from tests.experiments.conftest import posttrain_raw, table2_raw

pytestmark = pytest.mark.slow

SCORES = ("mauve", "gen_ppl", "entropy", "layer_calls", "anchor_calls", "flops_per_token", "refreshes_per_trajectory",
          "examples", "sampler", "policy", "T")


@pytest.mark.parametrize("row", ["tadm", "ar"])
def test_two_processes_draw_and_score_what_one_does(row, table2_workspace, evaluator_dir, micro_packed, tmp_path):
    tok = load_tokenizer(micro_packed.parent / "tokenizer")
    results = {}
    for nproc in (1, 2):
        # separate evaluator caches: the two-process run featurizes the references itself
        p = config.from_dict(table2_raw(table2_workspace, evaluator_dir, **{"runtime.nproc": nproc,
                                                                             "eval.cache_dir": str(tmp_path / f"cache{nproc}")}))
        assert worker.needs_launch(p, "row") == (nproc > 1)
        scorer = table2.Scorer(p, tok, micro_packed)
        out = tmp_path / f"n{nproc}"
        results[nproc] = table2.run_row(row, p, scorer, models_dir=table2_workspace / "models", samples_dir=out,
                                        out=out / f"{row}.json")
        assert scorer._evaluator is None or nproc == 1  # the launching process loaded nothing
        assert json.loads((out / f"{row}.json").read_text()) == results[nproc]
    for T in ("8", "16"):
        one, two = results[1]["budgets"][T], results[2]["budgets"][T]
        assert {k: one[k] for k in SCORES} == {k: two[k] for k in SCORES}
        for name in (f"T{T}.npy", f"T{T}_gen_ppl.npy"):
            a, b = np.load(tmp_path / "n1" / row / name), np.load(tmp_path / "n2" / row / name)
            assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), name
        rec1, rec2 = (json.loads((tmp_path / f"n{n}" / row / f"T{T}.json").read_text()) for n in (1, 2))
        assert (rec1["processes"], rec2["processes"]) == (1, 2)
        assert rec1["counters"] == rec2["counters"] and rec1["batch_seeds"] == rec2["batch_seeds"]
    refs = [sorted((tmp_path / f"cache{n}").glob("reference_features-*.npy")) for n in (1, 2)]
    assert [r.name for r in refs[0]] == [r.name for r in refs[1]] and len(refs[0]) == 1
    assert refs[0][0].read_bytes() == refs[1][0].read_bytes()


def _same(a: dict, b: dict, keys: tuple[str, ...]) -> None:
    assert {k: a[k] for k in keys} == {k: b[k] for k in keys}


def test_how_many_processes_each_job_runs_in(monkeypatch):
    """runtime.nproc > 1 is every job's count; on a CPU runtime.cpu_processes splits Table 1, its
    timing blocks and ASRD only; on a GPU it is ignored."""
    from tadm import runtime

    def procs(job, **keys):
        return worker.processes(config.from_dict(posttrain_raw(**keys)), job)

    assert [procs(j, **{"runtime.nproc": 4, "runtime.cpu_processes": 2}) for j in jobs.JOBS] == [4] * len(jobs.JOBS)
    split = {j: procs(j, **{"runtime.cpu_processes": 2}) for j in jobs.JOBS}
    assert split == {"row": 1, "sweep": 1, "table1": 2, "table1_speed": 2, "asrd": 2}
    assert all(procs(j) == 1 for j in jobs.JOBS)  # cpu_processes 1
    monkeypatch.setattr(runtime, "resolve_device", lambda setting="auto": torch.device("cuda", 0))
    assert all(procs(j, **{"runtime.cpu_processes": 2}) == 1 for j in jobs.JOBS)


@pytest.mark.parametrize("keys", [{"runtime.nproc": 2}, {"runtime.cpu_processes": 2}], ids=["nproc", "cpu_processes"])
def test_table1_two_processes_score_what_one_does(keys, posttrain_workspace, tmp_path):
    from tadm.experiments import table1

    results = {}
    for nproc in (1, 2):
        p = config.from_dict(posttrain_raw(**(keys if nproc == 2 else {})))
        assert worker.needs_launch(p, "table1") == (nproc > 1)
        results[nproc] = table1.run(p, root=posttrain_workspace, sft_dir=posttrain_workspace / "data" / "sft",
                                    out=tmp_path / f"table1_{nproc}.json", log=lambda *_: None)
        assert json.loads((tmp_path / f"table1_{nproc}.json").read_text()) == results[nproc]
    one, two = results[1]["tasks"]["arithmetic"], results[2]["tasks"]["arithmetic"]
    assert one["n"] == two["n"] == 8  # three prompt batches of 3, 3, 2
    assert list(one["methods"]) == list(two["methods"]) == [
        "Base", table1.CONTROL, "TADM K=1", "TADM K=2", "TADM K=3",
        "Naive reuse K=2", "Naive reuse K=3", "Feature cache K=2", "Feature cache K=3"]
    for label in one["methods"]:
        _same(one["methods"][label], two["methods"][label],
              ("accuracy_seeds", "correct_seeds", "layer_calls", "layer_calls_weighted", "examples", "flops",
               "decoder_flops", "layer_calls_per_step"))
    for r in (one, two):  # the speed-ups pair each method's batch times with the base's, in one order
        base = r["methods"]["Base"]
        assert base["throughput_x"] == 1.0 and base["decoder_speedup_x"] == 1.0
        assert all(len(m["seconds"]) == len(base["seconds"]) and m["throughput_x"] > 0 for m in r["methods"].values())
    # every full batch is timed, whichever process ran it (the two full batches of 3; one ran on each)
    assert len(one["methods"]["Base"]["seconds"]) == len(two["methods"]["Base"]["seconds"]) == 2


def test_a_timing_block_in_two_processes_times_every_batch_once(posttrain_workspace, tmp_path):
    from tadm.experiments import table1

    blocks = {}
    for n in (1, 2):
        p = config.from_dict(posttrain_raw(**{"runtime.cpu_processes": n, "timing.table1_blocks": 2,
                                              "timing.table1_batches": 2}))
        out = tmp_path / f"block_{n}.json"
        blocks[n] = table1.time_block(p, 1, root=posttrain_workspace, sft_dir=posttrain_workspace / "data" / "sft",
                                      out=out)
        assert json.loads(out.read_text()) == json.loads(json.dumps(blocks[n]))
    one, two = (blocks[n]["results"]["arithmetic"] for n in (1, 2))
    assert one["batches"] == two["batches"] and len(one["batches"]) == 2
    for label, m in one["methods"].items():
        assert len(m["seconds"]) == len(two["methods"][label]["seconds"]) == 2
        assert len(two["methods"][label]["decoder_seconds"]) == 2 and two["methods"][label]["throughput_x"] > 0


def test_asrd_two_processes_score_what_one_does(posttrain_workspace, tmp_path):
    from tadm.experiments.asrd import compare

    results = {}
    for nproc in (1, 2):
        p = config.from_dict(posttrain_raw(**{"runtime.nproc": nproc}))
        results[nproc] = compare.run(p, root=posttrain_workspace, out=tmp_path / f"asrd_{nproc}.json",
                                     log=lambda *_: None)
    assert [(g["task"], g["model"]) for g in results[1]["groups"]] == [(g["task"], g["model"]) for g in results[2]["groups"]]
    for g1, g2 in zip(results[1]["groups"], results[2]["groups"]):
        assert g1["n"] == g2["n"] and list(g1["methods"]) == list(g2["methods"])
        for label in g1["methods"]:
            _same(g1["methods"][label], g2["methods"][label],
                  ("accuracy_seeds", "calls_per_batch", "layer_calls_per_batch",
                   "refreshes_per_batch", "remasked_per_sequence", "verified_per_sequence", "examples", "settings"))
    sweeps = results[1]["sweeps"]["points"]
    assert sweeps and len(sweeps) == len(results[2]["sweeps"]["points"])
    for s1, s2 in zip(sweeps, results[2]["sweeps"]["points"]):
        for side in ("asrd", "base"):
            _same(s1[side], s2[side], ("accuracy_seeds", "calls_per_batch", "remasked_per_sequence", "verified_per_sequence"))


def test_a_failed_worker_run_names_the_workers_error_first(tmp_path):
    """torchrun's failure summary fills the output's last lines; the error's first line must name
    what failed in the worker (here every rank's one-line DataError: no SFT data under the root)."""
    from tadm.errors import TadmError

    p = config.from_dict(posttrain_raw(**{"runtime.nproc": 2}))
    with pytest.raises(TadmError) as e:
        worker.launch("table1", p, {"root": str(tmp_path), "sft_dir": str(tmp_path / "no-sft"),
                                    "out": str(tmp_path / "t1.json"), "unsafe_host_execution": False, "control": True},
                      log=lambda line: None)
    first = str(e.value).splitlines()[0]
    assert "failed with exit code" in first and str(tmp_path) in first, first


def test_failure_cause_reads_a_traceback_or_an_error_line():
    c = worker.FailureCause()
    for line in ["noise\n", "[rank1]: Traceback (most recent call last):\n", '[rank1]:   File "x.py", line 1\n',
                 "[rank1]: KeyError: 'sanity'\n", "error: later\n"]:
        c.read(line)
    assert c.line == "KeyError: 'sanity'" and len(c.traceback) == 3
    c = worker.FailureCause()
    c.read("error: data/sft: no manifest.json\n")
    assert c.line == "data/sft: no manifest.json" and not c.traceback


def test_the_launcher_knows_every_job_the_entry_point_runs():
    """worker.JOB_NAMES (what launch accepts) and jobs.JOBS (what the processes run) are one list."""
    assert worker.JOB_NAMES == tuple(jobs.JOBS)
    assert set(worker.CPU_SPLIT_JOBS) <= set(jobs.JOBS)
