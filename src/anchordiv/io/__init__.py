"""Reading and writing embedding collections.

A *collection* is a set of embeddings of texts or images computed once by a fixed
encoder, with per-row metadata. On disk it uses the clip-retrieval / autofaiss
layout::

    out_dir/
        collection.json                 # manifest (written by embed_collection)
        img_emb/img_emb_0.npy           # or text_emb/text_emb_0.npy; (n_i, d) arrays
        img_emb/img_emb_1.npy
        ...
        metadata/metadata_0.parquet     # image_path or caption column + label columns,
        metadata/metadata_1.parquet     # same row order as the matching shard
        ...

:func:`embed_collection` writes such a folder, resumably: each shard is written
atomically and recorded in the manifest, and a rerun with the same arguments continues
after the last recorded shard. :func:`load_collection` reads that layout (with or
without a manifest) and also a parquet file with an ``embedding`` column, a plain
``.npy`` file, or a folder of ``.npy`` shards.

The modules, by job: :mod:`~anchordiv.io.readers` (texts and image folders to embed,
``.npy`` and parquet embedding files), :mod:`~anchordiv.io.embed` (embedding runs) and
:mod:`~anchordiv.io.collections` (:class:`Collection`, the layout and its manifest). The
layout's parts (:func:`manifest_of`, :func:`manifest_files`, :func:`layout_kind`,
:func:`numbered_files`) and :func:`read_parquet` serve the index builds too.

pandas and pyarrow are needed for parquet and metadata, Pillow for images; they are
imported only when used.
"""

from .collections import (
    MANIFEST_NAME,
    Collection,
    layout_kind,
    load_collection,
    manifest_files,
    manifest_of,
    numbered_files,
)
from .embed import EmbedResult, embed_collection
from .mapped import MappedRows
from .readers import IMAGE_EXTENSIONS, list_images, read_parquet, read_texts

__all__ = [
    "IMAGE_EXTENSIONS",
    "MANIFEST_NAME",
    "Collection",
    "EmbedResult",
    "embed_collection",
    "layout_kind",
    "list_images",
    "load_collection",
    "manifest_files",
    "MappedRows",
    "manifest_of",
    "numbered_files",
    "read_parquet",
    "read_texts",
]
