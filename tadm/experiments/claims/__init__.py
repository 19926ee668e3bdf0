"""The paper's claims, each checked against this run's numbers by a rule declared in its catalog
entry (`catalog.CATALOG`), before any number is read.

``python -m tadm claims`` (the `claims` stage) reads what the pipeline wrote -- Table 2 rows
(results/table2) and their per-sample scores (samples/<row>: MAUVE features, the shared
references' features, per-sample Gen PPL terms), the training replicates' draws of the compared
rows (samples/replicates, results/replicates), the paired throughput stage
(results/throughput.json), the refresh sweep (results/sweep, samples/sweep), Table 2's compute
column at the paper's depths (metrics/compute_column.json), Table 1 (results/table1.json), the
staleness summary (paper_figures/anchor_staleness.csv), the training and evaluator metrics -- and
writes ``paper_figures/claims.{md,csv}`` and ``paper_figures/claims_summary.md`` (the README's
results table).

Two parts
---------
*Implementation checks* are identities fixed by the design (counted layer-call ratios, the
post-train split's bound): they show that the cache skips the calls it should. Verdict: pass or
fail (exact). They are not findings and the tally does not count them.

*Findings* are the paper's comparative claims; *mechanism checks* (``Entry.mechanism``: the cached
anchor goes stale, the fusion corrects part of it) are what Sec. 3 says happens inside the model,
decided by the same rules but alone, listed apart and not in the tally. Each gets one of three
rules (params ``claims``), each a pair of one-sided tests whose p-values decide it (Student's t at
the se's degrees of freedom where the se includes a between-training-run variance, else the
normal):

    direction        the effect points the paper's way: reproduced when effect > 0 at level
                     1 - Phi(z) (z = claims.z, 2: beyond 2 se for a normal se), contradicted when
                     effect < 0 at that level, else inconclusive
    equivalence      "on par", "preserves accuracy": two one-sided tests at (1 -
                     claims.equivalence_level) / 2 each, i.e. the equivalence_level (90 %)
                     interval of the difference: reproduced when it lies inside +-margin,
                     contradicted when it lies wholly outside it, else inconclusive. Margins per
                     metric: claims.margin_* (accuracy 1.5 points, MAUVE 0.05, Gen PPL 5 %, as a
                     log ratio within log 1.05)
    non-inferiority  "matches or improves": the one-sided half of the same test

*Power first* (claims.power_rule "mde"): before the effect is read, a finding whose minimum
detectable effect at this run's n ((crit + power quantile) x se, from the se alone; `rules.mde`)
exceeds its target (`rules.target`: the equivalence margin; the paper's effect of a direction
finding, else its metric's margin; the margin plus the paper's improvement for non-inferiority) is
*underpowered at this profile*, with the training runs per arm (or samples) that would decide it.

*Speed findings* (``Entry.speed``) are direction findings judged on their size too: reproduced
only when measured / FLOP-bound lies in [claims.speed_bound_lo, claims.speed_bound_hi] (else
inconclusive), the paper's own measured / bound at its settings printed beside (`catalog`). A
finding's other counted conditions (the sweep's compute falling with K) contradict it when unmet.

*Several findings at once* (claims.family_rule "holm"): each finding's family is declared in the
catalog (``Entry.family``: "pretraining", "posttrain", "training_free" -- TADM:Post-train against
each cache of claims.training_free_comparator, one finding per cache); within a family each side's p-values
(reproduced, contradicted) are Holm-adjusted before the level is applied, m the family's declared
size, whatever a precondition or the power rule removed (those count as p = 1).

*Preconditions*, each naming the findings it gates; a failed one makes them *not testable*:
every training run of a compared model above its quality line (validation NELBO less than 1 nat
below the unigram entropy; the AR model below every diffusion model's); a judge weaker than what it
judges (the trained evaluator's validation NLL not below every scored model's); the judge tested on
itself (MAUVE of data vs data and vs word-shuffled data; the shuffled-text Gen PPL ratio; its
corruption ladder of held-out text ranked in order, neighbours apart by more than the Gen PPL
margin, spanning every row a Gen PPL finding judges; its order of Table 2's cells against the AR
model's, Spearman at least claims.judge_ar_rank_min); and a measured training variance for every
finding that compares separately trained models (at least two training runs of each compared
model drawn at the finding's budget). A finding is *not run at this profile* when an input was not
produced.

Uncertainty
-----------
Every +- is computed on the difference itself and names what it covers:

- Table 2 differences between separately trained models (MAUVE, log Gen PPL ratio): the effect is
  the mean over training runs (seed, seed + 1, ...: the tables' run and its replicates,
  `tadm.experiments.replicates`) of the per-seed paired differences (one reference set and one
  sampling seed serve both rows of a seed: `paired_mauve_diff`, `paired_log_ppl_ratio`); its
  variance is the pooled between-run variance (`tadm.metrics.replicates.pooled_between`: the
  per-run values of every replicated row at that budget, pooled across rows, on sum(n - 1)
  degrees of freedom, each run's own sample variance subtracted) times 2 / n, plus the paired
  bootstraps' within-run variance of the mean difference;
- one trained model on both sides (the refresh sweep): the paired bootstrap over samples;
- throughput ratios: across timing blocks, each its own process at another point of the pipeline
  with its own batch seed and step window (Table 2: sample.throughput_blocks; Table 1: its scored
  pass and timing.table1_blocks - 1 timing-only blocks), exp(mean of the blocks' log ratios) with
  se = sqrt(max(between-block, within-block variance) / B) on B - 1 degrees of freedom (inside a block: the median of paired
  per-round or per-batch ratios; `tadm.metrics.invocations`);
- accuracy differences (Table 1's own estimator, `tadm.experiments.table1_stats.accuracy_delta`): the
  per-example difference of means over fusion runs and sampling seeds, bootstrapped over examples,
  plus the pooled between-run variance of the trained fusions' run-level accuracies for each
  trained side (each run's sampling variance subtracted only where the runs decoded with sampling
  seeds of their own; runs sharing their seeds keep their whole spread), with the run-level
  comparison alone (Welch where both sides have runs) in the notes as a sensitivity line; pooled over every task of posttrain.tasks
  (their examples together), with each task's figure in the notes;
- staleness: bootstraps over the trajectories' sequences, not their (autocorrelated) steps.

Every finding also shows its minimum detectable effect at this run's n, (crit + z_power) se
(crit: z's or the equivalence level's quantile at the se's df), and the n that would detect the
paper's effect: samples while the training term allows it, else training runs per arm.

Budgets are matched by their relation to the sequence length: the paper's T = 1024 = L is this
profile's T = L, its T = 2048 = 2L is T = 2L (sample.canvas_length); a claim whose budget is not
among sample.budgets is not run at this profile.

The package
-----------
``claim``          the records: `Entry` (a claim as declared) and `Claim` (as measured and decided)
``rules``          the verdict rules, Holm's adjustment, the minimum detectable effect
``inputs``         what the claims read (`read_inputs`, `Inputs`)
``evidence``       the evaluator registry (`EVIDENCE`) and `measure`; the evaluators in
                   ``evidence_pretrain`` (Table 2, the sweep, staleness) and ``evidence_posttrain`` (Table 1)
``catalog``        the paper's claims, one `Entry` each (`CATALOG`), and `evaluate`
``preconditions``  what the verdicts rest on
``report``         claims.{md,csv}, claims_summary.md, claims_inputs.json (`write`); the first three
                   again from the last alone (`write_from`, ``python -m tadm claims --from``)

Adding a claim
--------------
A claim is one entry of `catalog.CATALOG`; its evidence is an evaluator of `evidence.EVIDENCE`,
named. A Table 2 comparison in the direction rule, for instance::

    Entry("genppl_tadm_below_remdm", "TADM‡ Gen PPL below ReMDM's at T = 2048", "21.70 vs 22.8",
          "table2_quality", metric="log_ppl", rows=("tadm", "remdm"), budget=2, sign=-1,
          paper_value=math.log(22.8 / 21.70), test="log(PPL ReMDM / PPL TADM‡) > 0",
          source="samples/{{tadm,remdm}} (T{T})", n_unit="samples per run", family="pretraining")

is measured over the training runs of both rows, gated by the preconditions (the models' quality
lines, the judge, the training variance) and decided with the others of its family, like the
paper's own.

A new shape of evidence is one more function in `evidence`, registered by ``@evaluator`` under its
own name, that fills the `Claim` it is handed from the `Inputs`.
"""

