"""Experiment protocols that rerun the claims of Kannan, Park, Veitch (2026) on your embeddings.

=============  ===================  ======================================================
protocol       paper                claim
=============  ===================  ======================================================
coordinate     §5.2, Fig. 3         anchor distributions select the semantic coordinate
budget         §5.3, Figs. 4, 6     parametric models win with few anchors, softmax with many
adaptation     §5.4, Fig. 5         posterior models adapt broad anchors with few target ones
components     App. F.3, Fig. 7     mixture complexity matters differently per anchor set
table          Tables 2, 3          label-specific anchors beat cosine and ITI
runtime        App. F.4, Table 4    softmax time grows with N, Gaussian time stays flat
=============  ===================  ======================================================

Every protocol takes ``metric=`` (a :func:`anchordiv.metrics.get_metric` name; AUPRC by
default); :func:`sweep_tau` runs one over a list of temperatures (``table`` takes the list
itself). A multi-label factor (``EvalData.create(..., multilabel=["findings"])``) gives
``table`` one per-label row per anchor set matched to a label.

Python::

    import anchordiv as ad
    from anchordiv import experiments as ex

    data = ex.EvalData.create(X, {"breed": breeds, "place": places}, tau=0.05)
    res = ex.coordinate(data, ad.AnchorSet(E_breeds), ad.AnchorSet(E_places), "breed", "place",
                        models=["softmax", "gaussian"], out_dir="results/coordinate", seed=0)
    res.summary            # a pandas DataFrame: model, p, factor, role, auprc, ci_low, ci_high, ...
    res.observations       # one row per query, condition and draw: ..., draw, query, ap

Modules: :mod:`~anchordiv.experiments.core` (data, geometries, per-query scores),
:mod:`~anchordiv.experiments.protocols` (the six protocols),
:mod:`~anchordiv.experiments.report` (tidy frames → summaries, effects, files),
:mod:`~anchordiv.experiments.timing` (the runtime worker),
:mod:`~anchordiv.experiments.cli` (``anchordiv eval PROTOCOL``, also
``python -m anchordiv.experiments PROTOCOL ...``). The protocols and the report need
pandas; the core does not.
"""

from .core import ANCHOR_MODELS, BASELINES, PARAMETRIC, POSTERIOR_MODELS, EvalData, build_geometry, score

_LAZY = {"ProtocolResult": "report", "summarize": "report", "PROTOCOLS": "protocols", "run_protocol": "protocols",
         "coordinate": "protocols", "budget": "protocols", "adaptation": "protocols", "components": "protocols",
         "table": "protocols", "runtime": "protocols", "sweep_tau": "protocols", "table_setting": "protocols"}

__all__ = [
    "EvalData", "ProtocolResult", "PROTOCOLS", "run_protocol", "coordinate", "budget", "adaptation",
    "components", "table", "runtime", "sweep_tau", "table_setting", "score", "summarize", "build_geometry", "ANCHOR_MODELS", "BASELINES",
    "PARAMETRIC", "POSTERIOR_MODELS",
]


def __getattr__(name: str):
    """The protocols and the report on first use (they import pandas)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
