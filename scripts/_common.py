"""Shared helpers of the dataset scripts: encoder, cached collections and anchors, run logging.

Each script prepares one dataset as an embedding collection folder
(:func:`anchordiv.io.embed_collection`, labels in its metadata) and an anchors YAML file
(embedded and cached by :func:`anchordiv.anchorsfile.embed_anchors`) under a data
folder, then runs protocols of :mod:`anchordiv.experiments` on them and writes their
CSV/MD/PNG files under ``docs/results/<run>/<protocol>/``. The same folders can be
given to ``anchordiv eval`` (the scripts print the equivalent commands).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "src") not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT / "src"))

#: Default folder for downloaded and embedded data (outside the repository).
DEFAULT_DATA = Path(os.environ.get("ANCHORDIV_DATA", Path.home() / ".cache" / "anchordiv-experiments"))
#: Default folder for the committed results.
RESULTS = ROOT / "docs" / "results"


def parser(description: str, run: str) -> argparse.ArgumentParser:
    """Command-line options shared by the scripts."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help=f"data folder (default: {DEFAULT_DATA})")
    p.add_argument("--out", type=Path, default=RESULTS / run, help=f"results folder (default: docs/results/{run})")
    p.add_argument("--encoder", default="minilm", help="encoder spec (default: minilm)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default: 1; on a busy machine several threads can make small "
                        "LAPACK calls such as eigh 100 times slower)")
    p.add_argument("--seed", type=int, default=0, help="seed of every draw (default: 0)")
    p.add_argument("--only", nargs="+", default=None, help="run only these protocols")
    return p


def setup(threads: int) -> None:
    import torch

    torch.set_num_threads(max(1, int(threads)))


def load_encoder(spec: str) -> Any:
    from anchordiv.encoders import load

    return load(spec, device="cpu")


def collection(folder: Path, texts: Sequence[str], labels: Mapping[str, Sequence], encoder: Any) -> Any:
    """Embed ``texts`` into a collection folder (reused when it holds the same job) and load it."""
    from anchordiv.io import embed_collection, load_collection

    try:
        embed_collection(list(texts), encoder, folder, labels=dict(labels), progress=False)
    except ValueError as exc:
        if "holds" not in str(exc) and "not empty" not in str(exc):
            raise
        shutil.rmtree(folder)
        embed_collection(list(texts), encoder, folder, labels=dict(labels), progress=False)
    return load_collection(folder)


def anchors_file(path: Path, sets: Mapping[str, Sequence[str]]) -> Path:
    """Write an anchors YAML file (set name → phrases) unless it already holds the same sets."""
    import yaml

    text = yaml.safe_dump({k: list(v) for k, v in sets.items()}, sort_keys=False, allow_unicode=True, width=1000)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")
    return path


def anchor_sets(path: Path, encoder: Any) -> dict:
    """Every set of an anchors file, embedded (cached next to the file)."""
    from anchordiv.anchorsfile import embed_anchors

    return embed_anchors(path, encoder).sets


class RunLog:
    """Collects per-protocol runtimes and verdicts and writes ``run.json`` and ``commands.md``."""

    def __init__(self, out: Path, name: str, argv: Sequence[str]):
        self.out, self.name, self.t0 = out, name, time.perf_counter()
        self.info: dict[str, Any] = {"run": name, "command": "python " + " ".join(argv), "protocols": {}}
        self.commands: list[tuple[str, str]] = []
        out.mkdir(parents=True, exist_ok=True)

    def add(self, key: str, result: Any, cli: str | None = None) -> None:
        self.info["protocols"][key] = {"seconds": round(result.seconds, 1),
                                       "verdicts": result.config.get("verdicts", [])}
        if cli:
            self.commands.append((key, cli))
        print(f"[{self.name}] {key}: {result.seconds:.1f} s", flush=True)
        for v in result.config.get("verdicts", []):
            print(f"    {v}", flush=True)

    def write(self, **facts: Any) -> None:
        """Write ``run.json`` and ``commands.md``, keeping the entries of protocols not rerun this time."""
        path = self.out / "run.json"
        old = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        protocols = {**old.get("protocols", {}), **self.info["protocols"]}
        commands = {**old.get("eval_commands", {}), **dict(self.commands)}
        self.info.update(facts)
        self.info["protocols"] = protocols
        self.info["eval_commands"] = commands
        self.info["seconds_this_invocation"] = round(time.perf_counter() - self.t0, 1)
        self.info["protocol_seconds_total"] = round(sum(p["seconds"] for p in protocols.values()), 1)
        path.write_text(portable(json.dumps(self.info, indent=2, default=str, ensure_ascii=False)) + "\n",
                        encoding="utf-8")
        if commands:
            (self.out / "commands.md").write_text(
                "# Equivalent `anchordiv eval` commands\n\nThe script runs the protocols through the Python API; "
                "these commands run the same protocols on the same prepared data (folders under the script's "
                "`--data`, here the default).\n\n```bash\n"
                + "\n\n".join(f"# {k}\n{portable(v)}" for k, v in commands.items()) + "\n```\n", encoding="utf-8")


def portable(text: str) -> str:
    """``text`` with the checkout path dropped and the home folder written as ``~``."""
    return text.replace(str(ROOT) + os.sep, "").replace(str(Path.home()), "~")
