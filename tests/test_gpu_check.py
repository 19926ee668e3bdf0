"""benchmarks/gpu_check.py runs on a GPU only when a session is lent one; its --smoke mode runs
every section at micro sizes on the CPU here so that it cannot rot in between."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import micro_raw

ROOT = Path(__file__).resolve().parent.parent


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_smoke_runs_every_section(tmp_path):
    # (b), kill and resume, is covered on the CPU by tests/train; it takes three processes here
    out = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--smoke", "--sections", "acde",
                          "--device", "cpu", "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    rows = json.loads((tmp_path / "gpu_check_smoke.json").read_text())["rows"]
    sections = {r["section"].split()[0] for r in rows if r["check"] != "FAILED"}
    assert {"a", "c", "d", "e"} <= sections
    assert not [r for r in rows if r["check"] == "FAILED"]
    # training with runtime.compile off and on, model FLOPs from tadm.compute
    trained = [r for r in rows if r["section"] == "a train"]
    for name in ("mdlm", "tadm"):
        for tag in ("compile off", "compile on, aot_eager"):
            assert any(r["check"].startswith(f"{name} tokens/s") and tag in r["check"] for r in trained), (name, tag)
    assert all("model FLOPs" in r["note"] for r in trained if "tokens/s" in r["check"])
    # the heads' readout checkpointed against kept, side by side: recomputing the heads costs time
    head = [r for r in trained if r["check"] == "head readout: checkpointed / kept step time"]
    assert head and float(head[0]["value"]) > 0 and "alternating rounds" in head[0]["note"], head
    # the sampling rows carry measured / FLOP-bound ratios for every method and K: batch 1 first
    # (the whole trajectory), the CUDA-graph row (skipped on the CPU), the probed largest batch,
    # and that batch timed on the first steps of the T-step trajectory
    sampled = [r["check"] for r in rows if r["section"] == "c sample"]
    for label in ("mdlm", "adlm", "tadm K=1", "tadm K=2", "tadm K=4", "tadm K=8"):
        assert any(c == f"{label} batch 1 T=8" for c in sampled), label
        assert any(c.startswith(f"{label} batch 4 T=8 (first 4 steps timed)") for c in sampled), label
    assert sampled[0] == "mdlm batch 1 T=8"
    graphs = [r for r in rows if r["check"] == "CUDA graphs batch 1 (runtime.cuda_graphs)"]
    assert graphs and graphs[0]["value"] == "skipped" and "ignored on cpu" in graphs[0]["note"]
    assert any(c.startswith("largest batch (first 2 steps of T=8") for c in sampled)


def test_child_processes_get_the_repository_prepended_to_pythonpath(monkeypatch):
    gc = _gpu_check()
    monkeypatch.setenv("PYTHONPATH", "/tmp/tadm-site")
    assert gc.subprocess_env()["PYTHONPATH"].split(":") == [str(ROOT), "/tmp/tadm-site"]
    monkeypatch.delenv("PYTHONPATH")
    assert gc.subprocess_env()["PYTHONPATH"] == str(ROOT)
    assert gc.RESUME_STEPS >= 40 and gc.KILL_AT < gc.RESUME_STEPS // 4


def test_the_batch_probe_ends_on_any_runtime_error_and_keeps_the_last_batch_that_ran(monkeypatch):
    """cuBLAS / cuDNN allocation failures are plain RuntimeErrors, not torch.OutOfMemoryError:
    the probe stops on either and the section goes on (simulated: no GPU needed)."""
    gc = _gpu_check()
    for name in ("reset_peak_memory_stats", "empty_cache"):
        monkeypatch.setattr(torch.cuda, name, lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a, **k: 2**30)
    seen = []

    def fake_sample(models, name, k, steps, batch, L, device, precision, stop_after=None):
        seen.append((name, steps, batch, stop_after))
        if batch >= 8:
            raise RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")
        return 1.0, 1, stop_after

    monkeypatch.setattr(gc, "_sample_once", fake_sample)
    big, note = gc._largest_batch({}, 1024, 2048, torch.device("cuda"), "bf16", cap=256, probe_steps=4)
    assert big == 4 and "batch 8: RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED" in note
    # probed on the first 4 steps of a T = 2048 trajectory, not on a 2-step trajectory
    assert {(steps, stop) for _, steps, _, stop in seen} == {(2048, 4)}

    def oom(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(gc, "_sample_once", oom)
    big, note = gc._largest_batch({}, 1024, 2048, torch.device("cuda"), "bf16", cap=256, probe_steps=4, estimate=300)
    assert big == 0 and note.startswith("batch 1: OutOfMemoryError") and "nothing runs" in note  # not "batch 1"

    monkeypatch.setattr(gc, "_sample_once", lambda *a, **k: (1.0, 1, 4))  # nothing fails: the cap ends it
    seen_cap = gc._largest_batch({}, 1024, 2048, torch.device("cuda"), "bf16", cap=16, probe_steps=4, estimate=8)
    assert seen_cap[0] == 16 and "no failure up to the cap 16 (memory estimate: 8)" in seen_cap[1]


def test_the_batch_cap_is_twice_the_memory_estimate_rounded_up_to_a_power_of_two():
    gc = _gpu_check()
    from tadm import config

    p = config.from_dict(micro_raw())
    per = gc.sampling_bytes_per_sequence(p, "bf16")
    L, V = p.packing.seq_len, p.tokenizer.vocab_size
    assert per > 3 * 4 * L * (V + 1)  # at least the anchor head's logits, softmax and fp32 copy
    cap, estimate = gc.batch_cap(p, "bf16", total_bytes=100 * per + 10, weights_bytes=10)
    assert (estimate, cap) == (100, 256)
    assert gc.batch_cap(p, "bf16", total_bytes=per // 2)[0] == 2  # less than one sequence: probe 1 and 2
    # the paper profile on a 141 GB GPU: the estimate is a few hundred sequences, beyond the old fixed 256
    paper = config.from_dict(config.render_profile("paper"))
    cap, estimate = gc.batch_cap(paper, "bf16", total_bytes=141 * 10**9, weights_bytes=10**9)
    assert cap >= 2 * estimate and 128 < estimate < 1024


@pytest.mark.parametrize("name", ["mdlm", "tadm"])
def test_mfu_uses_the_model_flops_of_tadm_compute(name):
    """No recomputed head: the step's model FLOPs are 3 x tadm.compute's forward, with the LM
    head on half the rows (the expected masked fraction)."""
    from tadm import config
    from tadm.compute import dit_block_flops, fusion_flops, lm_head_flops, train_step_flops_per_token

    p = config.from_dict(config.render_profile("paper"))
    m, V, L = p.model, p.tokenizer.vocab_size, p.packing.seq_len
    blk, head = dit_block_flops(m.d_model, L, m.mlp_ratio), lm_head_flops(m.d_model, V + 1)
    forward = (m.mdlm_layers * blk + head / 2 if name == "mdlm"
               else (m.anchor_layers + m.denoiser_layers) * blk + fusion_flops(m.d_model) + head)
    assert train_step_flops_per_token(name, m, V, L) == pytest.approx(3 * forward)


def test_the_pre_flight_names_what_is_missing_before_any_section_runs(monkeypatch, capsys):
    import transformers  # looked up here: building the hub stand-ins replaces sys.modules' entry

    gc = _gpu_check()
    import shutil

    ran = []
    monkeypatch.setattr(gc, "SECTIONS", {k: (lambda *a, k=k: ran.append(k)) for k in "abcde"})
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(shutil, "which", lambda name: None)  # no compiler on PATH
    assert gc.main(["--device", "cpu", "--sections", "a", "--compile-backend", "inductor"]) == 2
    err = capsys.readouterr().err
    assert ran == [] and "pre-flight failed, no section ran: C compiler (Inductor): none on PATH" in err
    assert "--compile-backend aot_eager" in err
    # what a section does not need is not asked for: aot_eager, or no training section
    assert gc.preflight(torch.device("cpu"), "a", "aot_eager") == []
    assert gc.preflight(torch.device("cpu"), "cd", "inductor") == []
    assert [(ok, detail) for _, ok, detail in gc.preflight(torch.device("cpu"), "cde", "inductor")] == [
        (True, transformers.__version__)]  # section e: DiffusionGemma's transformers


def test_the_pre_flight_stops_section_e_on_an_older_transformers(monkeypatch, capsys):
    import transformers  # looked up here: building the hub stand-ins replaces sys.modules' entry

    gc = _gpu_check()
    ran = []
    monkeypatch.setattr(gc, "SECTIONS", {k: (lambda *a, k=k: ran.append(k)) for k in "abcde"})
    monkeypatch.setattr(transformers, "__version__", "5.17.0")
    assert gc.main(["--device", "cpu", "--sections", "e"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert ran == [] and len(err) == 1
    assert err[0].startswith("gpu_check: pre-flight failed, no section ran: transformers >= 5.24 (DiffusionGemma")
    assert "5.17.0 installed" in err[0] and "pip install --no-deps --no-index ./transformers-5.24.0-py3-none-any.whl" in err[0]
    assert gc.main(["--device", "cpu", "--sections", "d"]) == 0 and ran == ["d"]  # the others need no DiffusionGemma
