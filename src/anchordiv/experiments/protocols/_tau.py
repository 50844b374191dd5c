"""``sweep_tau``: one protocol run per temperature, stacked into one result."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ..report import ProtocolResult, write_csv
from ._table import table


def sweep_tau(protocol: Any, *args: Any, tau: Sequence[float], out_dir: Any = None, **kwargs: Any) -> ProtocolResult:
    """Run ``protocol`` once per temperature of ``tau``: one result whose frames have a leading
    ``tau`` column (:func:`table` sweeps τ itself, in one Markdown table).

    With ``out_dir`` each run writes its own files to ``out_dir/tau=<τ>/``, and ``out_dir``
    gets ``<protocol>.csv``, ``_summary.csv`` and ``_effects.csv`` over all of them, and a
    ``<protocol>.md`` with each run's Markdown under its τ.
    """
    import pandas as pd

    taus = [float(t) for t in tau]
    if not taus:
        raise ValueError("tau is an empty list; give one temperature or several, e.g. [0.01, 0.05].")
    if getattr(protocol, "__wrapped__", protocol) is getattr(table, "__wrapped__", table):
        return table(*args, tau=taus, out_dir=out_dir, **kwargs)
    out = None if out_dir is None else Path(out_dir)
    runs = [protocol(*args, tau=t, out_dir=None if out is None else out / f"tau={t:g}", **kwargs) for t in taus]

    def stack(attr: str) -> pd.DataFrame:
        return pd.concat([getattr(r, attr).assign(tau=t)[["tau", *getattr(r, attr).columns]]
                          for t, r in zip(taus, runs)], ignore_index=True)

    first = runs[0]
    config = {"protocol": first.protocol, "tau": taus, "metric": first.config.get("metric", "auprc"),
              "runs": [r.config for r in runs],
              "verdicts": [f"τ = {t:g}: {v}" for t, r in zip(taus, runs) for v in r.config.get("verdicts", [])]}
    res = ProtocolResult(first.protocol, stack("observations"), stack("rows"), stack("summary"), stack("effects"),
                         config, seconds=sum(r.seconds for r in runs))
    if out is not None:
        name = res.protocol
        res.paths = {"csv": write_csv(out / f"{name}.csv", res.rows),
                     "summary_csv": write_csv(out / f"{name}_summary.csv", res.summary),
                     "effects_csv": write_csv(out / f"{name}_effects.csv", res.effects),
                     "md": out / f"{name}.md"}
        res.paths["md"].write_text("\n".join(f"# τ = {t:g}\n\n" + r.paths["md"].read_text(encoding="utf-8")
                                             .replace("\n#", "\n##") for t, r in zip(taus, runs)), encoding="utf-8")
    return res
