r"""Retrieval metrics: AP, recall/precision@k, R-precision, mAP@R, MRR, nDCG, bootstrap intervals.

Conventions
-----------
Every function here ranks by **distance**: the item with the *lowest* distance
comes first.  ``distances`` is either one query's row, shape ``(G,)``, or a
matrix of shape ``(Q, G)`` (``Q`` queries against ``G`` gallery / key items).
``relevant`` has the same shape and says which items count as hits; it is
boolean or holds only 0 and 1.

Inputs may be NumPy arrays, anything :func:`numpy.asarray` accepts, or torch
tensors (these are detached and copied to the CPU; torch itself is never
imported by this package).

Average precision
-----------------
For one query, let the distinct distance values, sorted increasingly, be the
thresholds :math:`t_1 < t_2 < \dots < t_N`.  With :math:`P` the number of
relevant items, define at threshold :math:`n`

.. math::

    \mathrm{TP}_n = \#\{g : d_g \le t_n,\ g \text{ relevant}\}, \qquad
    R_n = \frac{\mathrm{TP}_n}{P}, \qquad
    P_n = \frac{\mathrm{TP}_n}{\#\{g : d_g \le t_n\}},

and :math:`R_0 = 0`.  Then

.. math::

    \mathrm{AP} = \sum_{n=1}^{N} (R_n - R_{n-1})\, P_n .

Items with equal distance form one threshold: the precision of a block of tied
items is computed after the *whole* block, so the result does not depend on
how ties are ordered.  This is exactly the definition used by
``sklearn.metrics.average_precision_score(relevant, -distances)``.  An
equivalent form, used for computation, sums over the relevant items
:math:`g`: :math:`\mathrm{AP} = \frac{1}{P}\sum_{g \text{ relevant}}
P_{n(g)}`, where :math:`n(g)` is the threshold of :math:`g`'s tie block.

Mean average precision averages AP over queries that have at least one
relevant item; queries without one are skipped and counted.

Ranking metrics
---------------
:func:`recall_at_k`, :func:`precision_at_k`, :func:`r_precision`,
:func:`map_at_r`, :func:`reciprocal_rank` (its mean is MRR) and
:func:`ndcg_at_k` (binary or graded relevance) take the same inputs as
:func:`average_precision` (``exclude_self``, ``batch_size``) and return one
value per query, NaN for a query without a relevant item.  With
:math:`\mathrm{rel}_i` the relevance at rank :math:`i` and :math:`R` the number
of relevant items:

.. math::

    \mathrm{R@}k = \tfrac{1}{R}\textstyle\sum_{i\le k} \mathrm{rel}_i, \quad
    \mathrm{P@}k = \tfrac{1}{k}\textstyle\sum_{i\le k} \mathrm{rel}_i, \quad
    \mathrm{RP} = \mathrm{P@}R, \quad
    \mathrm{AP@}R = \tfrac{1}{R}\textstyle\sum_{i\le R} P(i)\,\mathrm{rel}_i, \quad
    \mathrm{RR} = 1 / \min\{i : \mathrm{rel}_i = 1\}.

:data:`METRICS` maps names (``"auprc"``, ``"recall@10"``, ``"ndcg@10"``, ...)
to these functions with one signature, ``f(distances, relevant, *,
exclude_self=False, batch_size=None)``; :func:`get_metric` builds any cutoff.
They agree with ``ranx`` (tests/test_metrics_ir.py).

Ties
----
Like AP, every ranking metric is independent of the order of tied items.  A
metric with a cutoff cannot take a tied block "as a whole" when the block
straddles the cutoff, so these metrics take the *expected value over the
uniformly random orders of each tied block* (McSherry & Najork 2008,
"Computing information retrieval performance measures efficiently in the
presence of tied scores", ECIR).  For recall, precision, R-precision and DCG,
which are linear in the :math:`\mathrm{rel}_i`, this replaces the relevance at
each position of a block by the block's mean relevance; mAP@R and RR use the
closed forms given in their docstrings.  Without ties every metric is the
usual one.  (AP keeps the threshold convention above, that of scikit-learn;
the two differ only for tied blocks that mix hits and misses.)

Runs
----
:func:`to_trec` writes a ranking as ``qid Q0 docid rank score tag`` lines and
:func:`to_run_dict` as ``{qid: {docid: score}}``, both with ``score =
-distance`` (higher is better), for ``trec_eval``, ``ranx``, ``pytrec_eval``
or ``ir_measures``; :func:`to_qrels_dict` writes the relevance.

Bootstrap intervals
-------------------
:func:`bootstrap_ci` and :func:`paired_difference` give a mean over queries
with a percentile bootstrap interval.  Values coming from repeated random
draws (for example several anchor sets) may be passed as a matrix
``(n_draws, Q)``; draws and queries are then both resampled.
"""

from __future__ import annotations

from .ap import MAPResult, average_precision, mean_average_precision
from .intervals import BootstrapCI, bootstrap_ci, paired_difference
from .ranking import (
    METRICS,
    get_metric,
    map_at_r,
    ndcg_at_k,
    precision_at_k,
    r_precision,
    recall_at_k,
    reciprocal_rank,
)
from .relevance import relevance_from_labels, relevance_from_multilabels
from .runs import to_qrels_dict, to_run_dict, to_trec

__all__ = [
    "MAPResult",
    "BootstrapCI",
    "METRICS",
    "average_precision",
    "mean_average_precision",
    "recall_at_k",
    "precision_at_k",
    "r_precision",
    "map_at_r",
    "reciprocal_rank",
    "ndcg_at_k",
    "get_metric",
    "to_trec",
    "to_run_dict",
    "to_qrels_dict",
    "relevance_from_labels",
    "relevance_from_multilabels",
    "bootstrap_ci",
    "paired_difference",
]
