"""docs/extending.md's worked examples, run as the page shows them: each section's fenced python
blocks in order, in one namespace, then the effect the page describes is checked."""

from __future__ import annotations

import re

import pytest

from tadm.config import ROOT, ConfigError
from tadm.registry import SAMPLERS
from tests.conftest import forget_method
from tests.experiments.conftest import evaluator_dir, table2_raw  # noqa: F401 - evaluator_dir: a fixture
from tests.experiments.test_claims import run_dir  # noqa: F401 - the synthetic run, a fixture
from tests.sampling.conftest import random_model

PAGE = ROOT / "docs" / "extending.md"


def section_code(title: str) -> str:
    """The python blocks of the section headed `## title`, joined."""
    text = PAGE.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    body = text[start:end if end != -1 else len(text)]
    blocks = re.findall(r"```python\n(.*?)```", body, flags=re.S)
    assert blocks, f"docs/extending.md: section {title!r} has no python block"
    return "\n".join(blocks)


def test_sections_have_their_examples():
    titles = re.findall(r"^## (.+)$", PAGE.read_text(), flags=re.M)
    assert titles[:4] == ["A sampler", "A sampling budget", "A baseline", "A claim"]


@pytest.fixture
def default_load(tmp_path, monkeypatch):
    """`tadm.config.load()`, the examples' run params, reads the default profile's params.yaml,
    written here: the checkout's params.yaml may be switched to another profile."""
    from tadm import config

    params, real = config.write_profile("default", tmp_path / "params.yaml"), config.load
    monkeypatch.setattr(config, "load", lambda path=params: real(path))


@pytest.fixture
def unregister_eager():
    yield
    if "mdlm-eager" in SAMPLERS._units:
        SAMPLERS.unregister("mdlm-eager")


def test_a_sampler(unregister_eager, default_load):
    namespace = {"model": random_model("mdlm", seq_len=16)}
    exec(compile(section_code("A sampler"), str(PAGE), "exec"), namespace)
    assert SAMPLERS["mdlm-eager"] is namespace["EagerMDLMSampler"]
    assert namespace["result"].tokens.shape == (2, 16)


def test_a_sampling_budget(default_load):
    namespace: dict = {}
    exec(compile(section_code("A sampling budget"), str(PAGE), "exec"), namespace)
    assert namespace["params"].sample.refresh_every(128) == 4


@pytest.fixture
def unregister_plain():
    yield
    forget_method("mdlm_plain")


def test_a_baseline(unregister_plain, micro_packed, evaluator_dir, tmp_path):  # noqa: F811 - fixtures
    from tadm import config, runtime
    from tadm.data.tokenizer import load_tokenizer
    from tadm.experiments.table2 import Scorer
    from tadm.models import load_pretrained
    from tadm.registry import METHODS

    params = config.from_dict(table2_raw(tmp_path, evaluator_dir))
    scorer = Scorer(params, load_tokenizer(micro_packed.parent / "tokenizer"), micro_packed, dist=runtime.Dist())
    namespace = {"params": params, "data_dir": micro_packed, "root": tmp_path, "scorer": scorer}
    exec(compile(section_code("A baseline"), str(PAGE), "exec"), namespace)
    assert METHODS["mdlm_plain"] is namespace["PlainCrossEntropy"]
    # the hooks' defaults: the step-time model projects it as MDLM's network (its layers, one readout)
    from tadm.step_time import H100, sampling_step
    assert 0 < namespace["mfu"] < 1
    assert namespace["tokens_per_s"] == sampling_step("mdlm", params, H100, batch=8, steps=64).tokens_per_s
    # its own schedule: what training noised with and what its row's sampler read
    from tadm.sampling import make_adapter
    from tadm.sampling.base import method_schedule
    model = load_pretrained(tmp_path / "models" / "mdlm_plain")
    assert isinstance(method_schedule(make_adapter(model), 1e-3), namespace["CosineSchedule"])
    from transformers import AutoModel
    import tadm  # noqa: F401  (the Auto classes)
    assert type(AutoModel.from_pretrained(tmp_path / "models" / "mdlm_plain").net) is namespace["PlainMDLM"]
    card = (tmp_path / "models" / "mdlm_plain" / "README.md").read_text()
    assert "MDLM on a cosine schedule" in card and 'sampler="remdm-loop"' in card
    assert namespace["summary"]["val_nelbo"] < namespace["summary"]["val_nelbo_init"]
    assert type(load_pretrained(tmp_path / "models" / "mdlm_plain")) is namespace["PlainMDLM"]
    assert (tmp_path / "samples" / "mdlm_plain" / "T8.npy").is_file()
    with pytest.raises(config.ConfigError, match=r"train\.models\[0\]: no method 'mdlm_pain' is registered"):
        config.override(params, {"train.models": ["mdlm_pain"]})


