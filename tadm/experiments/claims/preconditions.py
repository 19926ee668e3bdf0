"""What the verdicts rest on: each precondition names the findings it gates (``gates``), and a
failed one makes them not testable (`apply_preconditions`)."""

from __future__ import annotations

import math

from tadm.experiments.claims.claim import NOT_RUN, NOT_TESTABLE, Claim
from tadm.experiments.claims.inputs import Inputs
from tadm.experiments.claims.rules import usable


def _model(run: str) -> str:
    """The trained model a run's metrics belong to: `tadm-s1` (a training replicate) -> `tadm`."""
    base, _, seed = run.rpartition("-s")
    return base if base and seed.isdigit() else run


def _compared(findings: list[Claim]) -> list[tuple[str, int]]:
    """(row, T) of every Table 2 row the `findings` compare, in the order they first name them."""
    cells = (((row, c.extra["compared"]["T"]) for row in c.extra["compared"]["rows"])
             for c in findings if "compared" in c.extra)
    return list(dict.fromkeys(cell for pair in cells for cell in pair))


def _genppl_cells(inp: Inputs, findings: list[Claim]) -> dict[str, float]:
    """Gen PPL of every cell a Gen PPL finding judges (with its training replicates), by name."""
    out = {}
    cells = _compared([c for c in findings if c.judged_by == "gen_ppl"])
    several = len({T for _, T in cells}) > 1
    for row, T in cells:
        for seed, ppl in inp.gen_ppl(row, T).items():
            out[f"{row} s{seed}" + (f" T{T}" if several else "")] = ppl
    for r in inp.sweep:
        for T, m in r["budgets"].items():
            if usable(m.get("gen_ppl")):
                out[f"sweep {r['_name']}"] = m["gen_ppl"]
    return out


def _ladder_checks(ladder: list[dict], cells: dict[str, float], margin: float, gates: list[str]) -> list[dict]:
    """The judge's Gen PPL on its corruption ladder (held-out text, a growing share of its words
    replaced, then of the word salad's characters: tadm.metrics.trained_evaluator.LADDER,
    CHAR_LADDER): (a) it ranks the rungs in order, neighbours
    apart by more than log(1 + margin), the Gen PPL findings' own margin; (b) the rungs span the
    Gen PPL of every cell a Gen PPL finding judges, so the order it shows is the order it needs."""
    ppl = [r["gen_ppl"] for r in ladder]
    steps = [math.log(b / a) for a, b in zip(ppl, ppl[1:])]
    need = math.log(1 + margin)
    rungs = " < ".join(f"{x:.1f}" for x in ppl)
    words = "/".join(f"{r['fraction']:g}" for r in ladder if r.get("kind", "words") == "words")
    chars = "/".join(f"{r['fraction']:g}" for r in ladder if r.get("kind") == "chars")
    shares = f"words replaced {words}" + (f", then characters of the word salad {chars}" if chars else "")
    lo, hi = min(cells.values()), max(cells.values())
    return [{"check": "judge: ranks its corruption ladder in order (held-out text, a growing share of words replaced, "
                      "then of characters), neighbours apart by more than the Gen PPL margin",
             "value": min(steps) if steps else None, "passed": bool(steps) and min(steps) > need,
             "wanted": f"every step > log(1 + {margin:g}) = {need:.3f}",
             "shown": f"{rungs} ({shares}); smallest step {min(steps):.3f}" if steps else rungs,
             "gates": gates},
            {"check": "judge: its ladder spans every row a Gen PPL finding judges", "value": ppl[-1] if ppl else None,
             "passed": bool(ppl) and min(ppl) <= lo and max(ppl) >= hi,
             "wanted": f"from <= {lo:.1f} to >= {hi:.1f} (the {len(cells)} judged cells)",
             "shown": f"{min(ppl):.1f}-{max(ppl):.1f} (the rows: {lo:.1f}-{hi:.1f})", "gates": gates}]


