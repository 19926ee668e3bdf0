"""The run-wide sections (`claims`, `runtime`) and the top-level `Params` that holds every section."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tadm.config.asrd import AsrdConfig
from tadm.config.data import CorpusConfig, PackingConfig, SftConfig, TokenizerConfig
from tadm.config.fields import spec
from tadm.config.posttrain import PosttrainConfig
from tadm.config.pretrain import ModelConfig, TrainConfig
from tadm.config.sampling import EvalConfig, SampleConfig
from tadm.registry import DG_CACHES


@dataclass
class ClaimsConfig:
    """The claims table's verdict rules (tadm.experiments.claims), declared before any number is
    read: the threshold of direction claims, the interval of equivalence claims, the power behind
    the minimum detectable effects, the equivalence margins per metric, the rule for a family of
    findings tested at once, and the training-free comparator of TADM:Post-train."""

    z: float = spec(2.0, gt=0.0)  # direction: an effect beyond z se (Student's t at the se's df)
    equivalence_level: float = spec(0.90, gt=0.5, lt=1.0)  # TOST: this two-sided interval inside the margin
    power: float = spec(0.8, gt=0.5, lt=1.0)  # minimum detectable effect and the n for the paper's effect
    margin_accuracy_pts: float = spec(1.5, gt=0.0, le=100.0)  # accuracy, points
    margin_mauve: float = spec(0.05, gt=0.0, lt=1.0)  # MAUVE, absolute (a 0-1 metric)
    margin_gen_ppl_rel: float = spec(0.05, gt=0.0, lt=1.0)  # Gen PPL, relative (5 %: log ratio within log 1.05)
    # several findings resting on one trained checkpoint, tested at once: "holm" (Holm's step-down
    # over each family's p-values, each side alike) or "none" (each finding alone)
    family_rule: Literal["holm", "none"] = "holm"
    # the training-free caches TADM:Post-train is judged against (each one of posttrain.cache_methods),
    # named before the run rather than picked as the most accurate after it: one finding per cache,
    # the findings one Holm family ("training_free", declared in the claims catalog)
    training_free_comparator: list[str] = spec(["naive", "feature"], nonempty=True, unique=True, registry=DG_CACHES)
    # power declared before the effect is read: a finding whose minimum detectable effect at this
    # run's n (from its se, never its effect) exceeds its target -- the equivalence margin, the
    # paper's effect of a direction finding (else the metric's margin), the margin plus the paper's
    # improvement of a non-inferiority finding -- is "underpowered at this profile" (off: never)
    power_rule: Literal["mde", "off"] = "mde"
    # a speed finding is reproduced only when measured / FLOP-bound lies in [lo, hi] (and it is
    # faster beyond the direction rule): below lo the cache's saving is lost to overhead, above hi the
    # baseline pays costs the FLOP bound does not count
    speed_bound_lo: float = spec(0.85, gt=0.0, le=1.0)
    speed_bound_hi: float = spec(1.25, ge=1.0)
    # the Gen PPL judge tested on itself: it and the AR model must order Table 2's cells alike, their
    # Spearman rank correlation at least this (with its corruption ladder and the shuffled-text ratio)
    judge_ar_rank_min: float = spec(0.7, ge=-1.0, le=1.0)


@dataclass
class RuntimeConfig:
    """Where and how every stage runs (tadm.runtime): one device setting for all of them."""

    device: str = "auto"  # auto (CUDA when present, else CPU) | cpu | cuda | cuda:N
    precision: Literal["bf16", "fp32"] = "bf16"  # autocast of sampling (GPU; CPU with native bf16) and scoring (GPU)
    tf32: bool = True  # TF32 matmuls on Ampere and newer GPUs
    nproc: int = spec(1, ge=1)  # processes per node: > 1 runs train / sampling / scoring under torchrun
    jobs: int = spec(1, ge=1)  # jobs of the train stage side by side, each with 1/jobs of the CPU threads
    # on a CPU (nproc 1), Table 1 and the ASRD comparison split their prompt batches over this many
    # processes (torchrun, gloo), each with 1/cpu_processes of the CPU threads: DiffusionGemma's small
    # layers use two threads poorly (benchmarks/results/threads.md); ignored on a GPU
    cpu_processes: int = spec(1, ge=1)
    compile: bool = False  # torch.compile the network that trains (each transformer block, tadm.train.trainer)
    cuda_graphs: bool = False  # CUDA-graph replay of sampling's fixed-shape pieces; ignored (one note) off CUDA


@dataclass
class TimingConfig:
    """Speed across invocations (outside the training sections: no run's identity depends on it).
    Table 1's throughput combines table1_blocks timing blocks, each its own process -- the table1
    stage's scored pass (block 0) and table1_blocks - 1 timing-only blocks (stages
    table1_speed@b<i>), each with its own sampling seed and table1_batches full prompt batches of
    its own (spread over the task's batches): mean log ratio, se on table1_blocks - 1 df. 1: the
    scored pass alone. (Table 2's blocks: sample.throughput_blocks.)"""

    table1_blocks: int = spec(3, ge=1, le=64)
    table1_batches: int = spec(2, ge=1, le=1024)


@dataclass
class Params:
    profile: str = spec("default", nonempty=True)
    seed: int = spec(0, ge=0, le=2 ** 63 - 1)
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
    timing: TimingConfig = field(default_factory=TimingConfig)