def test_a_claim(run_dir):  # noqa: F811 - the fixture imported above
    params, root = run_dir
    namespace = {"params": params, "root": root}
    exec(compile(section_code("A claim"), str(PAGE), "exec"), namespace)
    got = {c.id: c for c in namespace["table"]}
    assert got["genppl_tadm_below_remdm"].verdict == "reproduced"  # the synthetic run: Gen PPL 55 vs 60
    assert "| TADM‡ Gen PPL below ReMDM's at T = 2048 |" in (root / "paper_figures" / "claims.md").read_text()


def test_a_cache_method(default_load):
    import torch
    from transformers import DiffusionGemmaForBlockDiffusion

    from tadm.config import load, override
    from tadm.experiments import frontier, table1, table1_render
    from tadm.posttrain.anchored import sampling_kwargs
    from tadm.registry import DG_CACHES
    from tests.posttrain.conftest import tiny_config

    torch.manual_seed(0)
    base = DiffusionGemmaForBlockDiffusion(tiny_config()).eval().requires_grad_(False)
    params = override(load(), {"posttrain.shared_layers": 1, "posttrain.anchor_layers": 3,
                               "posttrain.denoiser_layers": 2})
    namespace = {"params": params, "base": base}
    try:
        exec(compile(section_code("A cache method"), str(PAGE), "exec"), namespace)
        assert DG_CACHES.names()[-1] == "skip" and namespace["params"].posttrain.cache_methods[-1] == "skip"
        assert table1_render.families()[-1] == "skip" and frontier.legend("skip") == ("Anchor layers skipped", "x")
        model = namespace["model"]
        assert isinstance(model.fusion, namespace["SkipFusion"]) and model.refresh_every == 2
        ids = torch.randint(3, 64, (1, 5), generator=torch.Generator().manual_seed(0))
        out = model.generate(ids, attention_mask=torch.ones_like(ids), refresh_every=2,
                             **sampling_kwargs(4, 0.1, (0.8, 0.4), 8, eos_token_id=None, pad_token_id=None))
        assert out.sequences.shape == (1, 13)
        row = table1.Table1Method("Anchor skip K=2", base, model, 2, "skip")
        assert row.layer_calls_per_step(4) == (1 + 2) + 3 * 2 / 4  # TADM's calls at K = 2, T = 4
        # every place that derives from the registry takes it in: the contract, Table 1's note
        from tadm.caches.diffusiongemma.base import AnchorFusion, CacheModel
        assert isinstance(model, CacheModel) and isinstance(model.fusion, AnchorFusion)
        import pandas as pd
        note = table1_render._caches_note(pd.DataFrame({"family": ["tadm", "naive", "skip"]}))
        assert note.endswith("*Anchor skip* is TADM's split with the fusion replaced by the shared layers' fresh output. ")
        assert note.startswith("*Naive reuse* is TADM's split") and "Feature cache" not in note
    finally:
        if "skip" in DG_CACHES._units:
            DG_CACHES.unregister("skip")
    with pytest.raises(ConfigError, match=r"posttrain.cache_methods\[0\]: no DiffusionGemma cache 'skip'"):
        override(load(), {"posttrain.cache_methods": ["skip"]})
