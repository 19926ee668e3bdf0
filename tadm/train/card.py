"""The model card (``README.md``) the trainer writes into each model directory beside
config.json and model.safetensors: what trained it (profile, data, steps, seed), its validation
NELBO and how to load and sample it -- through transformers' Auto classes (``tadm.auto``) and,
for TADM, with the anchor reused for K steps. A hub upload of the directory shows it as the
model's page (the YAML header is the hub's card metadata).

    >>> text = model_card(summary, params, method, counts)   # summary: metrics/train/<run>.json
"""

from __future__ import annotations

from tadm.config import Params
from tadm.methods import Method
from tadm.methods.base import AnchoredMethod

CARD_FILE = "README.md"


def sample_k(p: Params) -> int:
    """The anchor refresh interval the card's example samples with: the profile's first Table 2
    budget's K (sample.budgets)."""
    return p.sample.budgets[0].K


def row_sampler(method: Method, run: str, p: Params) -> str:
    """The sampler of the run's own Table 2 row (its first row that names one), else the
    profile's sample.sampler: what the card's example samples with."""
    return next((r.sampler for r in method.rows if r.model == run and r.sampler), p.sample.sampler)


def _sampling(method: Method, p: Params, bos_id: int, run: str) -> str:
    """The card's Python example: load with AutoModel, then sample as the run's Table 2 row does."""
    def head(imports: str) -> str:
        return ("import tadm\nfrom transformers import AutoModel\n" + imports + "\n\n"
                'model = AutoModel.from_pretrained(".")  # model.net is the project\'s network\n')
    if method.adapter is None:  # its own loop (AR)
        return head("from tadm.sampling.ar import sample_ar") + (
                       f"result = sample_ar(model.net, num_samples=4, seq_len=model.config.seq_len, bos_id={bos_id},\n"
                       f"                   nucleus_p={p.sample.nucleus_p})\n")
    policy, comment = "", ""
    if method.refreshes:  # the profile's first Table 2 budget (sample.budgets)
        k = sample_k(p)
        policy, comment = f", FixedInterval({k})", f"  # the anchor refreshed every K = {k} steps"
    imports = "FixedInterval, " if method.refreshes else ""
    return head(f"from tadm.sampling import {imports}SamplerSettings, make_adapter, sample") + (
                   f"with make_adapter(model.net{policy}) as adapter:{comment}\n"
                   f'    result = sample(adapter, SamplerSettings(sampler="{row_sampler(method, run, p)}", steps=64,'
                   f" nucleus_p={p.sample.nucleus_p}),\n"
                   "                    num_samples=4, seq_len=model.config.seq_len)\n")


def model_card(summary: dict, p: Params, method: Method, counts: dict) -> str:
    """The card's text. `summary`: the run's metrics/train/<run>.json; `counts`: the packed
    data's manifest counts (tokens of each split, vocabulary, sequence length, BOS id)."""
    run, family = summary["run"], summary["model_type"]
    title = method.title or family
    train_tokens = p.train.steps * p.train.global_batch * counts["seq_len"]
    corpus = {"openwebtext": f"OpenWebText ({p.corpus.hf_dataset})", "local": "local documents",
              "shakespeare": "Tiny Shakespeare (shipped offline)"}[p.corpus.source]
    nelbo = summary["val_nelbo"]
    rows = [
        ("family", f"{title}; model_type `{family}`"),
        ("profile", f"`{p.profile}` (params.yaml of the run; seed {summary['seed']})"),
        ("data", f"{corpus}: {counts['train']['tokens']:,} training tokens, {counts['validation']['tokens']:,} "
                 f"validation tokens, sequences of {counts['seq_len']}, vocabulary {counts['vocab_size']}"
                 + (" + the mask token" if method.masked else "")),
        ("model", f"d_model {p.model.d_model}, {p.model.n_heads} heads, "
                  + (f"anchor {p.model.anchor_layers} + denoiser {p.model.denoiser_layers} layers"
                     if isinstance(method, AnchoredMethod) else f"{p.model.mdlm_layers} layers")
                  + f"; {summary['parameters']:,} parameters"),
        ("training", f"{summary['steps']:,} steps x global batch {p.train.global_batch} "
                     f"({train_tokens:,} tokens seen), AdamW lr {p.train.lr:g} ({p.train.schedule}), "
                     f"EMA {p.train.ema:g} (these are the EMA weights), precision {p.train.precision}"),
        ("validation NELBO" if method.masked else "validation NLL", f"{nelbo:.4f} nats/token (perplexity bound {summary['val_ppl_bound']:.2f}; "
                             f"{summary['below_unigram']:.3f} nats below the unigram entropy) on "
                             f"{min(p.train.eval_sequences, counts['validation']['sequences'])} validation sequences"),
    ]
    if method.refreshes:
        rows.append(("anchor reuse", f"trained with K drawn from {sorted(p.train.refresh_choices)}; sample at any K "
                                     "(`FixedInterval(K)`: the anchor network runs every K-th step, the "
                                     "shared network, fusion and denoiser every step)"))
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    tags = ["diffusion-language-model"] if method.masked else ["autoregressive-language-model"]
    return ("---\nlibrary_name: tadm\ntags:\n" + "".join(f"- {t}\n" for t in tags + [family]) + "---\n\n"
            f"# {run}\n\n"
            f"{title}, trained by the TADM reference implementation's pipeline "
            f"(`dvc repro`, stage `train`, run `{run}`). Weights: model.safetensors; "
            "config.json: the network's sizes (format version 1).\n\n"
            f"| | |\n|---|---|\n{table}\n\n"
            "## Load and sample\n\n"
            "`import tadm` registers the model families with transformers' Auto classes "
            "(no `trust_remote_code`); from this directory:\n\n"
            f"```python\n{_sampling(method, p, counts['bos_id'], run)}```\n\n"
            "`result.tokens` holds the token ids; decode them with the run's tokenizer "
            "(`data/tokenizer` of the pipeline that trained it).\n")
