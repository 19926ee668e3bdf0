"""The unit contract: a method (with its own noise schedule), a sampler and a training-free cache,
all three defined in this file, reach every place the library derives from its registries --
training, sampling, Table 2's row (sampled with the toy sampler), Table 1's rows (the toy cache),
the Auto classes and the model card's example, the step-time model, the compute column, ASRD's
backend, the claims' labels and comparator findings -- without a line of the library changed
(docs/extending.md: "A sampler", "A baseline", "A cache method")."""

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
from tadm.registry import DG_CACHES, SAMPLERS
from tadm.models import count_parameters, load_pretrained
from tadm.models.base import TadmModel
from tadm.models.dit import ConditionEmbedder, DiTFinalLayer, DiTStack, token_embedding
from tadm.schedule import LogLinearSchedule
from tadm.sampling import SingleNetworkAdapter, make_adapter
from tadm.sampling.base import method_schedule
from tadm.sampling.mdlm import MDLMSampler
from tadm.train.trainer import train
from tests.conftest import forget_method
from tests.experiments.conftest import table2_raw


@pytest.fixture(scope="module")
def toy():
    """The three units, defined (and so registered) here; removed again when the module is done.
    Yields the method; the sampler and the cache are `ToySampler` and `TOY_CACHE` below."""

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
        rows = (Row("toy", "Toy (one block)", "toy", "toy-sampler"),)  # sampled with the toy sampler

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

    class ToySampler(MDLMSampler):
        """MDLM's step, counting the steps it takes."""

        names = ("toy-sampler",)
        steps = 0

        def transition(self, z_t, t, s, active):
            ToySampler.steps += 1
            return super().transition(z_t, t, s, active)

    from tadm.caches.catalog import CacheMethod, add_dg_cache
    from tadm.caches.diffusiongemma.naive import naive_model

    add_dg_cache(CacheMethod("toycache", "Toy cache", naive_model, legend="Toy cache (naive reuse)", marker="d",
                             description="is naive reuse under another name."))
    Toy.sampler = ToySampler
    try:
        yield Toy
    finally:
        forget_method("toy")
        SAMPLERS.unregister("toy-sampler")
        DG_CACHES.unregister("toycache")


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
    assert "Toy (a one-block masked diffusion model)" in card and 'sampler="toy-sampler"' in card
    assert "AutoModel.from_pretrained" in card

    # sampling through its adapter, and Table 2's row scored like any other
    assert isinstance(make_adapter(model), SingleNetworkAdapter)
    reads, steps = schedule_class.reads, toy.sampler.steps
    assert sampling.graphed_pieces(model) == [m for m in model.modules()
                                              if type(m).__name__ in ("DiTBlock", "ConditionEmbedder")]
    scorer = table2.Scorer(p, load_tokenizer(micro_packed.parent / "tokenizer"), micro_packed, dist=runtime.Dist())
    result = table2.run_row("toy", p, scorer, models_dir=tmp_path / "models", samples_dir=tmp_path / "samples")
    assert result["label"] == "Toy (one block)" and schedule_class.reads > reads  # sampled on its schedule
    assert toy.sampler.steps > steps  # by its row's own sampler
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
    library = accounting.kinds()  # the library's units that say compute_column
    assert "toy" not in library and {"mdlm", "tadm"} <= set(library)
    monkeypatch.setattr(toy, "compute_column", True)
    assert accounting.kinds() == (*library, "toy")
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
    assert "toy" not in throughput_results.speed_references()  # its row names no speed_reference
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


def test_the_toy_cache_is_a_table1_family_and_a_claims_comparator(toy, posttrain_workspace, tmp_path):
    """Named in posttrain.cache_methods and claims.training_free_comparator, the toy cache gets
    Table 1's rows at every K >= 2 (counted like naive reuse, whose model it builds), its note, its
    frontier legend, its AUP, and its own finding in the training-free Holm family."""
    from tadm.experiments import frontier, table1, table1_render
    from tadm.experiments.claims import catalog
    from tadm.experiments.claims.evidence import measure
    from tadm.experiments.claims.inputs import Inputs
    from tadm.experiments.claims.rules import Rules
    from tests.experiments.conftest import posttrain_raw

    with pytest.raises(ConfigError, match=r"claims\.training_free_comparator\[1\]: .*'toycach'"):
        config.from_dict(posttrain_raw(**{"claims.training_free_comparator": ["naive", "toycach"]}))
    p = config.from_dict(posttrain_raw(**{"posttrain.cache_methods": ["naive", "toycache"],
                                          "claims.training_free_comparator": ["naive", "toycache"]}))
    results = table1.run(p, root=posttrain_workspace, sft_dir=posttrain_workspace / "data" / "sft",
                         out=tmp_path / "table1.json", log=lambda *_: None)
    rows = results["tasks"]["arithmetic"]["methods"]
    for k in (2, 3):
        ours, naive = rows[f"Toy cache K={k}"], rows[f"Naive reuse K={k}"]
        assert ours["family"] == "toycache" and ours["layer_calls"] == naive["layer_calls"]
        assert ours["accuracy"] == naive["accuracy"]  # the same model under another name, the same seeds
    assert table1_render.families()[-1] == "toycache"
    assert frontier.legend("toycache") == ("Toy cache (naive reuse)", "d")
    note = table1_render._caches_note(table1_render.frame(results))
    assert "*Toy cache* is naive reuse under another name." in note
    aup = table1_render.aup_frame(table1_render.frame(results))
    assert "toycache" in set(aup["family"])

    ids = [e.id for e in catalog.entries(catalog.CATALOG, p.claims.training_free_comparator)]
    assert "fusion_vs_naive" in ids and "fusion_vs_toycache" in ids
    entry = next(e for e in catalog.entries(catalog.CATALOG, ["toycache"]) if e.id == "fusion_vs_toycache")
    inp = Inputs(params=p, table2={}, sweep=[], compute_column=None, table1=results, staleness=None, train={},
                 evaluator=None)
    claim = measure(entry, inp, Rules.of(p))
    assert claim.family == catalog.TRAINING_FREE and "`toycache`" in claim.claim
    assert "K = 2" in claim.notes and "K = 3" in claim.notes  # read from the toy cache's own rows