def _judge_agrees_with_ar(inp: Inputs, gates: list[str]) -> dict | None:
    """The judge's Gen PPL and the AR model's perplexity order Table 2's cells (every diffusion row
    at every budget, the tables' run) alike: Spearman's rank correlation at least
    claims.judge_ar_rank_min. None when fewer than three cells have both."""
    from scipy.stats import spearmanr  # lazy: scipy.stats takes ~1 s to import; only this precondition needs it

    pairs = {}
    for row, r in sorted(inp.table2.items()):
        if row in ("ar", "data"):
            continue
        for T, cell in sorted(r["budgets"].items(), key=lambda kv: int(kv[0])):
            ar = inp.ar_ppl(row, int(T))
            if usable(cell.get("gen_ppl")) and ar is not None and usable(ar):
                pairs[f"{row} T{T}"] = (cell["gen_ppl"], ar)
    if len(pairs) < 3:
        return None
    rho = float(spearmanr([a for a, _ in pairs.values()], [b for _, b in pairs.values()]).statistic)
    line = inp.params.claims.judge_ar_rank_min
    return {"check": "judge: orders Table 2's cells as the AR model does (Spearman's rank correlation of Gen PPL and "
                     "the AR model's perplexity of the same samples)", "value": rho,
            "passed": usable(rho) and rho >= line, "wanted": f">= {line:g} (claims.judge_ar_rank_min)",
            "shown": f"{rho:.3f} over {len(pairs)} cells (AR perplexity {min(b for _, b in pairs.values()):.1f}-"
                     f"{max(b for _, b in pairs.values()):.1f})", "gates": gates}


def preconditions(inp: Inputs, cs: list[Claim] | None = None) -> list[dict]:
    """What the verdicts rest on, each with the ids of the findings it gates (``gates``): every
    compared model learnt (validation NELBO below the unigram entropy), the judge is stronger than
    every model it judges, tells text from non-text, scores word-shuffled text worse than every row
    a Gen PPL finding judges, and the training variance of every comparison of separately trained
    models is measured."""
    cs = cs or []
    findings = [c for c in cs if c.finding]

    def gated(test) -> list[str]:
        return [c.id for c in findings if test(c)]

    return _model_lines(inp, gated) + _judge_checks(inp, findings, gated) + _training_variance(inp, findings)


def _model_lines(inp: Inputs, gated) -> list[dict]:
    """Every trained model above its quality line: a diffusion model's validation NELBO at least
    1 nat below the unigram entropy, the AR model's NLL further below it than every diffusion
    model's; each gates the findings resting on that model."""
    out = []
    diffusion = [m["below_unigram"] for n, m in inp.train.items() if "below_unigram" in m and m.get("model_type") != "ar"]
    for name, m in inp.train.items():
        if "unigram_entropy" in m:
            ar = m.get("model_type") == "ar"
            wanted = (f"more than every diffusion model's ({max(diffusion):.2f})" if ar and diffusion
                      else ">= 1.00 nats below")
            passed = m["below_unigram"] > max(diffusion) if ar and diffusion else m["below_unigram"] >= 1.0
            out.append({"check": f"{name}: validation {'NLL' if ar else 'NELBO'} below the unigram entropy", "model": name,
                        "value": m["below_unigram"], "passed": passed, "wanted": wanted,
                        "shown": f"{m['val_nelbo']:.3f} vs {m['unigram_entropy']:.3f} nats/token: "
                                 f"{m['below_unigram']:.2f} below",
                        "gates": gated(lambda c, model=_model(name): model in c.rests_on)})
    return out


