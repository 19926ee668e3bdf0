"""A Table 2 baseline is one unit (tadm.methods): a method defined in this file -- its network, its
objective, its Table 2 row -- trains, samples and is scored by Table 2 on the micro profile
without a line of the library changed (docs/extending.md, "A baseline")."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tadm import compute, config, memory_estimate, runtime
from tadm.data.tokenizer import load_tokenizer
from tadm.errors import ConfigError
from tadm.experiments import sampling, table2
from tadm.losses import nelbo_from_rows
from tadm.methods import Method, Row, get_method
from tadm.models import count_parameters, load_pretrained
from tadm.models.base import TadmModel
from tadm.models.dit import ConditionEmbedder, DiTFinalLayer, DiTStack, token_embedding
from tadm.schedule import LogLinearSchedule
from tadm.sampling import SingleNetworkAdapter, make_adapter
from tadm.sampling.base import method_schedule
from tadm.train.trainer import train
from tests.conftest import forget_method
from tests.experiments.conftest import table2_raw


@pytest.fixture(scope="module")
def toy():
    """The unit, defined (and so registered) here; removed again when the module is done."""

    class OneBlock(TadmModel):
        """A one-block masked diffusion network, whatever model.mdlm_layers says."""

        model_type = "toy"

        def __init__(self, cfg, vocab_size, seq_len):
            super().__init__(cfg, vocab_size, seq_len)
            self.embed = token_embedding(vocab_size + 1, cfg.d_model)
            self.cond = ConditionEmbedder()
            self.mixer = DiTStack(1, cfg.d_model, cfg.n_heads, cfg.mlp_ratio)
            self.final = DiTFinalLayer(cfg.d_model, vocab_size + 1)

        def hidden(self, z_t):
            return self.mixer(self.embed(z_t), self.cond())  # (B, L, d)

        def head(self, x):
            return self.final(x, self.cond())  # (..., V+1)

        def forward(self, z_t, readout=None):
            h = self.hidden(z_t)
            return self.head(h) if readout is None else readout(h, self.head)

    class ToySchedule(LogLinearSchedule):
        """Its own noise schedule (log-linear values, counting the alphas read)."""

        reads = 0

        def alpha(self, t):
            ToySchedule.reads += 1
            return super().alpha(t)

    class Toy(Method):
        """Trained on the masked tokens' cross-entropy without the NELBO's 1/t weight; validated
        on the NELBO like every method."""

        names = ("toy",)
        title = "Toy (a one-block masked diffusion model)"
        model = OneBlock
        adapter = SingleNetworkAdapter  # one network: hidden(z_t), then its head
        rows = (Row("toy", "Toy (one block)", "toy", "mdlm"),)

        @classmethod
        def noise_schedule(cls, eps=1e-3):
            return ToySchedule(eps)

        def loss(self, model, x, gen, progress=1.0):
            _, z_t = self._noised(x, gen)
            return model(z_t, readout=self.readout(z_t, x))  # (B,) summed CE

        def nelbo(self, model, x, gen):
            t, z_t = self._noised(x, gen)
            return nelbo_from_rows(model(z_t, readout=self.readout(z_t, x)), t, self.schedule)

        @classmethod
        def layers(cls, m):
            return 1

    yield Toy
    forget_method("toy")


def test_a_method_defined_in_a_test_file_trains_samples_and_is_scored(toy, micro_packed, evaluator_dir, tmp_path):
    raw = table2_raw(tmp_path, evaluator_dir, **{"train.models": ["toy"], "train.replicate_models": ["toy"],
                                                 "sample.replicate_rows": ["toy"],
                                                 "sample.budgets": [{"T": 8, "K": 4}], "sample.replicate_steps": [8]})
    p = config.from_dict(raw)  # train.models and sample.replicate_rows accept the registered names
    assert "toy" in table2.ROWS and table2.ROWS["toy"].label == "Toy (one block)"

    # training: the trainer knows the unit only by name
    summary = train("toy", p, data_dir=micro_packed, root=tmp_path, log=lambda *_: None)
    assert summary["steps"] == p.train.steps
    model = load_pretrained(tmp_path / "models" / "toy")
    assert type(model) is toy.model and len(list(model.mixer.children())) == 1
    assert summary["model_type"] == "toy" and np.isfinite(summary["val_nelbo"])
    assert summary["val_nelbo"] < summary["val_nelbo_init"]  # it learned something in the micro steps
    assert json.loads((tmp_path / "metrics" / "train" / "toy.json").read_text()) == summary

    # its formulas: the memory check's parameter count is the network's, MFU's FLOPs use its one block
    V, L = model.vocab_size, model.seq_len
    assert memory_estimate.model_parameters("toy", p.model, V) == count_parameters(model)
    blk = compute.dit_block_flops(p.model.d_model, L, p.model.mlp_ratio)
    assert compute.train_forward_flops("toy", p.model, V, L, head_rows=0.5) == pytest.approx(
        blk + 0.5 * compute.lm_head_flops(p.model.d_model, V + 1))

    # its schedule is what training noised with and what its samplers read
    schedule_class = type(toy.noise_schedule())
    assert schedule_class.reads > 0 and isinstance(get_method("toy", p).schedule, schedule_class)
    assert isinstance(method_schedule(make_adapter(model), 1e-3), schedule_class)

    # the hub directory: AutoModel loads it (no name list edited), its card names the family, the
    # row's own sampler and AutoModel
    from transformers import AutoModel

    import tadm  # noqa: F401  (the Auto classes)
    assert type(AutoModel.from_pretrained(tmp_path / "models" / "toy").net) is toy.model
    card = (tmp_path / "models" / "toy" / "README.md").read_text()
    assert "Toy (a one-block masked diffusion model)" in card and 'sampler="mdlm"' in card
    assert "AutoModel.from_pretrained" in card

    # sampling through its adapter, and Table 2's row scored like any other
    assert isinstance(make_adapter(model), SingleNetworkAdapter)
    reads = schedule_class.reads
    assert sampling.graphed_pieces(model) == [m for m in model.modules()
                                              if type(m).__name__ in ("DiTBlock", "ConditionEmbedder")]
    scorer = table2.Scorer(p, load_tokenizer(micro_packed.parent / "tokenizer"), micro_packed, dist=runtime.Dist())
    result = table2.run_row("toy", p, scorer, models_dir=tmp_path / "models", samples_dir=tmp_path / "samples")
    assert result["label"] == "Toy (one block)" and schedule_class.reads > reads  # sampled on its schedule
    scored = result["budgets"]["8"]
    assert np.isfinite(scored["gen_ppl"]) and 0 < scored["mauve"] <= 1
    tokens = np.load(tmp_path / "samples" / "toy" / "T8.npy")
    assert tokens.shape == (p.sample.num_samples, L) and tokens.max() < V  # every position decoded


def test_an_unregistered_name_is_refused_with_the_registered_ones(toy, tmp_path):
    with pytest.raises(ConfigError, match=r"train\.models\[0\]: no method 'nope' is registered \(known: .*toy"):
        config.from_dict(table2_raw(tmp_path, tmp_path, **{"train.models": ["nope"]}))
    with pytest.raises(ConfigError, match=r"sample\.replicate_rows\[0\]: no Table 2 row 'nope' is registered"):
        config.from_dict(table2_raw(tmp_path, tmp_path, **{"sample.replicate_rows": ["nope"]}))
    p = config.from_dict(table2_raw(tmp_path, tmp_path))
    with pytest.raises(ConfigError, match=r"train\.models: unknown run 'nope'"):
        get_method("nope", p)
    with torch.device("meta"):
        assert get_method("toy", p).build_model(10, 8).model_type == "toy"


def test_every_place_that_treats_methods_apart_asks_the_unit(toy, tmp_path, monkeypatch):
    """The hooks of `Method` with their single-network defaults: the step-time model, the
    compute column, ASRD's backend, the throughput references, the claims' row models and the
    Auto classes read the toy unit as they read the library's, with no name list edited."""
    import dataclasses

    from tadm.asrd.backends import MaskedBackend
    from tadm.experiments import throughput_results
    from tadm.experiments.claims import evidence
    from tadm.sampling import accounting
    from tadm.step_time import H100, sampling_step, training_step

    p = config.from_dict(table2_raw(tmp_path, tmp_path))
    # step time: its one block (Toy.layers), one readout, nothing besides: MDLM's step at one layer
    one = dataclasses.replace(p, model=dataclasses.replace(p.model, mdlm_layers=1))
    assert training_step("toy", p, H100).parts == training_step("mdlm", one, H100).parts
    assert sampling_step("toy", p, H100, 8, 64).parts == sampling_step("mdlm", one, H100, 8, 64).parts
    assert toy.layer_calls(p.model, 64, 4) == 64  # every layer, every step

    # the compute column: counted once it says so, its formula beside the counted calls
    assert accounting.kinds() == ("mdlm", "adlm", "tadm")
    monkeypatch.setattr(toy, "compute_column", True)
    assert accounting.kinds() == ("mdlm", "adlm", "tadm", "toy")
    depths = dict(mdlm_layers=2, anchor_layers=2, denoiser_layers=1)
    row = [r for r in accounting.compute_column([4], schedule={4: 2}, depths=depths) if r["model"] == "toy"]
    assert len(row) == 1 and row[0]["layer_calls"] == row[0]["formula"] == 4 and row[0]["K"] is None

    # ASRD: the backend's model list derives from the units with `asrd`
    with torch.device("meta"):
        net = get_method("toy", p).build_model(10, 8)
    with pytest.raises(ConfigError, match=r"ASRD runs on 'mdlm' or 'tadm' models, got 'toy'"):
        MaskedBackend(net)
    monkeypatch.setattr(toy, "asrd", True)
    with pytest.raises(ConfigError, match=r"asrd\.refresh_every: TOY has no anchor to reuse"):
        MaskedBackend(net, refresh_every=2)

    # throughput's references (Row.speed_reference, by rank) and the claims' row -> checkpoint
    assert throughput_results.speed_references() == ("adlm", "mdlm")
    ranked = {"a": Row("a", "A", "a", speed_reference=1), "b": Row("b", "B", "b", speed_reference=0), "c": Row("c", "C", "c")}
    assert throughput_results.speed_references(ranked) == ("b", "a")
    assert evidence.row_model("toy") == "toy" and evidence.row_model("tadm_nofusion") == "tadm"
    with pytest.raises(KeyError):
        evidence.row_model("data")

    # the Auto classes return the unit's canvas_logits (the default: the network's output)
    from transformers import AutoModel

    import tadm  # noqa: F401  (the Auto classes)
    torch.manual_seed(0)
    net = get_method("toy", p).build_model(10, 8)
    net.save_pretrained(tmp_path / "toy")
    z = torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(AutoModel.from_pretrained(tmp_path / "toy")(z).logits, toy.canvas_logits(net.eval(), z))
        assert torch.equal(toy.canvas_logits(net, z), net(z))