from tadm.experiments.claims.catalog import CATALOG, claims, evaluate
from tadm.experiments.claims.claim import (CHECK, CONTRADICTED, DIRECTION, EQUIVALENCE, FAIL, FINDING_VERDICTS,
                                           INCONCLUSIVE, NON_INFERIORITY, NOT_RUN, NOT_TESTABLE, PASS, REPRODUCED,
                                           UNDERPOWERED, Claim, Entry)
from tadm.experiments.claims.evidence import EVIDENCE, evaluator
from tadm.experiments.claims.inputs import Inputs, RecordedInputs, read_inputs
from tadm.experiments.claims.preconditions import apply_preconditions, preconditions
from tadm.experiments.claims.report import (CAPTION, COLUMNS, INPUTS_FILE, rows, summary_markdown, tally, to_markdown,
                                            write, write_from)
from tadm.experiments.claims.rules import (Rules, decide, direction, equivalence, exact, families, holm, mde,
                                           n_for_paper, non_inferiority, p_values, paper_position, target, underpowered)

__all__ = ["Claim", "Entry", "CATALOG", "EVIDENCE", "evaluator", "Rules", "Inputs", "RecordedInputs", "claims",
           "evaluate", "decide", "target", "underpowered", "write_from", "INPUTS_FILE", "UNDERPOWERED",
           "direction", "equivalence", "non_inferiority", "holm", "families", "p_values", "exact", "mde", "n_for_paper",
           "paper_position", "preconditions", "apply_preconditions", "read_inputs", "rows", "tally", "to_markdown",
           "summary_markdown", "write", "CAPTION", "COLUMNS", "REPRODUCED", "CONTRADICTED", "INCONCLUSIVE",
           "NOT_TESTABLE", "NOT_RUN", "FINDING_VERDICTS", "PASS", "FAIL", "CHECK", "DIRECTION", "EQUIVALENCE",
           "NON_INFERIORITY"]
