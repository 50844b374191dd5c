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

Python::

    import anchordiv as ad
    from anchordiv import experiments as ex

    data = ex.EvalData.create(X, {"breed": breeds, "place": places}, tau=0.05)
    res = ex.coordinate(data, ad.AnchorSet(E_breeds), ad.AnchorSet(E_places), "breed", "place",
                        models=["softmax", "gaussian"], out_dir="results/coordinate", seed=0)
    res.frame("summary")

Command line: ``anchordiv eval PROTOCOL COLLECTION --anchors ... --factor ... --out DIR``
(:func:`anchordiv.experiments.cli.eval_command`), also runnable as
``python -m anchordiv.experiments PROTOCOL ...``.
"""

from .core import (
    ANCHOR_MODELS,
    BASELINES,
    PARAMETRIC,
    POSTERIOR_MODELS,
    EvalData,
    ProtocolResult,
    build_geometry,
    score,
    summarize,
)
from .protocols import PROTOCOLS, adaptation, budget, components, coordinate, run_protocol, runtime, table

__all__ = [
    "EvalData", "ProtocolResult", "PROTOCOLS", "run_protocol", "coordinate", "budget", "adaptation",
    "components", "table", "runtime", "score", "summarize", "build_geometry", "ANCHOR_MODELS", "BASELINES",
    "PARAMETRIC", "POSTERIOR_MODELS",
]
