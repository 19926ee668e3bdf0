"""The hub card (``README.md``) of a directory `tadm.hub.export` writes: transformers' card
metadata (YAML), the training facts of the pipeline's own card (`tadm.train.card`), how to load
the model with ``trust_remote_code`` and sample it with its Table 2 sampler, and the citation.

    >>> text = hub_card(summary, params, method, counts, sampling)
"""

from __future__ import annotations

import yaml

from tadm.config import Params
from tadm.methods import Method
from tadm.train.card import model_card

# the paper's BibTeX: equal to the README's "## Citation" block (tested)
BIBTEX = """@article{paul2026tadm,
  title   = {Time-Anchored Diffusion Language Models: Latent-Space Caching for Fast Generation},
  author  = {Paul and Rout and Akella and Shakkottai},
  journal = {arXiv preprint arXiv:2609.37924},
  year    = {2026}
}"""

OBJECTIVES = {  # model_type -> the training objective, as config.json's method.objective states it
    "mdlm": "continuous-time masked-diffusion NELBO (SUBS)",
    "sedd": "score entropy (absorbing)",
    "adlm": "denoiser NELBO + gamma x anchor cross-entropy (gamma ramped)",
    "tadm": "T-ANELBO on stale-anchor pairs (+ gamma x anchor cross-entropy)",
    "ar": "next-token cross-entropy",
}
DATASETS = {"openwebtext": ["Skylion007/openwebtext"], "shakespeare": ["tiny_shakespeare"], "local": []}


def _facts(summary: dict, p: Params, method: Method, counts: dict) -> str:
    """The pipeline card's table (family, profile, data, model, training, validation bound, anchor reuse)."""
    text = model_card(summary, p, method, counts)
    rows = [line for line in text.splitlines() if line.startswith("| ") and line not in ("| | |",)]
    return "\n".join(rows) + "\n"


def _metadata(summary: dict, p: Params, method: Method) -> str:
    family, run = summary["model_type"], summary["run"]
    masked = method.masked
    tags = ["diffusion-language-model", "masked-diffusion"] if masked else ["autoregressive-language-model"]
    tags = list(dict.fromkeys(tags + ["tadm", family, "custom_code"]))
    datasets = DATASETS[p.corpus.source] if p.corpus.source != "openwebtext" else [p.corpus.hf_dataset]
    task = "fill-mask" if masked else "text-generation"
    meta = {
        "library_name": "transformers",
        "license": "mit",
        "pipeline_tag": task,
        "tags": tags,
        **({"datasets": datasets} if datasets else {}),
        "metrics": ["perplexity"],
        "model-index": [{
            "name": run,
            "results": [{
                "task": {"type": task, "name": "language modelling"},
                "dataset": {"name": (datasets or ["local documents"])[0], "type": (datasets or ["local"])[0],
                            "split": "validation"},
                "metrics": [
                    {"type": "perplexity", "value": round(float(summary["val_ppl_bound"]), 4),
                     "name": "validation perplexity bound" if masked else "validation perplexity"},
                    {"type": "nelbo" if masked else "nll", "value": round(float(summary["val_nelbo"]), 4),
                     "name": "validation NELBO (nats/token)" if masked else "validation NLL (nats/token)"},
                ],
            }],
        }],
    }
    return yaml.safe_dump(meta, sort_keys=False, allow_unicode=True, width=1000)


def _usage(family: str, sampling: dict) -> str:
    """The load-and-sample example: the row's sampler, steps and (TADM) K as keyword arguments."""
    auto = "AutoModelForCausalLM" if family == "ar" else "AutoModelForMaskedLM"
    args = [f"sampler=\"{sampling['sampler']}\""]
    if family != "ar":
        args.append(f"steps={sampling['steps']}")
    if family == "tadm":
        args.append(f"refresh_every={sampling['refresh_every']}")
    args += [f"top_p={sampling['top_p']}", "seed=0"]
    return (f"```python\nfrom transformers import {auto}, AutoTokenizer\n\n"
            f'model = {auto}.from_pretrained("<this repository or directory>", trust_remote_code=True)\n'
            'tokenizer = AutoTokenizer.from_pretrained("<this repository or directory>", trust_remote_code=True)\n\n'
            f"tokens = model.generate(num_samples=4, {', '.join(args)})\n"
            "print(tokenizer.batch_decode(tokens, skip_special_tokens=True))\n```\n")


def hub_card(summary: dict, p: Params, method: Method, counts: dict, sampling: dict) -> str:
    """The card's text. `summary`: metrics/train/<run>.json; `counts`: the pack manifest's
    counts; `sampling`: generation_config.json's sampler, steps, refresh_every and top_p."""
    family, run = summary["model_type"], summary["run"]
    title = method.title or family
    if family == "ar":
        forward = ("`model(input_ids).logits` is (B, L, V): position i's next-token logits; "
                   "`labels=input_ids` adds the shifted cross-entropy as `.loss`.")
    else:
        forward = ("`model(input_ids).logits` is (B, L, V+1): raw logits over the vocabulary and the mask "
                   f"token (id V = {counts['vocab_size']}, `<|mask|>` in the tokenizer), on a canvas "
                   "z_t in 0..V; apply SUBS (the mask logit -inf, unmasked positions copied) for x_theta "
                   "(`modeling_tadm.x0_log_probs`).")
        if family == "tadm":
            forward += (" TADM also takes `anchor_input_ids` (the stale canvas z_t' its anchor is computed on) "
                        "or `anchor_hidden_states` (a cached anchor, returned as `.anchor_hidden_states`).")
    return ("---\n" + _metadata(summary, p, method) + "---\n\n"
            f"# {run}\n\n"
            f"{title}, trained by the TADM reference implementation's pipeline (`dvc repro`, stage `train`, "
            f"run `{run}`) and exported with `python -m tadm.hub export`. It loads with transformers "
            "alone: `trust_remote_code=True` runs this repository's `configuration_tadm.py`, "
            "`modeling_tadm.py` and `generation_tadm.py` (torch and transformers only; the `tadm` "
            "package is not needed).\n\n"
            f"| | |\n|---|---|\n{_facts(summary, p, method, counts)}\n"
            "## Load and sample\n\n"
            f"{_usage(family, sampling)}\n"
            f"{forward} `generate` samples with the sampler of the model's Table 2 row by default "
            "(generation_config.json); it draws, token for token, what the project's `tadm.sampling` "
            "draws with the same settings and seed.\n\n"
            "## How to cite\n\n"
            f"```bibtex\n{BIBTEX}\n```\n")


__all__ = ["BIBTEX", "OBJECTIVES", "hub_card"]
