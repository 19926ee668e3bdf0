"""runtime.compile compiles the blocks, not the model: every model kind trains and validates
through compiled DiT blocks (and TADM's fusion) with no graph break and no recompile once the
first step and the first validation have run -- across steps, across the readout's chunk
counts, and across TADM's two paths (training's stale pair with two heads, validation's fresh
anchor). Counted with torch._dynamo's counters and a counting backend (aot_eager underneath: the
same capture, guards and autograd graphs as inductor, no C++ code generation)."""

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from tadm import config, losses
from tadm.models import load_pretrained
from tadm.train import trainer
from tadm.methods import get_method
from tests.conftest import micro_raw, torch_single_thread

single_thread = pytest.fixture(autouse=True, scope="module", name="single_thread")(torch_single_thread)

KINDS = ["mdlm", "adlm", "tadm", "sedd", "ar"]


class CountingBackend:
    """A torch.compile backend: aot_eager, counting the graphs it compiles and the calls of them."""

    def __init__(self):
        self.compiles, self.calls = 0, 0
        self.inner = torch._dynamo.lookup_backend("aot_eager")

    def __call__(self, gm, example_inputs):
        self.compiles += 1
        compiled = self.inner(gm, example_inputs)

        def run(*args):
            self.calls += 1
            return compiled(*args)

        return run


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()
    counters.clear()


def _breaks() -> int:
    return sum(counters["graph_break"].values())


@pytest.mark.parametrize("kind", KINDS)
def test_compiled_blocks_train_without_graph_breaks_or_recompiles(kind, fresh_dynamo, monkeypatch):
    # small readout chunks (a few rows each), checkpointed: the number of head chunks changes
    # from step to step, which recompiled (and broke) the whole-model graph
    monkeypatch.setattr(losses, "CHUNK_ELEMENTS", 3 * 513)
    monkeypatch.setattr(losses, "CHECKPOINT_MIN_ELEMENTS", 1)
    p = config.from_dict(micro_raw())
    method = get_method(kind, p)
    torch.manual_seed(0)
    model = method.build_model(512, 32)
    backend = CountingBackend()
    pieces = trainer.compile_blocks(model, backend=backend)
    n_pieces = len(pieces)
    names = [n for n, _ in model.named_parameters()]
    assert n_pieces == sum(1 for n in names if n.endswith("norm1.weight")) + (kind == "tadm")

    def step(i: int) -> None:
        x = torch.randint(0, 512, (4, 32), generator=torch.Generator().manual_seed(i))
        loss = method.loss(model, x, torch.Generator().manual_seed(i), progress=i / 8).float().sum() / x.numel()
        loss.backward()
        model.zero_grad(set_to_none=True)

    def validate() -> None:  # the trainer's evaluate: no_grad, eval mode, a smaller last batch
        model.eval()
        with torch.no_grad():
            x = torch.randint(0, 512, (7, 32), generator=torch.Generator().manual_seed(99))
            for lo in (0, 4):
                method.nelbo(model, x[lo:lo + 4], torch.Generator().manual_seed(lo))
        model.train()

    step(0)
    validate()
    warm = (backend.compiles, counters["stats"]["unique_graphs"])
    calls_before = backend.calls
    for i in range(1, 6):
        step(i)
    validate()
    assert _breaks() == 0, dict(counters["graph_break"])
    # nothing compiles after the first step and the first validation
    assert (backend.compiles, counters["stats"]["unique_graphs"]) == warm
    # one graph per (grad mode, batch size) for all the blocks of a model: training's, and
    # validation's two batch sizes; TADM's fusion has its own three
    assert warm[0] == 3 * (2 if kind == "tadm" else 1)
    # every block call of the 5 steps and the validation ran a compiled graph (none fell back)
    forwards = 5 + 2
    assert backend.calls - calls_before == forwards * n_pieces
    # names are the model's own
    assert [n for n, _ in model.named_parameters()] == names
    assert all("_orig_mod" not in k for k in model.state_dict())


def test_every_kind_in_one_process_stays_under_the_recompile_limit(fresh_dynamo):
    """One process training every kind in turn (gpu_check trains MDLM and TADM in one): every
    block call still runs a compiled graph -- none falls back to eager at a recompile limit."""
    p = config.from_dict(micro_raw())
    backend = CountingBackend()
    for kind in KINDS + ["tadm_gamma0"]:
        method = get_method(kind, p)
        torch.manual_seed(0)
        model = method.build_model(512, 32)
        n_pieces = len(trainer.compile_blocks(model, backend=backend))
        before = backend.calls
        for i in range(2):
            x = torch.randint(0, 512, (4, 32), generator=torch.Generator().manual_seed(i))
            method.loss(model, x, torch.Generator().manual_seed(i)).sum().backward()
        model.eval()
        with torch.no_grad():
            method.nelbo(model, x[:3], torch.Generator().manual_seed(0))
        assert backend.calls - before == 3 * n_pieces, kind
    assert _breaks() == 0


