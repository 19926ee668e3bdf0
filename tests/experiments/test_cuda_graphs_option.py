"""runtime.cuda_graphs: CUDA-graph replay of the sampling network's fixed-shape pieces.

Off CUDA the setting is ignored with one note (the draw is the eager one). The replay wrapper's
bookkeeping -- one graph per piece and input shape, static inputs refreshed at every call, the
output copied out of the static buffer, the compute counters' hooks still running, `remove()`
restoring the modules -- is checked here with a stand-in capture that "replays" by running the
forward again into the same static output (no GPU needed); benchmarks/gpu_check (c) measures
the real graphs when a GPU is lent."""

import dataclasses

import numpy as np
import pytest
import torch

from tadm import config, cuda_graphs, runtime
from tadm.errors import ConfigError
from tadm.experiments import sampling
from tadm.models import build_model
from tadm.sampling import FixedInterval, SamplerSettings, make_adapter, sample
from tests.conftest import micro_raw, torch_single_thread

single_thread = pytest.fixture(autouse=True, scope="module", name="single_thread")(torch_single_thread)

V, L = 61, 16


def _model(kind: str) -> torch.nn.Module:
    cfg = dataclasses.replace(config.ModelConfig(), d_model=32, n_heads=2, mdlm_layers=2, anchor_layers=2,
                              denoiser_layers=1)
    torch.manual_seed(0)
    m = build_model(kind, cfg, V, L)
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.1)
    return m.eval()


def replay_capture(forward, args, kwargs, pool):
    """A stand-in for a CUDA-graph capture: the static output, and a replay that recomputes the
    forward on the static inputs into that same buffer (as a graph overwrites its outputs)."""
    out = forward(*args, **kwargs)

    def replay():
        out.copy_(forward(*args, **kwargs))

    return out, replay


def test_off_cuda_the_setting_is_a_note_and_the_wrapper_refuses():
    assert cuda_graphs.cuda_graphs_note(False, runtime.CPU) is None
    assert cuda_graphs.cuda_graphs_note(True, runtime.CPU).startswith("runtime.cuda_graphs: ignored on cpu")
    with pytest.raises(ConfigError, match="runtime.cuda_graphs"):
        cuda_graphs.cuda_graph_forwards([torch.nn.Linear(2, 2)], runtime.CPU)


def test_prepare_model_notes_once_and_samples_eager_on_the_cpu(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sampling, "_NOTED", set())
    p = config.from_dict(micro_raw(**{"runtime.cuda_graphs": True, "runtime.device": "cpu",
                                      "runtime.precision": "fp32"}))
    d = runtime.setup(p.runtime)
    model = _model("mdlm")
    for _ in range(2):
        prepared, handle = sampling.prepare_model(model, p, d)
        assert prepared is model and handle is None and "forward" not in vars(model.blocks[0])
    assert capsys.readouterr().err.count("runtime.cuda_graphs: ignored on cpu") == 1
    assert all(prm.dtype == torch.float32 for prm in model.parameters())  # fp32: nothing cast


@pytest.mark.parametrize("kind,K", [("mdlm", None), ("adlm", None), ("tadm", 2)])
def test_replayed_pieces_give_the_eager_tokens_and_counts(kind, K):
    settings = SamplerSettings(sampler="mdlm", steps=8, nucleus_p=0.9, ddpm_cache=False, seed=3)
    model = _model(kind)

    def run():
        adapter = make_adapter(model, FixedInterval(K)) if K else make_adapter(model)
        with adapter:
            return sample(adapter, settings, num_samples=2, seq_len=L)

    eager = run()
    pieces = sampling.graphed_pieces(model)
    handle = cuda_graphs.cuda_graph_forwards(pieces, runtime.CPU, capture=replay_capture)
    assert cuda_graphs.cuda_graph_forwards(pieces, runtime.CPU, capture=replay_capture).graphs == 0  # not wrapped twice
    graphed = run()
    assert torch.equal(graphed.tokens, eager.tokens)
    assert graphed.counters.as_dict() == eager.counters.as_dict()  # the counting hooks still ran
    # one graph per piece (one input shape each); replayed, not re-captured, at later steps
    assert handle.graphs == len(pieces)
    again = run()
    assert torch.equal(again.tokens, eager.tokens) and handle.graphs == len(pieces)
    # a new batch size is a new graph of each piece that reads the canvas (the conditioning
    # vectors take no input)
    batched = [m for m in pieces if type(m).__name__ != "ConditionEmbedder"]
    adapter = make_adapter(model, FixedInterval(K)) if K else make_adapter(model)
    with adapter:
        sample(adapter, settings, num_samples=3, seq_len=L)
    assert handle.graphs == len(pieces) + len(batched) and len(batched) < len(pieces)
    handle.remove()
    assert handle.graphs == 0 and all("forward" not in vars(m) for m in pieces)
    assert torch.equal(run().tokens, eager.tokens)


