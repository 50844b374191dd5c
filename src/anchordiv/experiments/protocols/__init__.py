"""The experiment protocols: one function per claim of Kannan, Park, Veitch (2026), §5 and App. F.

=============  ==============  ===========================================================
protocol       paper           sweeps
=============  ==============  ===========================================================
coordinate     §5.2, Fig. 3    mixture q_p = p·q_A + (1 − p)·q_B; AUPRC on factors A and B
budget         §5.3, Figs 4, 6 anchor budget over random subsets, every model and baseline
adaptation     §5.4, Fig. 5    target-anchor budget; posterior (broad → target) vs target-only
components     App. F.3, Fig 7 number of GMM components, per anchor set
table          Tables 2, 3     per-label AUPRC differences against cosine and ITI
runtime        App. F.4, Tab 4 fit + search time against the number of anchors
=============  ==============  ===========================================================

Each protocol takes an :class:`~anchordiv.experiments.core.EvalData` (embeddings and
labels; ``runtime`` draws its own data), anchor sets and model names, is seeded (the same
arguments give the same files), and returns a
:class:`~anchordiv.experiments.report.ProtocolResult` of tidy DataFrames: the per-query
observations, the mean AP per condition and draw, the summary (means with 95 %
bootstrap intervals over draws and queries) and the paired effects that test the claim.
With ``out_dir`` it writes ``<protocol>.csv``, ``_summary.csv``, ``_effects.csv``,
``.md`` (tables and a verdict), ``.png`` and ``.json`` (parameters and timings).

Every protocol runs the one skeleton of :mod:`._skeleton` (validate → sweep → summarize →
effects → report); its module states its sweep and its sections. :func:`sweep_tau` runs
one over several temperatures.
"""

from __future__ import annotations

from typing import Any

from ..report import ProtocolResult
from ._adaptation import adaptation
from ._budget import budget
from ._components import COMPONENTS_MODEL, components
from ._coordinate import coordinate
from ._runtime import RUNTIME_MODELS, runtime
from ._skeleton import EFFECT, STATS
from ._table import table, table_setting
from ._tau import sweep_tau

__all__ = ["coordinate", "budget", "adaptation", "components", "table", "table_setting", "runtime", "sweep_tau",
           "PROTOCOLS", "run_protocol", "COMPONENTS_MODEL", "RUNTIME_MODELS", "STATS", "EFFECT"]

#: Protocols by name.
PROTOCOLS = {"coordinate": coordinate, "budget": budget, "adaptation": adaptation, "components": components,
             "table": table, "runtime": runtime}


def run_protocol(name: str, *args: Any, **kwargs: Any) -> ProtocolResult:
    """Run a protocol by name; a ``ValueError`` names the choices for an unknown one."""
    if name not in PROTOCOLS:
        raise ValueError(f"unknown protocol {name!r}; choose from {', '.join(PROTOCOLS)}.")
    return PROTOCOLS[name](*args, **kwargs)
