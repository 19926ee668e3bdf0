"""The hub stand-ins load through the paper profile's own loading code, offline.

A subprocess (HF_HOME must be set before `datasets` / `huggingface_hub` are imported) loads
each stand-in with the call the paper profile makes -- load_dataset(name, config, split),
from_pretrained(hub id), snapshot_download, hf_hub_download -- and reports what it got."""

import json
import subprocess
import sys
import textwrap

import pytest

from tadm import config
from tadm.dryrun import run, standins

pytestmark = pytest.mark.slow

PROBE = textwrap.dedent("""
    import json, torch
    from tadm import config
    from tadm.dryrun import run
    p = config.from_dict(run.render(), source="dry run")
    out = {}
    from tadm.data import corpus, sft, gsm8k, chat
    from tadm.data.tokenizer import load_tokenizer
    ds = corpus.load_openwebtext(p.corpus)
    out["openwebtext"] = [len(ds), ds.column_names]
    examples = sft.hub_examples(p.sft, 0)
    out["sft"] = sorted({(e["source"], e["category"]) for e in examples})
    out["sft_n"] = len(examples)
    out["gsm8k"] = [len(gsm8k.load_gsm8k("hub", s)) for s in ("train", "test")]
    from tadm.tasks import multiple_choice as mc, aime, livecodebench as lcb
    out["mmlu_pro"] = [len(mc.load_mmlu_pro("hub", s)) for s in ("test", "validation")]
    out["gpqa"] = len(mc.load_gpqa("hub"))
    out["aime"] = [r["answer"] for r in aime.load_aime("MathArena/aime_2026")]
    out["lcb"] = [len(lcb.load_livecodebench("hub")), len(lcb.tests(lcb.load_livecodebench("hub")[0]))]
    tok = load_tokenizer(p.sft.tokenizer)
    out["dg_prompt"] = chat.render(tok, "hi")
    from tadm.posttrain.model import load_base
    base = load_base(p.posttrain.base_model)
    out["dg_layers"] = base.config.text_config.num_hidden_layers
    from huggingface_hub import snapshot_download
    from safetensors.torch import load_file
    import pathlib
    saved, state = {}, base.state_dict()
    for shard in pathlib.Path(snapshot_download(p.posttrain.base_model)).glob("model-*.safetensors"):
        saved.update(load_file(shard))
    out["dg_from_shards"] = [len(saved), sum(k in state and torch.equal(state[k], v) for k, v in saved.items())]
    from tadm.models import llada
    m = llada.load_llada(p.asrd.llada_model)
    t = llada.load_llada_tokenizer(llada.resolve_source(p.asrd.llada_model))
    out["llada"] = [m.cfg.mask_token_id == t.convert_tokens_to_ids("<|mdm_mask|>"), len(llada.chat_ids(t, "hi")) > 3]
    from tadm.metrics.features import load_featurizer
    f = load_featurizer(p.eval.featurizer)
    out["gpt2_large"] = type(f).__name__
    from tadm.memory_estimate import cached_parameters
    out["base_params"] = [cached_parameters(p.posttrain.base_model), sum(x.numel() for x in base.parameters())]
    print("PROBE" + json.dumps(out))
""")


def assert_sharded(snapshot) -> None:
    """The release layout: more than one model-0000i-of-0000N.safetensors, all in the index's weight_map."""
    shards = sorted(f.name for f in snapshot.glob("model-*-of-*.safetensors"))
    index = json.loads((snapshot / "model.safetensors.index.json").read_text())
    assert len(shards) > 1 and not (snapshot / "model.safetensors").exists()
    assert sorted(set(index["weight_map"].values())) == shards


def test_every_standin_loads_through_the_paper_loaders(tmp_path):
    root = standins.build(tmp_path / "hf", config.from_dict(run.render(), source="dry run"))
    for repo in ("google/diffusiongemma-26B-A4B-it", "GSAI-ML/LLaDA-8B-Instruct"):  # loaded from shards below
        assert_sharded(standins.hub_snapshot(root, repo))
    env = run._env(root)
    proc = subprocess.run([sys.executable, "-c", PROBE], env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.split("PROBE", 1)[1])
    assert out["openwebtext"] == [64, ["text"]]  # corpus.max_docs of the 96
    names = {s for s, _ in out["sft"]}
    assert names == {"nemotron-math", "nemotron-code", "nemotron-stem", "ultradata-knowledge", "ultradata-instruction"}
    assert out["sft_n"] == 8 + 8 + 4 + 4 + 4
    assert out["gsm8k"] == [24, 24] and out["mmlu_pro"] == [12, 5] and out["gpqa"] == 8
    assert len(out["aime"]) == 6 and all(0 <= a <= 999 for a in out["aime"])
    assert out["lcb"][0] == 12 and out["lcb"][1] == 2  # every release_v6 file; a public and a private test
    assert out["dg_prompt"].startswith("<bos><|turn>user\nhi<turn|>\n<|turn>model\n")
    assert out["dg_layers"] == 30 and out["llada"] == [True, True]
    assert out["dg_from_shards"][0] > 0 and out["dg_from_shards"][1] == out["dg_from_shards"][0]  # read from the shards
    cached, loaded = out["base_params"]  # the headers also count the buffers saved with the weights
    assert loaded <= cached <= 1.001 * loaded


def test_the_no_think_filter_keeps_only_reasoning_off_rows(tmp_path):
    root = standins.build(tmp_path / "hf", config.from_dict(run.render(), source="dry run"))
    probe = ("import datasets; d = datasets.load_dataset('nvidia/Nemotron-Post-Training-Dataset-v2', split='math'); "
             "import json; print(json.dumps(sorted(set(d['reasoning']))))")
    proc = subprocess.run([sys.executable, "-c", probe], env=run._env(root), capture_output=True, text=True)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == ["off", "on"]