def test_pieces_run_eager_while_autograd_records():
    model = _model("mdlm")
    handle = cuda_graphs.cuda_graph_forwards(sampling.graphed_pieces(model), runtime.CPU, capture=replay_capture)
    z = torch.randint(0, V + 1, (2, L))
    out = model.hidden(z)
    out.sum().backward()  # training-style calls bypass the graphs (and keep their autograd graph)
    assert handle.graphs == 0 and model.blocks[0].attn.qkv.weight.grad is not None
    with torch.inference_mode():
        assert np.array_equal(model.hidden(z).numpy(), out.detach().numpy())
    assert handle.graphs == len(sampling.graphed_pieces(model))


def test_an_output_kept_across_calls_is_not_overwritten_by_the_next_replay():
    """A graph writes every replay into the same static output: callers that keep an output
    (the anchor cache, ddpm_cache's hidden states) get their own copy."""
    lin = torch.nn.Linear(4, 4)
    cuda_graphs.cuda_graph_forwards([lin], runtime.CPU, capture=replay_capture)
    with torch.inference_mode():
        x1, x2 = torch.randn(2, 4), torch.randn(2, 4)
        first = lin(x1)
        kept = first.clone()
        second = lin(x2)
        assert torch.equal(first, kept) and not torch.equal(first, second)
        assert torch.equal(second, torch.nn.functional.linear(x2, lin.weight, lin.bias))


def test_runtime_compile_compiles_the_sampling_blocks_on_a_gpu_from_batch_8(monkeypatch):
    """`compiles_sampling`: runtime.compile, CUDA and sample.batch_size >= 8 (below, launches
    bound a step and CUDA graphs are the remedy); off any of them prepare_model compiles nothing."""
    cuda, cpu = torch.device("cuda", 0), runtime.CPU
    for compile_, batch, device, expected in ((True, 8, cuda, True), (True, 64, cuda, True), (True, 7, cuda, False),
                                              (False, 64, cuda, False), (True, 64, cpu, False)):
        p = config.from_dict(micro_raw(**{"runtime.compile": compile_, "sample.batch_size": batch}))
        assert sampling.compiles_sampling(p, device) is expected, (compile_, batch, device)
    p = config.from_dict(micro_raw(**{"runtime.compile": True, "sample.batch_size": 64, "runtime.device": "cpu",
                                      "runtime.precision": "fp32"}))
    model = _model("tadm")
    sampling.prepare_model(model, p, runtime.setup(p.runtime))
    assert "forward" not in vars(model.denoiser_blocks[0])  # the CPU: eager


@pytest.mark.parametrize("kind,K", [("mdlm", None), ("tadm", 2)])
def test_compiled_sampling_blocks_give_the_eager_tokens(monkeypatch, kind, K):
    """What prepare_model does on a GPU at batch >= 8, through torch.compile's aot_eager backend
    (the same capture and graphs, no code generation): the same tokens at batch 8 under
    inference mode, and a smaller last batch recompiles rather than fails."""
    from tadm.train import trainer

    settings = SamplerSettings(sampler="remdm-loop", steps=8, nucleus_p=0.9, ddpm_cache=False, seed=3, batch_size=8)
    model = _model(kind)

    def run(n):
        with (make_adapter(model, FixedInterval(K)) if K else make_adapter(model)) as adapter:
            return sample(adapter, settings, num_samples=n, seq_len=L).tokens

    eager = run(8), run(11)
    torch._dynamo.reset()
    assert trainer.compile_blocks(model, backend="aot_eager")
    try:
        assert torch.equal(run(8), eager[0]) and torch.equal(run(11), eager[1])
    finally:
        torch._dynamo.reset()
