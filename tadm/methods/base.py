"""A method of Table 2 is one unit: everything the pipeline asks of it, in one subclass.

A unit names its runs (the values of ``train.models``), its network (a `TadmModel` subclass,
``model_type``), its training objective (``loss`` / ``nelbo``), its sampling adapter, its FLOP
and memory formulas, the pieces a CUDA graph may replay, and its rows of Table 2. Defining the
subclass registers it (`tadm.registry.METHODS`, under every name of ``names``); the trainer, the
samplers, Table 2, the memory check and MFU then find it by name. A baseline in one file::

    # tadm/methods/mybaseline.py, imported by tadm/methods/__init__.py (its one registry line)
    class MyModel(TadmModel):              # or a model of tadm.models
        model_type = "mybaseline"
        ...                                # hidden(z_t) -> (B, L, d), head(hidden) -> logits

    class MyBaseline(Method):
        names = ("mybaseline",)            # train.models may now list it
        model = MyModel
        adapter = SingleNetworkAdapter     # how a sampler calls it (tadm.sampling.adapters)
        rows = (Row("mybaseline", "My baseline", "mybaseline", "remdm-loop"),)   # Table 2

        def nelbo(self, model, x, gen):    # (B,) nats per sequence
            t, z_t = self._noised(x, gen)
            return nelbo_from_rows(model(z_t, readout=self.readout(z_t, x)), t, self.schedule)

and its params entries (``train.models``, the ``dvc.yaml`` sample rows). The defaults below are
those of a single-network masked diffusion model (MDLM); a unit overrides what differs. Nothing
outside this package compares a method's name: every place that treats methods differently asks
the unit (``METHODS[run]``, or `tadm.registry.method_for(model_type)` for a loaded network) one
of the hooks of `Method`.
``tests/experiments/test_contract.py`` runs such a unit, defined in the test file, through
training, sampling and Table 2 on the micro profile (docs/extending.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from tadm import compute, memory_estimate as mem
from tadm.config import ModelConfig, Params
from tadm.forward_process import mask_tokens, masked_rows_capacity, sample_times
from tadm.losses import Readout, subs_readout
from tadm.models.base import TadmModel
from tadm.registry import METHODS, TABLE2_ROWS
from tadm.schedule import LogLinearSchedule, NoiseSchedule

EPS = 1e-3  # MDLM's schedule / time-sampling epsilon


@dataclass(frozen=True)
class Row:
    """One row of Table 2: a trained run (`model`, a name of train.models) and how it is sampled."""

    name: str  # the row's key (sample.replicate_rows, dvc.yaml's sample stages, the results' "row")
    label: str  # as the table prints it
    model: str | None  # the training run under models/; None: the Data row
    sampler: str | None = None  # None: the profile's sample.sampler
    bypass_fusion: bool = False  # TADM: the fusion ablation (SampleRun.bypass_fusion)
    # the throughput stage also gives every row's speed against this row, in this rank (0 first);
    # None: not a reference (tadm.experiments.throughput_results.speed_references)
    speed_reference: int | None = None

    @property
    def short(self) -> str:
        """The label without its parenthesis ("TADM‡ (γ=3e-3)" -> "TADM‡"): how prose names the row."""
        return self.label.split(" (")[0]


class Method:
    """Training objective and description of one method (module docstring).

    An instance is the objective of one run: ``Method(name, params)``; ``build_model`` makes its
    network, ``loss`` is what training optimises and ``nelbo`` the validation bound, both (B,)
    nats per sequence. The class-level hooks (``forward_flops``, ``parameters``, ...) need no
    instance: the memory check and MFU ask them before anything is built.

    What the rest of the code asks a unit, and who asks (each hook's docstring is its contract):

    - capabilities: ``refreshes`` (an anchor cache refreshed every K steps: sample.budgets' K,
      ASRD's refresh_every), ``compute_column`` (Table 2's compute column,
      tadm.sampling.accounting), ``asrd`` (ASRD's MaskedBackend decodes its network), ``masked``;
    - its network's output: ``canvas_logits`` (transformers' Auto classes, tadm.auto);
    - sampling: ``make_adapter``, ``graphed_pieces``, ``noise_schedule``;
    - compute: ``layers``, ``parameters``, ``forward_flops`` (memory check, MFU), ``layer_calls``
      (a reverse trajectory, the compute column's formula), and the step-time model's
      (tadm.step_time) ``train_head_rows`` / ``train_extra_flops`` for a training micro-batch and
      ``sampling_layers`` / ``sampling_extra_flops`` for a reverse step.
    """

    names: ClassVar[tuple[str, ...]] = ()  # run names of train.models this unit trains
    title: ClassVar[str] = ""  # the family as the paper writes it (model cards; empty: the model_type)
    model: ClassVar[type[TadmModel]]  # its network
    adapter: ClassVar[type | None] = None  # sampling adapter class; None: its own sampling loop (AR)
    refreshes: ClassVar[bool] = False  # samples with an anchor refresh policy (sample.budgets' K)
    steps_in_objective: ClassVar[bool] = False  # loss depends on train.steps (progress = step / steps)
    masked: ClassVar[bool] = True  # absorbing-state model: vocabulary + the mask token
    heads: ClassVar[int] = 1  # output heads (memory: each keeps its logits for backward)
    rows: ClassVar[tuple[Row, ...]] = ()  # its rows of Table 2, in the table's order
    compute_column: ClassVar[bool] = False  # counted in Table 2's compute column (tadm.sampling.accounting)
    asrd: ClassVar[bool] = False  # ASRD's MaskedBackend decodes its network (tadm.asrd.backends)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in cls.__dict__.get("names", ()):
            METHODS.register(name, cls)
        for row in cls.__dict__.get("rows", ()):
            TABLE2_ROWS.register(row.name, row)

    # ------------------------------------------------------------------ training objective

    def __init__(self, name: str, p: Params):
        self.name, self.p = name, p
        self.schedule = self.noise_schedule()
        # the readouts' head chunks under activation checkpointing (tadm.losses.row_losses); the
        # trainer sets False when the memory estimate with every logit kept fits the machine
        self.checkpoint_heads = True
        # the readouts' chunks (head + loss) under torch.compile with this backend; the trainer
        # sets its backend under runtime.compile (tadm.losses.compiled_piece); None: eager
        self.compile_heads: str | None = None
        self._excess: torch.Tensor | None = None  # rows past a readout's capacity, on the device

    @property
    def model_type(self) -> str:
        return self.model.model_type

    @classmethod
    def noise_schedule(cls, eps: float = EPS) -> NoiseSchedule:
        """The forward process's alpha_t: what training noises with and every sampling loop of
        this method's networks reads (`tadm.sampling.base.build_sampler`). Log-linear by default;
        a unit on another schedule overrides this one hook."""
        return LogLinearSchedule(eps)

    def build_model(self, vocab_size: int, seq_len: int) -> TadmModel:
        self.mask_id = vocab_size
        return self.model(self.p.model, vocab_size, seq_len)

    def _noised(self, x: torch.Tensor, gen: torch.Generator):
        t = sample_times(x.shape[0], EPS, True, gen, x.device)
        z_t = mask_tokens(x, self.schedule.alpha(t), self.mask_id, gen)
        return t, z_t

    def readout(self, z: torch.Tensor, x: torch.Tensor, shift: float = 0.0, build=subs_readout) -> Readout:
        """The readout (`build`: tadm.losses.subs_readout, sedd_readout) of the rows masked in `z`
        (drawn at the times of `_noised`, or up to `shift` later) against `x`, its head chunks
        checkpointed as ``checkpoint_heads`` says, its gather sized by
        `forward_process.masked_rows_capacity` (no host read). Its overflow flag is kept for
        `take_excess`."""
        B, L = z.shape
        r = build(z, x, self.mask_id, checkpoint=self.checkpoint_heads,
                  capacity=masked_rows_capacity(B, L, EPS, shift), compile=self.compile_heads)
        if r.excess is not None:
            self._excess = r.excess if self._excess is None else torch.maximum(self._excess, r.excess)
        return r

    def take_excess(self) -> torch.Tensor | None:
        """The most rows any readout made since the last call had past its capacity (a device
        scalar, 0 when none overflowed; None when no readout gathered), and forget it. Read it
        where the loop syncs anyway (tadm.train.divergence.FiniteWatch)."""
        out, self._excess = self._excess, None
        return out

    def loss(self, model, x: torch.Tensor, gen: torch.Generator, progress: float = 1.0) -> torch.Tensor:
        """What training optimises, (B,); `progress` = step / train.steps."""
        return self.nelbo(model, x, gen)

    def nelbo(self, model, x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """The validation bound, (B,) nats per sequence."""
        raise NotImplementedError

    @classmethod
    def canvas_logits(cls, model: TadmModel, z: torch.Tensor) -> torch.Tensor:
        """The whole network's logits (B, L, V') on one canvas z (B, L): what its transformers
        model returns (tadm.auto). Default: the network's first output (ADLM: the denoiser's;
        its anchor's logits are internal)."""
        out = model(z)
        return out[0] if isinstance(out, tuple) else out

    # ------------------------------------------------------------------ sampling

    @classmethod
    def make_adapter(cls, model: TadmModel, refresh=None, bypass_fusion: bool = False):
        """The sampling adapter of a loaded `model` (tadm.sampling.make_adapter)."""
        if cls.adapter is None:
            raise ValueError(f"no sampling adapter for model_type {model.model_type!r}; "
                             "AR samples with its own loop, tadm.sampling.ar.sample_ar")
        if bypass_fusion:
            raise ValueError(f"bypass_fusion only applies to TADM, not to {model.model_type!r}")
        if refresh is not None:
            raise ValueError(f"a refresh policy only applies to TADM, not to {model.model_type!r}")
        return cls.adapter(model)

    @classmethod
    def graphed_pieces(cls, model: TadmModel) -> list:
        """Modules besides the DiT blocks, fusion and conditioning embedders that a sampling step
        calls with the same shapes every time (runtime.cuda_graphs)."""
        return []

    # ------------------------------------------------------------------ compute and memory

    @classmethod
    def layers(cls, m: ModelConfig) -> int:
        """Transformer layers of the network."""
        return m.mdlm_layers

    @classmethod
    def vocabulary(cls, vocab_size: int) -> int:
        """Rows of the embedding and columns of the head: V + 1 with the mask token."""
        return vocab_size + 1 if cls.masked else vocab_size

    @classmethod
    def parameters(cls, name: str, m: ModelConfig, vocab_size: int) -> int:
        """Parameter count of run `name` (tadm.memory_estimate's formulas; tests compare with the model)."""
        v = cls.vocabulary(vocab_size)
        return v * m.d_model + cls.layers(m) * mem.block_parameters(m.d_model, m.mlp_ratio) \
            + mem.head_parameters(m.d_model, v) + mem.COND_PARAMS

    @classmethod
    def forward_flops(cls, name: str, cfg: ModelConfig, vocab_size: int, seq_len: int, head_rows: float) -> float:
        """Model forward FLOPs per token of one training pass (tadm.compute.train_forward_flops):
        the network, and its LM head on the `head_rows` fraction of positions it projects."""
        return cls.layers(cfg) * compute.dit_block_flops(cfg.d_model, seq_len, cfg.mlp_ratio) \
            + compute.lm_head_flops(cfg.d_model, vocab_size + 1) * head_rows

    @classmethod
    def layer_calls(cls, m: ModelConfig, steps: int, refresh_every: int = 1) -> int:
        """Transformer-layer calls of one reverse trajectory of `steps` steps, the anchor
        refreshed every `refresh_every` (paper Sec. 3.3; the compute column's formula). Default:
        every layer at every step."""
        return steps * cls.layers(m)

    def train_head_rows(self, tokens: int, readout_rows) -> list[float]:
        """The rows each trained LM head projects in one training micro-batch of `tokens`
        positions (tadm.step_time): ``readout_rows(shift)`` is a readout's rows for masks drawn
        up to `shift` later (its capacity, or the mean masked rows). Default: one readout."""
        return [readout_rows()]

    @classmethod
    def train_extra_flops(cls, m: ModelConfig, vocab_size: int) -> float:
        """GEMM FLOPs per token of a training forward besides the blocks and the heads' rows
        (`train_head_rows`), as the step-time model counts them. Default: none."""
        return 0

    @classmethod
    def sampling_layers(cls, m: ModelConfig, refresh_every: int = 1) -> float:
        """Transformer layers one reverse step runs on the canvas, averaged over a cycle of
        `refresh_every` steps (tadm.step_time). Default: every layer at every step."""
        return cls.layers(m)

    @classmethod
    def sampling_extra_flops(cls, m: ModelConfig, vocab_size: int) -> float:
        """GEMM FLOPs per canvas token of one reverse step besides its layers
        (`sampling_layers`) and the LM head on the decoded rows (tadm.step_time). Default: none."""
        return 0


class AnchoredMethod(Method):
    """A method with two networks, an anchor and a denoiser (ADLM, TADM): their layers, two
    heads and two conditioning embedders. A subclass states what joins them, ``joint_parameters``
    (ADLM: a map from the anchor's logits; TADM: the fusion), and its FLOPs."""

    heads: ClassVar[int] = 2  # the anchor's and the denoiser's

    @classmethod
    def layers(cls, m: ModelConfig) -> int:
        return m.anchor_layers + m.denoiser_layers

    @classmethod
    def joint_parameters(cls, m: ModelConfig, vocab_size: int) -> int:
        """Parameters of what feeds the anchor's output into the denoiser."""
        raise NotImplementedError

    @classmethod
    def parameters(cls, name: str, m: ModelConfig, vocab_size: int) -> int:
        """The single network's count over both networks' layers, plus the second head, the
        second conditioning embedder and what joins the two."""
        return super().parameters(name, m, vocab_size) + mem.head_parameters(m.d_model, cls.vocabulary(vocab_size)) \
            + mem.COND_PARAMS + cls.joint_parameters(m, vocab_size)

