"""Benchmark 2: softmax anchor divergence computed the naive ways, side by side.

(a) direct: P(·|q) and P(·|g) as N-vectors, then the symmetrised KL
    ½ Σ_i (P_q,i − P_g,i)(log P_q,i − log P_g,i) for every pair, batched (as TIP-X does):
    O(Q·G·N) elementwise work.
(b) cached statistics (paper App. F.4): cache η = λ/τ and μ = ∇κ(η) = P(·|λ)ᵀΓ per vector,
    then d_sym = ½ (η_q − η_g)ᵀ(μ_q − μ_g) per pair by broadcasting, in batches: O(Q·G·d).
(c) ours: ``Softmax.fit(anchors).search(Q, G, k=10)``.

(a) and (b) run their pair loops on a subset of the queries (all gallery items) and are
extrapolated linearly to all queries; their per-vector statistics are computed in full.
"""

from __future__ import annotations

import sys
import time

import torch

import benchlib as bl

FULL = {"Q": 1000, "G": 20000, "Ns": [2 ** 12, 2 ** 14], "direct_queries": 8, "cached_queries": 50, "repeats": 3}
QUICK = {"Q": 100, "G": 2000, "Ns": [2 ** 10, 2 ** 12], "direct_queries": 4, "cached_queries": 20, "repeats": 2}
#: Elements per (query block × gallery block × width) temporary.
BLOCK_ELEMENTS = 2 ** 24
K = 10


def log_probs(X: torch.Tensor, anchors: torch.Tensor, tau: float, chunk: int = 4096) -> torch.Tensor:
    """log P(i | x) = log softmax_i(xᵀγ_i/τ), an (n, N) matrix, in row chunks."""
    return torch.cat([torch.log_softmax(X[s:s + chunk] @ anchors.T / tau, dim=1) for s in range(0, X.shape[0], chunk)])


