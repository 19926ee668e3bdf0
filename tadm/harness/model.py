"""lm-evaluation-harness's model ``tadm``: Table 1's rows (and the LLaDA group's) on the harness.

    python -m tadm.harness --model tadm --model_args row=tadm,K=2 --tasks tadm_arithmetic

A row is Table 1's (`tadm.experiments.table1`): ``base`` (the frozen DiffusionGemma's own
``generate``), ``tadm`` (TADM:Post-train, the anchor refreshed every ``K`` steps), ``control``
(the fresh-anchor control, K = 1) or a training-free cache of `tadm.registry.DG_CACHES`
(``naive``, ``feature``; K >= 2). The models load as Table 1 loads them (``params``: the params
file, ``root``: the directory holding models/), generate with the paper's sampler at
posttrain.sample_steps (entropy-bound acceptance, the temperature schedule; a task's
``do_sample`` / ``temperature`` do not change it), each prompt one no-think chat turn (so
``--apply_chat_template`` is refused: the turn is already applied). ``max_gen_toks`` is the
generated length (DiffusionGemma rounds it up to whole canvases); the completion ends at the
first EOS and is cut at the task's ``until`` strings.

Batches (``--batch_size N``): prompts are left-padded with an attention mask, and every prompt
draws its randomness from its own stream, seeded by (``seed``, the task, the document), so a
document's completion is the same in any batch and at any batch size (:func:`row_streams`).

Speed is counted as Table 1 counts it (:func:`tadm.experiments.table1_stats.throughput`): generated
canvas positions only (not prompt tokens), over the median wall time of the full batches; the
harness's results carry it under ``config`` (``generated_tokens_per_s``), per generated length.

``row=llada``: a row of the ASRD comparison's LLaDA group (`tadm.experiments.asrd.llada`) on
LLaDA (asrd.llada_model, or the model argument ``llada``): ``variant`` names the decoder or the
training-free cache row by its label's slug (``low-confidence-llada``, ``asrd``,
``fast-dllm-prefix-cache-per-block``, ``dllm-cache-k-4``, ...; a wrong name lists them). It
generates asrd.llada_gen_tokens positions (as LLaDA's own harness wrapper, whatever the task's
``max_gen_toks``) in LLaDA-Instruct's chat turn; its greedy rows decode a padded batch as each
prompt alone; a stochastic row (ASRD's perturbation, plain, ReMDM) draws from one stream per
batch, the first document's.

``loglikelihood`` and ``loglikelihood_rolling`` are refused (one line): DiffusionGemma is a
uniform-state block diffusion model (and no Monte Carlo estimate of LLaDA's is implemented), so
multiple-choice-by-likelihood tasks do not run; the generative variants do (docs/harness.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import re
import time
import unicodedata
from collections import defaultdict
from pathlib import Path

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from tqdm import tqdm

from tadm import config, runtime
from tadm.errors import ConfigError, TadmError
from tadm.registry import DG_CACHES

MODEL_NAME = "tadm"
FIXED_ROWS = ("base", "tadm", "control")
LLADA = "llada"  # the ASRD comparison's LLaDA group (its decoders and training-free caches)


def harness_error(key: str, message: str) -> ConfigError:
    """A bad model argument or harness flag, as one line naming it (not a params.yaml key)."""
    return ConfigError(key, message, source="tadm.harness")


class HarnessRefused(TadmError):
    """A request the harness model does not serve (one line, exit 2)."""


def rows() -> tuple[str, ...]:
    return FIXED_ROWS + tuple(DG_CACHES.names()) + (LLADA,)


def request_seed(seed: int, task: str, doc_id: int, repeat: int = 0) -> int:
    """The random stream of one document of one task (its `repeat`-th sample, for tasks that
    draw several): a stable 63-bit hash of (seed, task, doc, repeat)."""
    digest = hashlib.sha256(f"{seed}:{task}:{doc_id}:{repeat}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@contextlib.contextmanager
def row_streams(generators: list[torch.Generator]):
    """Inside, row b of a batch of B = len(generators) draws from ``generators[b]``: the
    ``torch.randint(size=(B, ...))`` and ``torch.multinomial`` over B row groups that
    DiffusionGemma's ``generate`` (transformers) makes without a generator -- the canvas's noise,
    its renoising and the token draws. So a row's tokens do not depend on the other rows of the
    batch or on the batch size. Calls with another shape, or their own generator, are untouched.
    (transformers' loop takes no generator: the two functions are replaced on the torch module
    for the duration, in this single-process evaluation.)"""
    B = len(generators)
    randint, multinomial = torch.randint, torch.multinomial

    def per_row_randint(*args, **kw):
        size = kw.get("size")
        if args or size is None or kw.get("generator") is not None or len(size) < 1 or size[0] != B:
            return randint(*args, **kw)
        rest = {k: v for k, v in kw.items() if k not in ("size", "low", "high")}
        return torch.cat([randint(kw.get("low", 0), kw["high"], (1, *size[1:]), generator=g, **rest)
                          for g in generators])

    def per_row_multinomial(x, num_samples, replacement=False, *, generator=None, **kw):
        if generator is not None or x.dim() != 2 or x.shape[0] % B:
            return multinomial(x, num_samples, replacement, generator=generator, **kw)
        return torch.cat([multinomial(part, num_samples, replacement, generator=g)
                          for part, g in zip(x.chunk(B), generators)])

    torch.randint, torch.multinomial = per_row_randint, per_row_multinomial
    try:
        yield
    finally:
        torch.randint, torch.multinomial = randint, multinomial


def _batch_size(value) -> int:
    if isinstance(value, str) and value.startswith("auto"):
        raise harness_error("batch_size", "'auto' is not supported by the tadm harness model: give a number")
    try:
        size = int(value)
    except (TypeError, ValueError):
        raise harness_error("batch_size", f"must be a positive integer, got {value!r}") from None
    if size < 1:
        raise harness_error("batch_size", f"must be a positive integer, got {size}")
    return size


class _DiffusionGemmaRow:
    """A Table 1 row on the frozen DiffusionGemma (`tadm.experiments.table1.Table1Method`), generating
    through Table 1's `Runner` with every prompt on its own random stream."""

    def __init__(self, p, d, row: str, k: int | None, root: Path):
        # lazy: imports transformers (~2 s); only the DiffusionGemma rows need it, not LLaDA's
        from tadm.experiments.diffusiongemma import load_models
        # lazy: imports transformers (~2 s); only the DiffusionGemma rows need it, not LLaDA's
        from tadm.experiments.table1 import CONTROL, Runner, Table1Method

        base, tadm, fresh, tok = load_models(p, root, d, control=row == "control")
        if row == "base":
            method = Table1Method("Base", base, None, None, "base", tuple(tadm.split.split))
        elif row == "control":
            method = Table1Method(CONTROL, base, fresh, 1, "control")
        elif row == "tadm":
            method = Table1Method(f"TADM K={k}", base, tadm, k, "tadm")
        else:
            cache = DG_CACHES[row]
            method = Table1Method(f"{cache.label} K={k}", base, cache.build(base, p), k, row)
        self.method, self.runner = method, Runner(p, tok, [method], d)
        self.label, self.family, self.k = method.label, method.family, method.k

    def length(self, asked: int) -> int:
        return asked  # generate rounds it up to whole canvases

    def tokens_per_prompt(self, length: int) -> int:
        return self.runner.tokens_per_prompt(_Length(length))

    def generate(self, prompts: list[str], length: int, seeds: list[int], seed: int, lo: int):
        streams = [torch.Generator(self.runner.device).manual_seed(s) for s in seeds]
        with row_streams(streams):
            return self.runner.generate_batch(self.method, prompts, length, seed, lo)


