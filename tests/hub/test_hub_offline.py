"""An exported directory in a fresh interpreter where ``tadm`` cannot be imported
(``sys.modules['tadm'] = None``; cwd and HF_HOME in tmp, HF_HUB_OFFLINE=1, one thread): it loads
through transformers' Auto classes with ``trust_remote_code=True`` alone, its logits equal the
project's bit for bit, `generate` draws the tokens of `tadm.sampling`, the tokenizer knows the mask
token, bf16 is honoured, save_pretrained writes a directory that loads again; without the flag
the error names the fix. One subprocess serves every test of the module (`fresh`)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from tadm.models import load_pretrained
from tadm.registry import method_for
from tadm.sampling import FixedInterval, SamplerSettings, make_adapter, sample
from tadm.sampling.ar import sample_ar
from tests.hub.workspace import L, RUNS, V

SCRIPT = textwrap.dedent('''
    import sys
    sys.modules["tadm"] = None  # the package is not installed here
    import json, os
    import torch
    torch.set_num_threads(1)
    import transformers
    from transformers import (AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM,
                              AutoTokenizer)
    transformers.logging.set_verbosity_error()

    dirs, out = json.loads(sys.argv[1]), sys.argv[2]
    z = torch.load(sys.argv[3], weights_only=True)
    results = {}
    for run, path in dirs.items():
        r = results[run] = {}
        family = AutoConfig.from_pretrained(path, trust_remote_code=True).model_type
        masked = family != "ar"
        task = AutoModelForMaskedLM if masked else AutoModelForCausalLM
        r["classes"] = [type(cls.from_pretrained(path, trust_remote_code=True)).__name__ for cls in (AutoModel, task)]
        model = task.from_pretrained(path, trust_remote_code=True)
        r["training"] = model.training
        with torch.no_grad():
            r["logits"] = model(z if masked else z.clamp_max(model.config.vocab_size - 1)).logits
        r["tokens"] = model.generate(num_samples=4, seed=7)
        if family == "tadm":
            r["tokens_K1"] = model.generate(num_samples=4, seed=7, refresh_every=1)
            r["tokens_K4"] = model.generate(num_samples=4, seed=7, refresh_every=4)
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
        ids = tok("w1 w2 w36", add_special_tokens=False)["input_ids"]
        r["tokenizer"] = [type(tok).__name__, tok.mask_token_id, tok.bos_token_id, ids, tok.decode(ids), len(tok)]
        half = task.from_pretrained(path, trust_remote_code=True, dtype=torch.bfloat16)
        with torch.no_grad():
            r["bf16"] = [str(next(half.parameters()).dtype), str(half(z if masked else z.clamp_max(V - 1)).logits.dtype)]
        saved = os.path.join(out, run)
        model.save_pretrained(saved)
        r["saved_files"] = sorted(os.listdir(saved))
        again = task.from_pretrained(saved, trust_remote_code=True)
        with torch.no_grad():
            r["saved_logits"] = again(z if masked else z.clamp_max(V - 1)).logits
        card = open(os.path.join(path, "README.md")).read()
        scope = {}
        exec(card.split("```python\\n")[1].split("```")[0].replace("<this repository or directory>", path), scope)
        r["card_tokens"] = scope["tokens"]
        try:
            task.from_pretrained(path)
            r["without_flag"] = "loaded"
        except Exception as e:
            r["without_flag"] = f"{type(e).__name__}: {e}"
    torch.save(results, os.path.join(out, "results.pt"))
''').replace("V - 1", "model.config.vocab_size - 1")


@pytest.fixture(scope="module")
def fresh(hub_workspace, tmp_path_factory):
    """(workspace root, hub dirs, z, the subprocess's results {run: {...}})."""
    import json

    root, dirs = hub_workspace
    work = tmp_path_factory.mktemp("fresh")
    z = torch.randint(0, V + 1, (2, L), generator=torch.Generator().manual_seed(5))
    torch.save(z, work / "z.pt")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env.update(HF_HOME=str(work / "hf"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1",
               MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps({k: str(v) for k, v in dirs.items()}), str(work),
                           str(work / "z.pt")], cwd=work, env=env, capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root, dirs, z, torch.load(work / "results.pt", weights_only=True)


@pytest.mark.parametrize("run", RUNS)
def test_fresh_env_loads_with_trust_remote_code_and_logits_match(run, fresh):
    root, dirs, z, results = fresh
    r = results[run]
    net = load_pretrained(root / "models" / run)
    arch = {"mdlm": "MDLMForMaskedLM", "sedd": "SEDDForMaskedLM", "adlm": "ADLMForMaskedLM",
            "tadm": "TADMForMaskedLM", "ar": "ARForCausalLM"}[net.model_type]
    assert r["classes"] == [arch, arch] and r["training"] is False
    if net.model_type == "ar":
        z = z.clamp_max(V - 1)
    with torch.no_grad():
        assert torch.equal(r["logits"], method_for(net.model_type).canvas_logits(net, z))


def test_fresh_env_without_trust_remote_code_names_the_fix(fresh):
    for run, r in fresh[3].items():
        assert r["without_flag"].startswith("ValueError") and "trust_remote_code=True" in r["without_flag"], run


def test_fresh_env_tokenizer_roundtrips_and_mask_id_agrees(fresh):
    for run, r in fresh[3].items():
        name, mask_id, bos_id, ids, text, size = r["tokenizer"]
        masked = run != "ar"
        assert name in ("TokenizersBackend", "PreTrainedTokenizerFast")
        assert mask_id == (V if masked else None) and bos_id == 0 and size == V + masked
        assert ids == [1, 2, 36] and text == "w1 w2 w36"


@pytest.mark.parametrize("run", ("mdlm", "sedd", "adlm", "tadm", "tadm_gamma0", "ar"))
def test_fresh_env_generate_equals_tadm_sampling(run, fresh):
    """With generation_config.json's settings (the row's sampler, the first budget's T and K,
    top_p 0.9) and seed 7: the reference's tokens; TADM also at K = 1 and K = 4."""
    root, dirs, _, results = fresh
    net = load_pretrained(root / "models" / run)
    if net.model_type == "ar":
        assert torch.equal(results[run]["tokens"], sample_ar(net, 4, L, bos_id=0, nucleus_p=0.9, seed=7).tokens)
        return
    import json

    gen = json.loads((dirs[run] / "generation_config.json").read_text())
    runs = [("tokens", gen.get("refresh_every"))]
    if net.model_type == "tadm":
        runs += [("tokens_K1", 1), ("tokens_K4", 4)]
    for key, K in runs:
        with make_adapter(net, FixedInterval(K) if K else None) as adapter:
            ref = sample(adapter, SamplerSettings(sampler=gen["sampler"], steps=gen["steps"], nucleus_p=gen["top_p"],
                                                  seed=7), num_samples=4, seq_len=L).tokens
        assert torch.equal(results[run][key], ref), (run, key)


def test_fresh_env_runs_the_cards_example(fresh):
    """The card's load-and-sample block, run as written (the directory's path filled in): the
    row's sampler draws 4 sequences."""
    for run, r in fresh[3].items():
        assert r["card_tokens"].shape == (4, L), run


def test_fresh_env_bf16_is_honoured(fresh):
    for run, r in fresh[3].items():
        assert r["bf16"] == ["torch.bfloat16", "torch.bfloat16"], run


def test_fresh_env_save_pretrained_keeps_card_and_reloads(fresh):
    for run, r in fresh[3].items():
        assert {"README.md", "config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
                "tokenizer_config.json", "configuration_tadm.py", "modeling_tadm.py",
                "generation_tadm.py"} <= set(r["saved_files"]), run
        assert torch.equal(r["saved_logits"], r["logits"]), run
