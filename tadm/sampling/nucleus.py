"""The nucleus (top-p) draw of the sampling loop: one token per decoded row, the same bits for less work.

`draw_nucleus(probs, p, generator)` draws one token per row of `probs` (N, C) (rows of a
softmax: nonnegative, summing to about 1) from top-p(probs), by the inverse CDF, and returns
the token's probability under the filtered, renormalised distribution. The reference
computation, `draw_by_sort`, is what every device runs:

    ranked, order = probs.sort(descending=True)        # torch's sort, ties in its own order
    csum = ranked.cumsum(-1)
    kept = #{j : csum_j <= p}, at least 1;   mass = csum_{kept-1}
    x = min(u * mass, the float just below mass)        # u ~ U[0, 1), one per row, in probs' dtype
    idx = first j with csum_j > x;   token = order_idx;   prob = ranked_idx / mass

(p = 1: no sort, the inverse CDF on the unsorted cumulative mass.) On a GPU the sort is cheap;
on a CPU it is not: x86-simd-sort's key-value sort of every decoded row over the whole
vocabulary (50,258 float64 values at the paper's size) cost more than the softmax and the head
of those rows together, at every step whatever the network's share. On a CPU tensor
`draw_nucleus` therefore makes the same draw from less (the host path, `draw_on_host`):

1. What the draw reads. kept, mass, idx and prob depend only on the *values* in descending
   order (the same sequence whatever sort produced it, ties included), and only on the first
   kept + 1 of them. The token depends on the sort's order only through order_idx: when the
   value ranked_idx occurs once in the row, order_idx is the one position that holds it,
   whatever sort made the order; only a tied value needs torch's own tie order.
2. Prefix sums. torch's CPU cumsum adds left to right in a float64 accumulator (float32 rows
   too), so the cumsum of the first k ranked values is, bit for bit, the first k entries of the
   full cumsum (tested). csum never decreases (nonnegative terms, monotone rounding), so once
   csum_{k-1} > p the entries after k - 1 change neither kept (<= k - 1) nor idx (< kept).
3. Candidates. The top k values of a row (`topk`, sorted) are ranked_0..ranked_{k-1} exactly.
   Where their cumsum passes p, the draw is decided by them: kept, mass, idx and prob as in the
   reference, and the token is topk's index at idx unless ranked_idx equals a neighbour
   ranked_{idx-1} or ranked_{idx+1} (both among the candidates: idx + 1 <= kept < k), i.e. is
   tied. k = 256 first; rows it does not decide try k = 4096 where that is likely to decide
   them (NUCLEUS_CANDIDATES, `draw_on_host`). A trained model's nucleus is small (the default
   profile's: at most 128 tokens at p = 0.9), so nearly every row costs one pass over it.
4. Flat rows (the top 4096 hold at most p, or are unlikely to: e.g. a randomly initialised
   model's, whose nucleus at p = 0.9 is 45,000 of the 50,258 tokens) take all their values
   sorted by numpy's values-only sort (no index array: about half of torch's key-value sort),
   split over the threads torch uses; the draw as in 3, the token the one position holding
   ranked_idx.
5. Whatever is left -- a tied drawn value, a NaN -- is drawn by the reference on those rows
   alone. torch's sort treats each row on its own (tested: a row's order does not depend on
   the other rows of the batch nor on where the row lies in memory), and u is the row's own.

Every row therefore gets exactly the reference's token and probability (tests compare the two
on random logits with ties, flat and peaked rows, p = 1, tiny p, all-equal rows, float32 and
float64), and the generator is used exactly as by the reference (one U[0, 1) per row, once).
At the paper's size (64 rows of 50,258 float64 values, 2 threads, the same machine) the
reference took 143 ms, the host path 27 ms on peaked rows (nucleus about 300 tokens) and
103 ms on a random model's flat rows.

Host reads: the host path picks its rows by reading values (`nonzero`, numpy): free on a CPU,
where there is no device to wait for. On any other device `draw_nucleus` is the reference,
which reads nothing (the sampling loop's host reads are its plan's, `tadm.sampling.loop`).
`HOST_DRAW = False` runs the reference on the CPU too (what the host-read tests count).
"""

from __future__ import annotations

import threading

import numpy as np
import torch
from torch import Tensor

from tadm import runtime

NUCLEUS_CANDIDATES = (256, 4096)  # the top-k sizes a row's nucleus is looked for in, in turn
HOST_DRAW = True  # draw_nucleus on a CPU tensor takes the host path (False: the reference)
HOST_MIN_CLASSES = 1024  # below this many classes torch's sort of a row costs less than the host path's overhead
LIKELY = 8  # a larger top-k k' is tried where a lower bound on the nucleus is <= k' / LIKELY (draw_on_host)
MIN_ROWS_PER_THREAD = 4  # numpy's sort of flat rows is split over threads in chunks of at least this


