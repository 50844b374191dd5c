"""Live contexts: a new notion of similarity over a fixed collection, ready after one pass over it.

The embeddings never change; only the anchors do. A context (anchors, geometry, τ,
parameters, symmetric) over a collection is its key features ψ, built by streaming the
collection's memory-mapped shards (:mod:`anchordiv.contexts.store`) and searched exactly;
:class:`ContextRegistry` names them, builds them in the background and bounds their bytes
(:mod:`anchordiv.contexts.registry`).
"""

from .cluster import ContextLost, PartsMissing
from .registry import ContextLimit, ContextRegistry, LiveContext
from .store import Cancelled, FeatureStore, IndexStore, compact, context_store

__all__ = ["FeatureStore", "IndexStore", "Cancelled", "context_store", "compact", "ContextRegistry", "LiveContext",
           "ContextLimit", "ContextLost", "PartsMissing"]
