"""The step-time model (tadm.step_time): its parts against their closed forms, each switch
moving the part it names, and benchmarks/results/step_time.md equal to a fresh render."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys

import pytest

from tadm import compute, config
from tadm.forward_process import masked_rows_capacity
from tadm.step_time import (
    CE_BYTES_EAGER, CE_BYTES_COMPILED, H100, H200, Code, sampling_step, training_step,
)
from tadm.config import ROOT


@pytest.fixture(scope="module")
def paper():
    return config.from_dict(config.render_profile("paper"))


def test_model_flops_are_tadm_compute_s_and_mfu_their_share_of_the_peak(paper):
    for kind in ("mdlm", "adlm", "tadm", "tadm_gamma0", "sedd", "ar"):
        s = training_step(kind, paper, H100)
        tokens = paper.train.micro_batch * paper.packing.seq_len
        assert s.model_flops == compute.train_step_flops_per_token(kind, paper.model, paper.tokenizer.vocab_size,
                                                                   paper.packing.seq_len) * tokens
        assert math.isclose(s.mfu, s.model_flops / (sum(s.parts.values()) * H100.peak_flops))
        assert 0.1 < s.mfu < 0.6, (kind, s.mfu)
    with pytest.raises(ValueError, match="unknown training method"):
        training_step("nope", paper, H100)


def test_each_switch_moves_its_own_part(paper):
    now = training_step("mdlm", paper, H100)
    B, L = paper.train.micro_batch, paper.packing.seq_len
    exact = training_step("mdlm", paper, H100, Code(capacity_rows=False))
    # the head's rows: the readout's capacity against the mean masked rows
    ratio = masked_rows_capacity(B, L, 1e-3) / (compute.MASKED_FRACTION * B * L)
    assert math.isclose(now.parts["LM heads (GEMMs)"] / exact.parts["LM heads (GEMMs)"], ratio)
    checkpointed = training_step("mdlm", paper, H100, Code(kept_logits=False))
    assert math.isclose(checkpointed.parts["LM heads (GEMMs)"] / now.parts["LM heads (GEMMs)"], 4 / 3)
    eager_head = training_step("mdlm", paper, H100, Code(compiled_head=False))
    assert math.isclose(now.parts["cross-entropy (elementwise)"] / eager_head.parts["cross-entropy (elementwise)"],
                        CE_BYTES_COMPILED / CE_BYTES_EAGER)
    synced = training_step("mdlm", paper, H100, Code(host_syncs=3))
    assert synced.parts["host syncs"] == 3 * H100.sync_seconds and now.parts["host syncs"] == 0
    eager = training_step("mdlm", paper, H100, Code(compiled_blocks=False))
    assert eager.parts["elementwise (blocks)"] > now.parts["elementwise (blocks)"]
    bf16 = training_step("mdlm", paper, H100, Code(residual_bytes=2))
    assert math.isclose(bf16.parts["elementwise (blocks)"] / now.parts["elementwise (blocks)"], 4 / 6)
    # the residual's size follows train.residual unless the code says otherwise
    asked = dataclasses.replace(paper, train=dataclasses.replace(paper.train, residual="bf16"))
    assert training_step("mdlm", asked, H100).parts == bf16.parts
    # only memory-bound parts depend on HBM bandwidth
    h200 = training_step("mdlm", paper, H200)
    assert h200.parts["GEMMs (blocks, fusion)"] == now.parts["GEMMs (blocks, fusion)"]
    assert h200.parts["elementwise (blocks)"] < now.parts["elementwise (blocks)"]


def test_sampling_overlaps_host_and_device_only_without_a_read_per_step(paper):
    for batch in (1, 64):
        planned = sampling_step("tadm", paper, H100, batch, 1024, 8)
        stepwise = sampling_step("tadm", paper, H100, batch, 1024, 8, dataclasses.replace(Code(), sampling_plan=False))
        device = planned.parts["device"]
        assert planned.seconds == max(device, stepwise.parts["host"])
        assert stepwise.seconds == device + stepwise.parts["host"] + H100.sync_seconds
        assert planned.tokens_per_s > stepwise.tokens_per_s
        assert planned.tokens == batch * paper.sample.canvas_length / 1024
    # an anchor refreshed every 8 steps: fewer layers per step than MDLM's 12 (the paper's point)
    assert sampling_step("tadm", paper, H100, 64, 1024, 8).seconds < sampling_step("mdlm", paper, H100, 64, 1024).seconds


def test_each_step_reads_its_method_unit(paper):
    """The per-method terms come from the unit (Method.train_head_rows, train_extra_flops,
    sampling_layers, sampling_extra_flops), not from the run's name."""
    from tadm.registry import METHODS

    m, V, d = paper.model, paper.tokenizer.vocab_size, paper.model.d_model
    B, L = paper.train.micro_batch, paper.packing.seq_len
    cap = masked_rows_capacity(B, L, 1e-3)
    rows = {name: METHODS[name](name, paper).train_head_rows(B * L, lambda shift=0.0: ("rows", shift))
            for name in ("mdlm", "sedd", "ar", "adlm", "tadm", "tadm_gamma0")}
    stale = METHODS["tadm"]("tadm", paper).stale_shift
    assert rows == {"mdlm": [("rows", 0.0)], "sedd": [("rows", 0.0)], "ar": [B * L], "adlm": [B * L, ("rows", 0.0)],
                    "tadm": [("rows", 0.0), ("rows", stale)], "tadm_gamma0": [("rows", 0.0)]}
    assert [METHODS[k].train_extra_flops(m, V) for k in ("mdlm", "adlm", "tadm")] == [0, 0, compute.fusion_flops(d)]
    assert METHODS["tadm"].sampling_layers(m, 4) == m.denoiser_layers + m.anchor_layers / 4
    assert METHODS["adlm"].sampling_layers(m, 4) == m.anchor_layers + m.denoiser_layers
    assert METHODS["mdlm"].sampling_layers(m, 4) == m.mdlm_layers
    assert METHODS["adlm"].sampling_extra_flops(m, V) == compute.lm_head_flops(d, V + 1) + compute.dense_flops(V + 1, d)
    # the head's rows of a training step: MDLM's one readout at its capacity
    mdlm = training_step("mdlm", paper, H100, Code(compiled_head=True))
    assert mdlm.parts["LM heads (GEMMs)"] == pytest.approx(
        compute.TRAIN_FORWARD_BACKWARD * cap * compute.lm_head_flops(d, V + 1) / (H100.peak_flops * H100.gemm_efficiency))
    # TADM-dagger samples with TADM's network and Alg. 1: the same step as TADM
    assert sampling_step("tadm_gamma0", paper, H100, 8, 1024, 4).parts == sampling_step("tadm", paper, H100, 8, 1024, 4).parts
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        sampling_step("nope", paper, H100, 8, 1024)


def test_the_results_file_is_what_the_script_renders():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "step_time.py"), "--check"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