def pair_topk(n_q: int, n_g: int, width: int, dist_block, k: int = K):
    """Top-k smallest of ``dist_block(q0, q1, g0, g1)`` over the gallery, blocks of ≈ BLOCK_ELEMENTS."""
    bq = max(1, min(n_q, BLOCK_ELEMENTS // (n_g * width)))
    bg = max(1, min(n_g, BLOCK_ELEMENTS // (bq * width)))
    out_d, out_i = [], []
    for q0 in range(0, n_q, bq):
        q1 = min(n_q, q0 + bq)
        D = torch.cat([dist_block(q0, q1, g0, min(n_g, g0 + bg)) for g0 in range(0, n_g, bg)], dim=1)
        d, i = torch.topk(D, k, dim=1, largest=False, sorted=True)
        out_d.append(d)
        out_i.append(i)
    return torch.cat(out_d), torch.cat(out_i)


def direct_stats(Q, G, anchors, tau):
    lq, lg = log_probs(Q, anchors, tau), log_probs(G, anchors, tau)
    return lq.exp(), lq, lg.exp(), lg


def direct_pairs(stats, n_q: int):
    """(a) symmetrised KL between the softmax vectors of every (query, gallery) pair."""
    pq, lq, pg, lg = stats

    def block(q0, q1, g0, g1):
        dp = pq[q0:q1, None, :] - pg[None, g0:g1, :]
        dl = lq[q0:q1, None, :] - lg[None, g0:g1, :]
        return 0.5 * (dp * dl).sum(-1)

    return pair_topk(n_q, pg.shape[0], pg.shape[1], block)


def cached_stats(Q, G, anchors, tau):
    """(b) cache η = λ/τ and μ(λ) = ∇κ(η) = P(·|λ)ᵀΓ for every vector."""
    def stats(X):
        return X / tau, log_probs(X, anchors, tau).exp() @ anchors

    return (*stats(Q), *stats(G))


def cached_pairs(stats, n_q: int):
    """(b) d_sym = ½ (η_q − η_g)ᵀ(μ_q − μ_g) for every pair by broadcasting (eq. F.1)."""
    eq, mq, eg, mg = stats

    def block(q0, q1, g0, g1):
        return 0.5 * ((eq[q0:q1, None, :] - eg[None, g0:g1, :]) * (mq[q0:q1, None, :] - mg[None, g0:g1, :])).sum(-1)

    return pair_topk(n_q, eg.shape[0], eg.shape[1], block)


def check_same_topk(anchors, Q, G, n_q: int = 16, n_g: int = 2000) -> int:
    """Assert (a), (b) and (c) give the same top-10 on a float64 subset; returns the rows checked."""
    import anchordiv as ad

    A, q, g = anchors.double(), Q[:n_q].double(), G[:n_g].double()
    _, ia = direct_pairs(direct_stats(q, g, A, bl.TAU), n_q)
    _, ib = cached_pairs(cached_stats(q, g, A, bl.TAU), n_q)
    _, ic = ad.Softmax(tau=bl.TAU).fit(A).search(q, g, k=K, progress=False)
    assert torch.equal(ia, ib), "direct KL and cached statistics disagree on the top-10"
    assert torch.equal(ia, ic), "direct KL and model.search disagree on the top-10"
    return n_q


def naive_time(stats_fn, pairs_fn, anchors, Q, G, n_sub: int) -> dict:
    """Statistics for all of Q and G; pairs for the first ``n_sub`` queries, extrapolated to all of Q."""
    t0 = time.perf_counter()
    stats = stats_fn(Q, G, anchors, bl.TAU)
    stats_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    pairs_fn(stats, n_sub)
    t_pairs = time.perf_counter() - t0
    return {"seconds": stats_s + t_pairs * Q.shape[0] / n_sub, "stats_s": stats_s, "pairs_subset_s": t_pairs,
            "subset_queries": n_sub}


def run(quick: bool = False, log=print) -> dict:
    import anchordiv as ad

    cfg = QUICK if quick else FULL
    rows, data, targets = [], {}, []
    for n in cfg["Ns"]:
        anchors, Q, G = bl.make_data(n, cfg["Q"], cfg["G"])
        checked = check_same_topk(anchors, Q, G)
        scale = cfg["Ns"][0] / n
        direct = naive_time(direct_stats, direct_pairs, anchors, Q, G, max(1, int(cfg["direct_queries"] * scale)))
        cached = naive_time(cached_stats, cached_pairs, anchors, Q, G, cfg["cached_queries"])
        model = ad.Softmax(tau=bl.TAU)
        ours = bl.measure(lambda: model.fit(anchors).search(Q, G, k=K, progress=False), repeats=cfg["repeats"])
        data[n] = {"direct": direct, "cached": cached, "ours_s": ours["seconds"], "ours_samples": ours["samples"],
                   "checked_rows": checked}
        rows.append([bl.pow2(n), bl.fmt_s(direct["seconds"]), bl.fmt_s(cached["seconds"]), bl.fmt_s(ours["seconds"]),
                     f"{direct['seconds'] / ours['seconds']:.0f}×", f"{cached['seconds'] / ours['seconds']:.1f}×"])
        log(f"  naive N={bl.pow2(n)}: direct {bl.fmt_s(direct['seconds'])}, cached {bl.fmt_s(cached['seconds'])}, "
            f"ours {bl.fmt_s(ours['seconds'])}")
        del anchors, Q, G
    detail = [[bl.pow2(n), f"{d['direct']['subset_queries']}", bl.fmt_s(d['direct']['pairs_subset_s']),
               bl.fmt_s(d['direct']['stats_s']), f"{d['cached']['subset_queries']}", bl.fmt_s(d['cached']['pairs_subset_s']),
               bl.fmt_s(d['cached']['stats_s'])] for n, d in data.items()]
    md = f"""
Softmax anchor divergence (symmetrised, τ = {bl.TAU}), |Q| = {cfg['Q']:,}, |G| = {cfg['G']:,}, d = {bl.DIM}, top-{K}, float32 CPU.

- (a) **direct KL** (as TIP-X): P(·|q), P(·|g) as N-vectors, then ½ Σ_i (P_q,i − P_g,i)(log P_q,i − log P_g,i)
  for every pair, in batches of ≈ 2^24 elements: O(Q·G·N).
- (b) **cached statistics** (paper App. F.4): cache η = λ/τ and μ = ∇κ(η) per vector, then
  ½ (η_q − η_g)ᵀ(μ_q − μ_g) for every pair by broadcasting, in batches: O((Q+G)·N·d + Q·G·d).
- (c) **ours**: `Softmax(tau).fit(anchors).search(Q, G, k=10)`, median of {cfg['repeats']} after a warm-up.

(a) and (b) compute their per-vector statistics for all of Q and G, and run their pair loop for a
subset of the queries against the full gallery; the pair time is **extrapolated linearly** to all
{cfg['Q']:,} queries (the pair loop is the same work for every query). Before timing, the three
methods are checked to return identical top-{K} indices on 16 queries × 2,000 gallery items in float64 (assert).

{bl.table(['N', '(a) direct KL', '(b) cached stats', '(c) ours', 'ours vs (a)', 'ours vs (b)'], rows)}

Measured parts of the naive methods:

{bl.table(['N', '(a) subset queries', '(a) subset pair time', '(a) statistics', '(b) subset queries', '(b) subset pair time', '(b) statistics'], detail)}
"""
    n_target = 2 ** 12
    if n_target in data:
        s = data[n_target]["direct"]["seconds"] / data[n_target]["ours_s"]
        targets.append(bl.target("≥ 10× faster than the direct KL at N = 2^12", s >= 10, f"{s:.0f}×",
                                 ("quick sizes; " if quick else "") + "direct time extrapolated from a query subset"))
    text = bl.write_result("naive", "Benchmark 2: the naive ways, side by side (softmax)", md,
                           {"config": cfg, "results": data}, targets)
    return {"markdown": text, "targets": targets}


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv)["markdown"])