def draw_nucleus(probs: Tensor, p: float, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """One draw per row from top-p(probs) (N, C), and the drawn token's probability under the
    filtered, renormalised distribution; in probs' dtype.

    Exactly the distribution of `sample_categorical(nucleus_filter(probs, p))`, drawn by the
    inverse CDF on the (sorted, for p < 1) cumulative mass: one uniform per row, no second pass
    over the vocabulary. The kept set is a prefix of the descending order (ReMDM's rule). On a
    CPU tensor by the host path (module docstring), on any other device by `draw_by_sort`: the
    same tokens and probabilities either way, bit for bit."""
    u = torch.rand(probs.shape[:-1], generator=generator, device=probs.device, dtype=probs.dtype)
    if p >= 1.0:
        return _draw_unfiltered(probs, u)
    if HOST_DRAW and probs.device.type == runtime.CPU.type and probs.dim() == 2 and probs.shape[-1] >= HOST_MIN_CLASSES:
        return draw_on_host(probs, p, u)
    return draw_by_sort(probs, p, u)


def _inverse_cdf(csum: Tensor, mass: Tensor, u: Tensor) -> Tensor:
    """idx (N, 1): the first j with csum_j > x, x = u * mass kept strictly below mass."""
    x = torch.minimum(u * mass, torch.nextafter(mass, torch.zeros_like(mass)))
    return torch.searchsorted(csum, x.unsqueeze(-1), right=True)


def _draw_unfiltered(probs: Tensor, u: Tensor) -> tuple[Tensor, Tensor]:
    """p = 1: the inverse CDF on the unsorted cumulative mass (no sort)."""
    csum = probs.cumsum(-1)
    mass = csum[:, -1]
    idx = _inverse_cdf(csum, mass, u)
    return idx.squeeze(-1), probs.gather(-1, idx).squeeze(-1) / mass


def draw_by_sort(probs: Tensor, p: float, u: Tensor) -> tuple[Tensor, Tensor]:
    """The reference draw (module docstring) with the rows' uniforms u (N,): torch's sort of
    every row, cumsum, the kept prefix and the inverse CDF on it."""
    ranked, order = probs.sort(dim=-1, descending=True)
    csum = ranked.cumsum(-1)
    kept = (csum <= p).sum(-1).clamp_min(1)  # always keep the most likely token
    mass = csum.gather(-1, (kept - 1).unsqueeze(-1)).squeeze(-1)
    idx = _inverse_cdf(csum, mass, u)
    return order.gather(-1, idx).squeeze(-1), ranked.gather(-1, idx).squeeze(-1) / mass


def prefix_draw(ranked: Tensor, p: float, u: Tensor, complete: bool
                ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The reference's draw from the first k values of each row in descending order, ranked
    (N, k) (all of them when `complete`): (covered, exact, idx, value, prob, total), each (N,).
    `covered`: the k values decide the draw (their cumsum passes p, or they are all); there
    idx and prob = value / mass are the reference's, and where also `exact` the drawn value
    value = ranked_idx occurs once in its row, so the position holding it is the reference's
    token (not `exact`: a tied value, or a NaN). total: the cumulative mass of the k values.

    kept = #{j : csum_j <= p} is found by bisection: csum never decreases, and p is compared
    in csum's dtype as the reference's `csum <= p` compares it (a row with a NaN has a NaN mass
    and is not `exact` whatever kept is)."""
    k = ranked.shape[-1]
    csum = ranked.cumsum(-1)
    kept = torch.searchsorted(csum, csum.new_full((len(csum), 1), p), right=True).squeeze(-1).clamp_min(1)
    mass = csum.gather(-1, (kept - 1).unsqueeze(-1)).squeeze(-1)
    idx = _inverse_cdf(csum, mass, u).clamp_max(k - 1)  # the clamp only touches rows not covered
    value = ranked.gather(-1, idx).squeeze(-1)
    before = ranked.gather(-1, (idx - 1).clamp_min(0)).squeeze(-1)
    after = ranked.gather(-1, (idx + 1).clamp_max(k - 1)).squeeze(-1)
    idx = idx.squeeze(-1)
    tied = ((idx > 0) & (before == value)) | ((idx < k - 1) & (after == value))
    covered = torch.ones_like(tied) if complete else csum[:, -1] > p
    return covered, ~tied & (mass > 0), idx, value, value / mass, csum[:, -1]  # mass > 0: False for a NaN


def sorted_values(rows: Tensor) -> Tensor:
    """The values of each row of `rows` (m, C), a CPU tensor, in descending order (no indices):
    numpy's sort, split over torch's threads (numpy releases the GIL while it sorts)."""
    a = rows.contiguous().numpy()
    out = np.empty_like(a)
    chunks = max(1, min(torch.get_num_threads(), len(a) // MIN_ROWS_PER_THREAD))
    bounds = np.linspace(0, len(a), chunks + 1).astype(int)

    def work(lo: int, hi: int) -> None:
        out[lo:hi] = np.sort(a[lo:hi], axis=-1)

    threads = [threading.Thread(target=work, args=(lo, hi)) for lo, hi in zip(bounds[1:-1], bounds[2:])]
    for t in threads:
        t.start()
    work(bounds[0], bounds[1])
    for t in threads:
        t.join()
    return torch.from_numpy(np.ascontiguousarray(out[:, ::-1]))


def draw_on_host(probs: Tensor, p: float, u: Tensor) -> tuple[Tensor, Tensor]:
    """`draw_by_sort(probs, p, u)` for a CPU tensor probs (N, C) (module docstring, 1-5): each
    row from its top k values for k in NUCLEUS_CANDIDATES, the first k that decides it, else
    from all its values sorted without indices; a row whose drawn value is tied, or that holds
    a NaN, by the reference. A larger k is tried only on rows it is likely to decide: the top
    k values with mass M and smallest value v leave at least (p - M) / v more to reach p, so
    the nucleus holds at least k + (p - M) / v tokens; a row goes on to k' only where that
    lower bound is at most k' / LIKELY (the bound is a few times below the nucleus of
    Gaussian-like logits), else to the full sort. Which path a row takes changes only the
    time, never the draw."""
    n, c = probs.shape
    if not n:
        return torch.empty(0, dtype=torch.long), probs.new_empty(0)
    tokens = torch.empty(n, dtype=torch.long)
    prob = torch.empty(n, dtype=probs.dtype)
    pending = torch.arange(n)  # rows not drawn yet, for the next k
    full, reference = [], []  # rows for the full sort, rows for draw_by_sort
    least = None  # a lower bound on each pending row's nucleus size
    for k in sorted({k for k in NUCLEUS_CANDIDATES if k < c}):
        if least is not None:
            likely = least <= k / LIKELY
            full.append(pending[~likely])  # (host reads: free on a CPU)
            pending = pending[likely]
        if not len(pending):
            break
        values, positions = _rows(probs, pending).topk(k, dim=-1)
        covered, exact, idx, _, drawn_prob, mass = prefix_draw(values, p, _rows(u, pending), complete=False)
        drawn = positions.gather(-1, idx.unsqueeze(-1)).squeeze(-1)
        _settle(tokens, prob, reference, pending, covered & exact, covered & ~exact, drawn, drawn_prob)
        left = ~covered
        least = k + (p - mass[left]) / values[left, -1]
        pending = pending[left]
    pending = torch.cat(full + [pending]).sort().values
    if len(pending):  # every value, sorted without indices
        rows = _rows(probs, pending)
        _, exact, _, value, drawn_prob, _ = prefix_draw(sorted_values(rows), p, _rows(u, pending), complete=True)
        drawn = (rows == value.unsqueeze(-1)).view(torch.uint8).argmax(-1)  # the one position holding it
        _settle(tokens, prob, reference, pending, exact, ~exact, drawn, drawn_prob)
    reference = torch.cat(reference)
    if len(reference):
        tokens[reference], prob[reference] = draw_by_sort(probs[reference], p, u[reference])
    return tokens, prob


def _rows(x: Tensor, rows: Tensor) -> Tensor:
    """x's rows `rows` (ascending indices): x itself when they are all of them (no copy). (An
    index gather in one op: CPU `index_select` copies row by row, one parallel region each.)"""
    return x if len(rows) == len(x) else x[rows]


def _settle(tokens: Tensor, prob: Tensor, reference: list[Tensor], rows: Tensor, done: Tensor, tied: Tensor,
            drawn: Tensor, drawn_prob: Tensor) -> None:
    """Write the draws of `rows` (indices into the batch) where `done`; queue those `tied` for
    the reference."""
    tokens[rows[done]] = drawn[done]
    prob[rows[done]] = drawn_prob[done]
    reference.append(rows[tied])


__all__ = ["draw_nucleus", "draw_by_sort", "draw_on_host", "prefix_draw", "sorted_values", "NUCLEUS_CANDIDATES",
           "HOST_DRAW"]