def _judge_checks(inp: Inputs, findings: list[Claim], gated) -> list[dict]:
    """The trained judge stronger than every model it scores, its sanity checks (MAUVE and Gen PPL
    on text and shuffled text), and the judge tested on itself: the corruption ladder and its
    agreement with the AR model (else the rows against word-shuffled text)."""
    out = []
    e = inp.evaluator
    judged = lambda metrics: gated(lambda c: c.judged_by in metrics)  # noqa: E731
    if e and inp.params.eval.evaluator == "trained":
        judge = e.get("val_nll")
        scored = {n: m["val_nelbo"] for n, m in inp.train.items() if "val_nelbo" in m}
        if scored:
            worst = min(scored, key=scored.get)
            out.append({"check": "judge: validation NLL below every model it scores (same tokens)",
                        "value": judge, "passed": usable(judge) and judge < scored[worst],
                        "wanted": f"< {scored[worst]:.3f} ({worst}, the strongest)",
                        "shown": f"{judge:.3f} nats/token" if usable(judge) else "not recorded (metrics/evaluator.json)",
                        "gates": judged(("mauve", "gen_ppl"))})
    if e:  # a hub judge (the paper's gpt2-large) is a record only: no sanity checks run on it
        sanity = e.get("sanity") or {}
        for k, v in sanity.items():
            if k in e.get("sanity_thresholds", {}):
                shown = f"{v:.3f}"
                if k == "shuffled_ppl_ratio_per_gpt2_token" and "shuffled_ppl_ratio" in sanity:
                    shown += (f" (per judge token: {sanity['shuffled_ppl_ratio']:.3f}, {sanity['judge_tokens']} judge "
                              f"tokens for {sanity['gpt2_tokens']} GPT-2 tokens)")
                out.append({"check": f"evaluator: {k}", "value": v, "shown": shown,
                            "wanted": e["sanity_thresholds"][k], "passed": e["sanity_passed"][k],
                            "gates": judged(("mauve",) if k.startswith("mauve") else ("gen_ppl",))})
        shuffled = sanity.get("gen_ppl_shuffled")
        cells = _genppl_cells(inp, findings)
        ladder = e.get("ladder")
        if ladder and cells:  # the judge tested on itself: a corruption ladder of held-out text
            out += _ladder_checks(ladder, cells, inp.params.claims.margin_gen_ppl_rel, judged(("gen_ppl",)))
            agree = _judge_agrees_with_ar(inp, judged(("gen_ppl",)))
            if agree is not None:
                out.append(agree)
        elif usable(shuffled) and cells:  # a record without the ladder: the rows against word salad
            top = max(cells, key=cells.get)
            out.append({"check": "judge: word-shuffled held-out text scores a higher Gen PPL than every row a Gen PPL "
                                 "finding judges", "value": shuffled, "passed": shuffled > cells[top],
                        "wanted": f"> {cells[top]:.1f} ({top}, the highest of {len(cells)} cells)",
                        "shown": f"{shuffled:.1f} (the rows: {min(cells.values()):.1f}-{cells[top]:.1f})",
                        "gates": judged(("gen_ppl",))})
    return out


def _training_variance(inp: Inputs, findings: list[Claim]) -> list[dict]:
    """Every comparison of separately trained models has its training variance measured: each
    compared model trained and drawn at least twice."""
    out = []
    separate = [c for c in findings if c.extra.get("separately_trained")]
    if separate:
        p = inp.params
        cells = sorted(_compared(separate), key=lambda cell: (cell[1] is None, cell[1] or 0, cell[0]))
        budgets = list(dict.fromkeys(T for _, T in cells))
        several = len(budgets) > 1
        counts = {f"{r}" + (f" (T = {T})" if several else ""): len(inp.seeds(r, T)) for r, T in cells}
        metrics = dict.fromkeys(c.extra["compared"]["metric"] for c in separate if "compared" in c.extra)
        pools = {(f"{m} (T = {T})" if several else m): inp.pool(m, T) for T in budgets for m in metrics} \
            if None not in budgets else {}
        ok = all(n >= 2 for n in counts.values()) and all(pools.values())
        shown = ", ".join(f"{r} {n}" for r, n in counts.items()) + " training runs" + (
            "" if several else f" at T = {budgets[0]}")
        if ok:
            shown += "; between-run sd " + ", ".join(f"{m} {v.sd_between:.3f} ({v.df} df)" for m, v in pools.items())
        out.append({"check": "training variance: every compared model trained and drawn at least twice "
                             f"(train.replicates = {p.train.replicates})", "value": min(counts.values()),
                    "passed": ok, "wanted": ">= 2 runs of each (seed, seed + 1, ...)", "shown": shown,
                    "gates": [c.id for c in separate]})
    return out


def apply_preconditions(cs: list[Claim], pre: list[dict]) -> None:
    """A finding gated by a failed precondition is not testable, the reason in its notes."""
    by_id = {c.id: c for c in cs}
    for r in pre:
        if r.get("passed"):
            continue
        for cid in r.get("gates", ()):
            c = by_id[cid]
            if c.verdict == NOT_RUN and not usable(c.value):
                continue
            c.verdict = NOT_TESTABLE
            c.notes = (c.notes + "; " if c.notes else "") + f"not testable: {r['check']}"
