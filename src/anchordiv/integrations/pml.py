"""pytorch-metric-learning adapter: anchordiv's exact search as an ``AccuracyCalculator`` knn.

    >>> from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
    >>> calc = AccuracyCalculator(knn_func=ad.integrations.pml.knn_func(model))  # doctest: +SKIP
    >>> calc.get_accuracy(query, query_labels)                                   # doctest: +SKIP

pytorch-metric-learning (Musgrave, Belongie, Lim 2020) calls its ``knn_func`` as
``knn_func(query, k, reference, ref_includes_query)`` and expects ``(distances,
indices)``, each ``(len(query), k)``, nearest first (see its ``CustomKNN`` and
``FaissKNN``, ``pytorch_metric_learning/utils/inference.py``).  When
``ref_includes_query`` is true, the first ``len(query)`` rows of ``reference``
*are* the queries (``AccuracyCalculator.get_accuracy`` checks this), and its
own knn searches ``k + 1`` neighbours and removes the query's own index ``i``
(or, when ``i`` is not among them, the last neighbour).  That is the top
``k`` of the reference without item ``i``, which is what
``model.search(query, reference, k, exclude=i)`` returns exactly; duplicates
of a query at distance 0 are kept, as in pml.

This module does not import pytorch-metric-learning.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["KNN", "knn_func"]


class KNN:
    """Exact k-nearest neighbours of an anchordiv geometry, with pml's knn signature.

    Parameters
    ----------
    model : Geometry
        A fitted anchor model (``ad.Softmax(...).fit(anchors)``, ...) or a
        baseline such as ``ad.Cosine()``.
    symmetric : bool, default True
        Rank by :math:`\\tfrac12[d(q\\|g) + d(g\\|q)]` (as ``model.search``).
    memory_budget : int, optional
        Passed to ``model.search``.

    Notes
    -----
    The returned distances are the model's divergences, ascending (lower is
    closer), like ``FaissKNN``'s squared L2 distances; pml's built-in
    accuracies use only the indices.
    """

    def __init__(self, model: Any, *, symmetric: bool = True, memory_budget: int | None = None) -> None:
        if not callable(getattr(model, "search", None)):
            raise TypeError(
                f"knn_func needs an anchordiv geometry with .search(Q, G, k, exclude=...); "
                f"got {type(model).__name__}"
            )
        self.model = model
        self.symmetric = bool(symmetric)
        self.memory_budget = memory_budget

    def __call__(self, query: Any, k: int, reference: Any = None,
                 ref_includes_query: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """``(distances, indices)`` of the ``k`` nearest reference rows of each query.

        Parameters
        ----------
        query : torch.Tensor or array_like, shape (n, d)
        k : int
            Neighbours per query.
        reference : torch.Tensor or array_like, shape (m, d), optional
            Default: ``query`` (with ``ref_includes_query`` then implied).
        ref_includes_query : bool, default False
            ``reference[:n]`` are the queries: query ``i`` never returns
            reference row ``i``.

        Returns
        -------
        distances : torch.Tensor, float, shape (n, k)
            Ascending.
        indices : torch.Tensor, int64, shape (n, k)
            Rows of ``reference``; ties broken by the lower index.
        """
        q = torch.as_tensor(query)
        if reference is None:
            reference, ref_includes_query = q, True
        g = torch.as_tensor(reference)
        out_device = q.device
        model_device = getattr(self.model, "device", None)
        if model_device is not None:
            q, g = q.to(model_device), g.to(model_device)
        exclude = None
        if ref_includes_query:
            if g.shape[0] < q.shape[0]:
                raise ValueError(
                    f"ref_includes_query=True needs the {q.shape[0]} queries to be the first rows "
                    f"of reference, which has only {g.shape[0]} rows"
                )
            exclude = torch.arange(q.shape[0], device=q.device)
        d, i = self.model.search(q, g, int(k), symmetric=self.symmetric, exclude=exclude,
                                 memory_budget=self.memory_budget, progress=False)
        return d.to(out_device), i.to(out_device, torch.int64)

    def __repr__(self) -> str:
        return f"KNN(model={self.model!r}, symmetric={self.symmetric})"


def knn_func(model: Any, *, symmetric: bool = True, memory_budget: int | None = None) -> KNN:
    """A pytorch-metric-learning ``knn_func`` backed by ``model.search`` (exact).

    Parameters
    ----------
    model : Geometry
        Fitted anchordiv geometry (anchor model or baseline).
    symmetric : bool, default True
        Rank by the symmetrised divergence.
    memory_budget : int, optional
        Passed to ``model.search``.

    Returns
    -------
    KNN
        Callable as ``knn(query, k, reference, ref_includes_query)``, for
        ``AccuracyCalculator(knn_func=...)``.

    Examples
    --------
    >>> from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
    >>> model = ad.Softmax(tau=0.05).fit(anchors)                       # doctest: +SKIP
    >>> calc = AccuracyCalculator(knn_func=knn_func(model), k="max_bin_count")  # doctest: +SKIP
    >>> calc.get_accuracy(X, labels)["mean_average_precision_at_r"]     # doctest: +SKIP
    """
    return KNN(model, symmetric=symmetric, memory_budget=memory_budget)
