"""Persistent, searchable galleries for anchor divergences: :class:`Index`.

Backends: ``"exact"`` (torch, exhaustive), ``"faiss"`` (faiss-cpu: flat, HNSW, IVF) and
``"milvus"`` (an embedded milvus-lite file or a Milvus server/cluster). The approximate
backends re-rank a shortlist exactly, so every backend returns divergences in the units
of ``model.search``.

Backends of one's own
---------------------
A backend is a subclass of :class:`Backend` that states its capabilities in ``TAGS`` (a
:class:`BackendTags`) and implements ``add``, ``delete``, ``search``, ``key_blocks``,
``state`` and ``restore``; the other methods are hooks with working defaults. Make it
known with :func:`register_backend` (in the process), or from an installed package with
an entry point of the group ``anchordiv.backends``, which :class:`Index`,
:func:`build_index` and ``anchordiv index build --backend NAME`` then find::

    [project.entry-points."anchordiv.backends"]
    numpy_flat = "my_package.backend:NumpyBackend"

:func:`anchordiv.testing.check_backend` checks one against a float64 brute force.

Pointing an index at a Milvus cluster
-------------------------------------
The same code serves an embedded milvus-lite file and a Milvus server or cluster; only
the connection parameters change::

    import anchordiv as ad

    model = ad.Softmax(tau=0.01).fit(anchor_embeddings)

    # embedded, one local file (pip install pymilvus milvus-lite)
    index = ad.Index(model, backend="milvus", uri="./gallery.db", collection_name="gallery")

    # a Milvus server / cluster (pip install pymilvus)
    index = ad.Index(
        model, backend="milvus",
        uri="http://milvus.example.internal:19530",   # or https://... for TLS / Zilliz Cloud
        token="user:password",                         # or an API key; omit if auth is off
        db_name="default",                             # optional Milvus database
        collection_name="gallery_softmax_tau001",
        index_type="HNSW", M=32, ef_construction=200, ef_search=256,
    )
    index.add(gallery_embeddings, ids=gallery_ids)     # batches of any size, repeatedly
    distances, ids = index.search(query_embeddings, k=10)
    index.save("gallery.index")                        # model, ids and uri/collection only

    # later, in another process; the token is never written to the file:
    index = ad.Index.load("gallery.index", token="user:password")

Collection schema
-----------------
The first ``add`` creates the collection, which other Milvus tools can read:

=============  ==============  ===========================================================
field          type            content
=============  ==============  ===========================================================
``id``         INT64, primary  the ids given to ``add`` (row numbers for ``build_index``)
``vec``        FLOAT_VECTOR    the geometry's key vector: the embedding z with metric L2 for
                               Euclidean models (Gaussian, latent), else the augmented key
                               [ψ, √(M² − ‖ψ‖²)] with metric COSINE (all keys have norm M,
                               so this is the L2 order)
``embedding``  FLOAT_VECTOR    the raw embedding (FLAT index, COSINE), on Milvus ≥ 2.4 and
                               milvus-lite 3.x; Milvus 2.3 allows one vector field per
                               collection, so there it lives in the companion collection
                               ``<collection_name>_embedding`` (``id``, ``embedding``).
                               ``store_embedding=False`` keeps neither.
metadata       BOOL, INT64,    one field per column of ``add(..., metadata=DataFrame)`` (or of
               DOUBLE, VARCHAR the collection's ``metadata/`` parquet shards in ``build_index``)
=============  ==============  ===========================================================

``search(Q, k, filter='label == "cat" and year > 2000')`` passes a Milvus boolean
expression on these fields through. Creating an index for a collection name that already
exists raises an error unless ``overwrite=True`` (which drops it and its companion);
reopen an existing collection with :meth:`anchordiv.Index.load`. Every collection holds one
model's key features: index each model (and each ``symmetric`` setting) in its own
collection.

``index_type`` is ``"FLAT"`` (exhaustive), ``"HNSW"``, ``"IVF_FLAT"`` or ``"AUTOINDEX"``
(the server's choice). The candidates Milvus returns are re-ranked exactly, so the
distances are exact divergences of the stored (float32) features. milvus-lite 3.x
serves FLAT, HNSW and IVF_FLAT (HNSW and IVF_FLAT through faiss-cpu, which it then
needs installed); the older milvus-lite 2.x releases serve FLAT (and IVF_FLAT from
2.4.11) only. A milvus-lite file is opened by one process at a time; several processes
or machines share one gallery through a Milvus server.
"""

from ._build import build_index
from ._common import Backend, BackendTags
from ._index import Index
from ._registry import BACKENDS, ENTRY_POINT_GROUP, backend_choice, backend_class, backend_names, register_backend

__all__ = ["Index", "BACKENDS", "build_index", "Backend", "BackendTags", "register_backend", "backend_class",
           "backend_names", "backend_choice", "ENTRY_POINT_GROUP"]
