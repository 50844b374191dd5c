"""clip-retrieval's endpoints of the service: ``/knn-service`` and ``/metadata`` in its shapes."""

from __future__ import annotations

from typing import Any

from . import schemas
from .errors import FieldError
from .schemas import KnnRequest, MetadataRequest
from .._util import json_scalar


class ClipRetrieval:
    """clip-retrieval's search and metadata, on a :class:`~anchordiv.serve.Service` (its ``search``,
    ``request``, rows, ids and thumbnails)."""

    def knn_service(self, data: Any, base: str = "") -> list[dict]:
        """``POST /knn-service`` in clip-retrieval's shape: a list of ``{id, similarity, **metadata}``.

        ``indice_name`` is a context name from ``/indices-list`` (default: the default context).
        """
        req = self.request(KnnRequest, data)
        if req.use_mclip:
            raise FieldError("use_mclip", "multilingual CLIP is not available here")
        num = req.num_images
        num_ids = req.num_result_ids if req.num_result_ids is not None else num
        query: dict[str, Any] = {"k": min(max(num, num_ids), schemas.MAX_K),
                                 "context": self.default_key.name if req.indice_name is None else req.indice_name}
        image = None
        if req.text is not None:
            query["text"] = req.text
        elif req.image is not None:
            import base64
            import binascii

            try:
                image = base64.b64decode(req.image, validate=True)
            except (binascii.Error, ValueError):
                raise FieldError("image", "is not valid base64") from None
        elif req.embedding_input is not None:
            query["embedding"] = req.embedding_input
        else:
            raise FieldError("text", "give one of text, image or embedding_input")
        try:
            res = self.search(query, image=image, base=base)
        except FieldError as exc:
            field = {"context": "indice_name", "model": "indice_name", "index": "indice_name",
                     "k": "num_images", "embedding": "embedding_input"}.get(exc.field, exc.field)
            raise FieldError(field, exc.message, exc.status) from None
        out, seen = [], set()
        for hit in res["results"]:
            if req.deduplicate:
                digest = self.rows[hit["row"]].tobytes()
                if digest in seen:
                    continue
                seen.add(digest)
            meta = self.clip_metadata(hit["row"], base)
            out.append({**meta, "id": hit["id"], "similarity": hit["similarity"]})
        return out[:num]

    def clip_metadata(self, row: int, base: str = "") -> dict:
        """A row's metadata fields as clip-retrieval returns them (``caption``, ``image_path``, ``url``, labels...)."""
        meta = {c: json_scalar(self._values[c][row]) for c in self.columns}
        if self.item_column in ("text",) and "caption" not in meta:
            meta["caption"] = meta[self.item_column]
        if self.has_images:
            meta["image_path"] = self.item_text(row)  # the file name only, never the server's path
            meta["url"] = self.thumb_url(row, base)
        return meta

    def metadata(self, data: Any, base: str = "") -> list[dict]:
        """``POST /metadata``: ``[{"id": id, "metadata": {...}}]`` for the given item ids."""
        req = self.request(MetadataRequest, data)
        out = []
        for i in req.ids:
            row = self.find_row(i, "ids")
            meta = self.clip_metadata(row, base)
            if self.has_images:
                import base64

                try:
                    meta["image"] = base64.b64encode(self.thumbnail(row)).decode("ascii")
                except FieldError:
                    pass
            out.append({"id": self.item_id(row), "metadata": meta})
        return out