class _LladaRow:
    """A row of the ASRD comparison's LLaDA group (`tadm.experiments.asrd.llada`): a decoding
    method of `llada_variants`, or a training-free cache row, on LLaDA (asrd.llada_model, or the
    `llada` model argument), named by its label's slug (:func:`slug`)."""

    def __init__(self, p, d, variant: str | None):
        # lazy: the harness imports this module at start-up; only LLaDA rows load the ASRD stack (~0.15 s)
        from tadm.experiments.asrd.llada import LladaRunner, llada_variants

        known = {slug(v.label): v for v in llada_variants(p)}
        if variant not in known:
            raise harness_error("model_args.variant", f"row llada needs one of {', '.join(known)}, got {variant!r}")
        self.variant = known[variant]
        if not p.asrd.llada_model:
            raise harness_error("model_args.llada", "row llada needs LLaDA: set asrd.llada_model or the model "
                              "argument llada (a hub id or a local directory)")
        self.runner = LladaRunner(p, d)
        self.backend = self.runner.backend(self.variant.refresh_every, cache=self.variant.cache)
        self.label, self.family, self.k = self.variant.label, "llada", self.variant.refresh_every
        self.device = d.device

    def length(self, asked: int) -> int:
        return self.runner.gen  # asrd.llada_gen_tokens, as LLaDA's own harness wrapper (gen_length)

    def tokens_per_prompt(self, length: int) -> int:
        return length

    def generate(self, prompts: list[str], length: int, seeds: list[int], seed: int, lo: int):
        """One batch; the decoder's draws (where the row has any) come from the first prompt's
        stream, so a stochastic row's completions depend on the batch (low-confidence, the
        threshold and the caches decode greedily at asrd.temperature 0)."""
        # lazy: the harness imports this module at start-up; only LLaDA rows load the ASRD stack (~0.15 s)
        from tadm.experiments.asrd.llada import BenchmarkTask

        task = BenchmarkTask("harness", list(prompts), lambda i, text: False)
        self.runner.batch = len(prompts)  # the harness's batch, not asrd.llada_batch_size
        settings = self.variant.settings.replace(seed=seeds[0])
        decode_batch = self.runner.decoder(self.backend, task, settings)
        runtime.synchronize(self.device)
        t0 = time.perf_counter()
        _, texts, _ = decode_batch(0)
        runtime.synchronize(self.device)
        seconds = time.perf_counter() - t0
        return texts, seconds, seconds