def test_compiled_training_resumes_and_saves_plain_names(micro_packed, tmp_path, fresh_dynamo, monkeypatch):
    """runtime.compile through the real trainer: a compiled run stopped at step 2 resumes to
    step 4; checkpoints and the saved model carry the module's own names (the model loads
    without compile), and the weights are those of an uncompiled run."""
    backend = CountingBackend()
    monkeypatch.setattr(trainer, "COMPILE_BACKEND", backend)
    # a constant schedule: train.steps is then not part of the run's settings, so 2 -> 4 resumes
    raw = micro_raw(**{"train.steps": 4, "train.eval_every": 2, "train.checkpoint_every": 2,
                       "train.schedule": "constant"})
    plain = trainer.train("tadm", config.from_dict(raw), data_dir=micro_packed, root=tmp_path / "plain",
                          log=lambda *_: None)
    assert backend.compiles == 0
    raw["runtime"]["compile"] = True
    raw["train"]["steps"] = 2
    trainer.train("tadm", config.from_dict(raw), data_dir=micro_packed, root=tmp_path / "compiled", log=lambda *_: None)
    raw["train"]["steps"] = 4
    logs = []
    compiled = trainer.train("tadm", config.from_dict(raw), data_dir=micro_packed, root=tmp_path / "compiled",
                             log=logs.append)
    assert any("resumed from step 2" in str(line) for line in logs), logs
    assert backend.compiles > 0 and backend.calls > 0 and _breaks() == 0
    assert compiled["val_nelbo"] == pytest.approx(plain["val_nelbo"], rel=1e-5)
    for f in ("checkpoints/tadm/step_000004/model.safetensors", "models/tadm/model.safetensors"):
        assert (tmp_path / "plain" / f).exists() and (tmp_path / "compiled" / f).exists(), f
    a = load_pretrained(tmp_path / "plain" / "models" / "tadm").state_dict()
    b = load_pretrained(tmp_path / "compiled" / "models" / "tadm").state_dict()
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)


def test_wrap_compiles_blocks_in_place_and_other_modules_whole(fresh_dynamo, monkeypatch):
    """The trainer's models: blocks compiled, `net` is the model itself; a module without DiT
    blocks (the post-train loop's) is compiled whole, as before."""
    monkeypatch.setattr(trainer, "COMPILE_BACKEND", "eager")
    d = trainer.Dist()
    model = get_method("mdlm", config.from_dict(micro_raw())).build_model(512, 32)
    ddp, net = trainer.wrap(model, d, compile=True)
    assert ddp is model and net is model and all("forward" in vars(b) for b in model.blocks)
    other = torch.nn.Sequential(torch.nn.Linear(3, 3))
    ddp, net = trainer.wrap(other, d, compile=True)
    assert ddp is other and isinstance(net, torch._dynamo.eval_frame.OptimizedModule)
    assert trainer.wrap(other, d, compile=False)[1] is other


@pytest.mark.parametrize("checkpointed", [False, True])
@pytest.mark.parametrize("kind", ["mdlm", "adlm", "tadm", "tadm_gamma0", "sedd"])
def test_compiled_readout_chunks_match_eager_and_stop_compiling(kind, checkpointed, fresh_dynamo, monkeypatch):
    """Method.compile_heads (the trainer sets it under runtime.compile): each readout chunk --
    head, cast, loss -- runs one compiled graph. The loss and every gradient equal the eager
    ones (aot_eager: the same ops), there is no graph break, and nothing compiles after the first
    step and validation: the fixed-capacity gathers give a few chunk shapes, not one per step."""
    monkeypatch.setattr(losses, "CHUNK_ELEMENTS", 5 * 513)  # several chunks and a shorter last one
    monkeypatch.setattr(losses, "CHECKPOINT_MIN_ELEMENTS", 1 if checkpointed else 1 << 40)
    p = config.from_dict(micro_raw())
    method = get_method(kind, p)
    method.checkpoint_heads = checkpointed
    torch.manual_seed(0)
    model = method.build_model(512, 32)
    for q in model.parameters():  # a fresh DiT has zero heads: make every gradient non-trivial
        torch.nn.init.normal_(q, std=0.05)
    x = torch.randint(0, 512, (16, 32), generator=torch.Generator().manual_seed(0))

    def step(i: int, compile_heads):
        method.compile_heads = compile_heads
        model.zero_grad(set_to_none=True)
        loss = method.loss(model, x, torch.Generator().manual_seed(i), progress=0.5).float().sum() / x.numel()
        loss.backward()
        return loss.detach(), {n: q.grad.clone() for n, q in model.named_parameters() if q.grad is not None}

    backend = CountingBackend()
    eager, compiled = step(0, None), step(0, backend)
    assert backend.compiles >= 1 and _breaks() == 0
    assert torch.allclose(compiled[0], eager[0], rtol=1e-6, atol=1e-7)
    assert compiled[1].keys() == eager[1].keys()
    for name in eager[1]:
        assert torch.allclose(compiled[1][name], eager[1][name], rtol=1e-5, atol=1e-7), name
    model.eval()
    with torch.no_grad():
        method.nelbo(model, x, torch.Generator().manual_seed(0))
    model.train()
    warm = backend.compiles
    for i in range(1, 4):
        step(i, backend)
    model.eval()
    with torch.no_grad():
        method.nelbo(model, x, torch.Generator().manual_seed(1))
    assert backend.compiles == warm and _breaks() == 0
    assert warm <= 6, warm  # full and last chunk per readout, training and validation