def pretrained_arg(pretrained, model_path) -> str | None:
    """The model directory of the model arguments ``pretrained`` or ``model_path`` (its alias,
    LLaDA's harness wrapper's spelling); both given is a one-line error."""
    if pretrained is not None and model_path is not None:
        raise harness_error("model_args.model_path", "model_path is an alias of pretrained: give one of them")
    value = pretrained if pretrained is not None else model_path
    if value is not None and not str(value).strip():
        raise harness_error("model_args.pretrained", "must name a model directory, got ''")
    return None if value is None else str(value)


def same_path(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name the same file or directory (hub ids compare as text)."""
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve() if Path(a).exists() or Path(b).exists() \
        else str(a) == str(b)


def row_model_dir(p, row: str, root: Path) -> str:
    """The model directory a row loads: TADM's fusion (models/dg_tadm), the control's
    (models/dg_fresh), the base (models/dg_base or posttrain.base_model) for the base and the
    caches, LLaDA (asrd.llada_model) for row llada."""
    from tadm.posttrain import model as dgm  # lazy: tadm.posttrain.model imports transformers (~2 s); only the DiffusionGemma rows need it

    if row == LLADA:
        return p.asrd.llada_model
    if row == "tadm":
        return str(root / dgm.TADM_DIR)
    if row == "control":
        return str(root / dgm.FRESH_DIR)
    return dgm.base_source(p, root)


def default_model_dir(model_args: dict) -> str | None:
    """The ``pretrained`` the launcher adds for `model_args` (the row's model directory, names
    the results folder); None where the arguments do not settle it (the model's own error
    then comes when it loads)."""
    try:
        p = config.load(Path(str(model_args.get("params", "params.yaml"))))
        row = str(model_args.get("row", "tadm"))
        if row == LLADA and model_args.get("llada"):
            return str(model_args["llada"])
        return row_model_dir(p, row, Path(str(model_args.get("root", ".")))) or None
    except (TadmError, OSError):
        return None


def slug(label: str) -> str:
    """A row label as a model argument: NFKC-normalised (d² -> d2), lower case, runs of other
    characters as one '-' ("Fast-dLLM prefix cache K=4" -> "fast-dllm-prefix-cache-k-4",
    "d²Cache (as released)" -> "d2cache-as-released")."""
    return re.sub(r"[^a-z0-9]+", "-", unicodedata.normalize("NFKC", label).lower()).strip("-")


SEED_MAX = 2 ** 63 - 1
MAX_GEN_TOKS = 1 << 16  # posttrain.max_new_tokens's bound: 16x the paper's longest answer (4,096)


def _whole(name: str, value, ge: int, le: int | None = None) -> int:
    """A model or generation argument that must be a whole number in [ge, le]: a one-line error
    naming it for anything else (a float is never truncated; text, a list, nan are refused)."""
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise harness_error(name, f"must be a whole number, got {value!r}") from None
    if isinstance(value, float) and value.is_integer():  # lm-eval reads "-1" as -1.0: whole, not truncated
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise harness_error(name, f"must be a whole number, got {value!r}")
    if value < ge or (le is not None and value > le):
        raise harness_error(name, f"must be in [{ge}, {le}], got {value}" if le is not None
                            else f"must be >= {ge}, got {value}")
    return value


@register_model(MODEL_NAME)
class TadmLM(LM):
    """One row of Table 1, or of the LLaDA group, as a harness model (module docstring).
    ``model_args``: row, K, params (default params.yaml), root (default .), seed (default
    posttrain.seed), pretrained (alias model_path: the row's model directory, which it must
    be; the launcher adds it so the results folder is named after the model); for row llada:
    variant, llada (pretrained is its alias there). The harness's ``--device`` (its default
    cuda:0: pass ``--device cpu`` on a machine without CUDA) and ``--batch_size``."""

    def __init__(self, row: str = "tadm", K: int | None = None, params: str = "params.yaml", root: str = ".",
                 seed: int | None = None, variant: str | None = None, llada: str | None = None,
                 pretrained: str | None = None, model_path: str | None = None,
                 batch_size=1, max_batch_size=None, device: str | None = None, **unused):
        super().__init__()
        if unused:
            raise harness_error("model_args", f"unknown argument(s) {', '.join(sorted(unused))} (known: row, K, "
                                "params, root, seed, variant, llada, pretrained, model_path, device, batch_size)")
        pretrained = pretrained_arg(pretrained, model_path)
        if row not in rows():
            raise harness_error("model_args.row", f"must be one of {', '.join(rows())}, got {row!r}")
        k = None if K is None else _whole("model_args.K", K, 1)
        if row == "tadm" and (k is None or k < 1):
            raise harness_error("model_args.K", f"row tadm needs the refresh interval K >= 1, got {K!r}")
        if row in DG_CACHES and (k is None or k < 2):
            raise harness_error("model_args.K", f"a training-free cache reuses the anchor: K >= 2 (K = 1 is the base), got {K!r}")
        if row in ("base", "control") and k not in (None, 1):
            raise harness_error("model_args.K", f"row {row} decodes at K = 1, got {K!r}")
        if row == LLADA and k is not None:
            raise harness_error("model_args.K", "row llada takes its interval from its variant (e.g. dllm-cache-k-4)")
        if row != LLADA and (variant is not None or llada is not None):
            raise harness_error("model_args.variant", f"variant and llada are arguments of row llada, not of row {row}")
        self.batch_size = _batch_size(batch_size)
        if device:
            try:
                runtime.resolve_device(device)
            except ConfigError as e:  # lm-eval's --device defaults to cuda:0
                raise harness_error("--device", f"{e.detail} (lm-eval's default is cuda:0: pass --device cpu "
                                  "on a machine without CUDA)") from None
        p = config.load(Path(params))
        if pretrained is not None and row == LLADA:
            if llada is not None and str(llada) != pretrained:
                raise harness_error("model_args.pretrained", f"row llada loads one LLaDA: pretrained={pretrained!r} "
                                    f"and llada={llada!r} differ")
            llada = pretrained
        elif pretrained is not None:
            loads = row_model_dir(p, row, Path(root))
            if not same_path(pretrained, loads):
                raise harness_error("model_args.pretrained", f"row {row} loads {loads!r} (the profile's model under "
                                    f"root={root!r}), got {pretrained!r}: point root at the directory holding models/")
        if k is not None and k > p.posttrain.sample_steps:
            raise harness_error("model_args.K", f"must be <= posttrain.sample_steps ({p.posttrain.sample_steps}, the "
                                f"denoising steps per canvas; a larger K refreshes once per canvas), got {k}")
        rt = dataclasses.replace(p.runtime, nproc=1, **({"device": device} if device else {}))
        p = dataclasses.replace(p, runtime=rt)
        if llada is not None:
            p = dataclasses.replace(p, asrd=dataclasses.replace(p.asrd, llada_model=str(llada)))
        self.p, self.seed = p, p.posttrain.seed if seed is None else _whole("model_args.seed", seed, 0, SEED_MAX)
        self.pretrained = p.asrd.llada_model if row == LLADA else row_model_dir(p, row, Path(root))
        d = runtime.Dist(0, 1, runtime.resolve_device(rt.device), rt.precision)
        self.engine = _LladaRow(p, d, variant) if row == LLADA else _DiffusionGemmaRow(p, d, row, k, Path(root))
        self.method = getattr(self.engine, "method", None)  # the Table1Method of a DiffusionGemma row
        self.timed: dict[int, list[tuple[int, float, float]]] = defaultdict(list)  # tokens per prompt -> batches

    # ------------------------------------------------------------------ generation

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Each request's completion (module docstring): batches of equal generation settings, in
        request order, each prompt on its own random stream."""
        groups: dict[int, list[int]] = defaultdict(list)  # generated length -> request indices
        settings = []
        for i, req in enumerate(requests):
            context, gen = req.args
            gen = dict(gen or {})
            until = gen.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            asked = next((_whole(k, gen[k], 1, MAX_GEN_TOKS) for k in ("max_gen_toks", "max_new_tokens", "max_tokens")
                          if gen.get(k) is not None), self.p.posttrain.canvas_length)
            length = self.engine.length(asked)
            settings.append((context, until, length))
            groups[length].append(i)
        seeds, seen = [], defaultdict(int)  # a document's repeats (task repeats: N samples) get streams of their own
        for req in requests:
            task, doc_id = self._doc_of(req)
            seeds.append(request_seed(self.seed, task, doc_id, seen[task, doc_id]))
            seen[task, doc_id] += 1
        out: list[str | None] = [None] * len(requests)
        bar = tqdm(total=len(requests), desc=f"tadm[{self.engine.label}]", disable=disable_tqdm)
        for length, members in groups.items():
            per_prompt = self.engine.tokens_per_prompt(length)
            for lo in range(0, len(members), self.batch_size):
                batch = members[lo: lo + self.batch_size]
                texts, seconds, decoder = self.engine.generate(
                    [settings[i][0] for i in batch], length, [seeds[i] for i in batch], self.seed, lo)
                self.timed[per_prompt].append((len(batch), seconds, decoder))
                for i, text in zip(batch, texts):
                    out[i] = cut_at(text, settings[i][1])
                    self.cache_hook.add_partial("generate_until", requests[i].args, out[i])
                bar.update(len(batch))
        bar.close()
        return out

    @staticmethod
    def _doc_of(req) -> tuple[str, int]:
        task, doc_id = (req.metadata or ("", req.idx))[:2]
        return str(task), int(doc_id if doc_id is not None else req.idx)

    # ------------------------------------------------------------------ refused

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        raise HarnessRefused("the tadm harness model generates only: loglikelihood requests (multiple choice by "
                             "likelihood) are not served; run the task's generative variant (docs/harness.md)")

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        raise HarnessRefused("the tadm harness model generates only: loglikelihood_rolling (perplexity tasks) "
                             "is not served")

    def apply_chat_template(self, chat_history, add_generation_prompt: bool = True) -> str:
        raise HarnessRefused("the tadm harness model wraps every prompt in its no-think chat turn itself (as "
                             "Table 1 does): run without --apply_chat_template")

    # ------------------------------------------------------------------ what the results record

    def speed(self) -> dict:
        """Generated tokens / s as Table 1 counts them, per generated length (canvas positions
        per prompt): the full batches' median time (tadm.experiments.table1_stats.throughput)."""
        # lazy: the harness imports this module at start-up; only the speed report loads tadm.metrics
        from tadm.experiments.table1_stats import throughput

        return {str(n): throughput(timed, n) for n, timed in sorted(self.timed.items())}

    def get_model_info(self) -> dict:
        speeds = self.speed()
        return {"tadm_row": self.engine.label, "tadm_pretrained": self.pretrained, "tadm_family": self.engine.family,
                "tadm_refresh_every": self.engine.k,
                "tadm_seed": self.seed, "tadm_sample_steps": self.p.posttrain.sample_steps,
                "generated_tokens_per_s": {n: s["tokens_per_s"] for n, s in speeds.items()},
                "generated_tokens_counted": "generated canvas positions only (not the prompt), over the median "
                                            "time of the full batches, as Table 1"}


@dataclasses.dataclass
class _Length:
    """What Runner.tokens_per_prompt reads of a task: its generated length."""

    max_new_tokens: int


def cut_at(text: str, until: list[str]) -> str:
    """`text` up to the first occurrence of any non-empty stop string of `until`."""
    cuts = [text.find(s) for s in until if s]
    cuts = [c for c in cuts if c >= 0]
    return text[: min(cuts)] if cuts else text


__all__ = ["harness_error", "MODEL_NAME", "default_model_dir", "pretrained_arg", "row_model_dir", "TadmLM",
           "HarnessRefused", "row_streams", "request_seed", "cut_at", "rows", "slug"]
