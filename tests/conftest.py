import importlib.util
import itertools
import os
import uuid

import numpy as np
import pytest


#: Small-data parameters of every geometry in the registry, shared by the search and index tests.
GEOMETRY_PARAMS = {
    "softmax": dict(tau=0.05),
    "gaussian": dict(tau=0.05),
    "gmm": dict(tau=0.05, n_components=2),
    "latent_gaussian": dict(tau=0.05, rank=4),
    "latent_spherical": dict(tau=0.05, rank=4),
    "cosine": {},
    "iti": {},
}


def unit_rows(rng, n, d, center=None, spread=1.0):
    """Random unit vectors, optionally concentrated around ``center``."""
    X = rng.normal(size=(n, d)) * spread
    if center is not None:
        X = X + center
    return X / np.linalg.norm(X, axis=1, keepdims=True)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def data(rng):
    """Anchors, queries and gallery in float64 with a shared dominant direction (CLIP-like cone)."""
    d = 12
    center = rng.normal(size=d) * 1.5
    anchors = unit_rows(rng, 60, d, center)
    Q = unit_rows(rng, 7, d, center)
    G = unit_rows(rng, 9, d, center)
    return anchors, Q, G



# ------------------------------------------------------------------ Milvus
#: Point the Milvus tests at another server or cluster instead of starting one.
MILVUS_URI_ENV, MILVUS_TOKEN_ENV = "ANCHORDIV_MILVUS_URI", "ANCHORDIV_MILVUS_TOKEN"
#: Tag in every collection name of this session, so that runs against a shared server never clash.
SESSION_TAG = uuid.uuid4().hex[:8]
HAS_PYMILVUS = importlib.util.find_spec("pymilvus") is not None
HAS_MILVUS_LITE = HAS_PYMILVUS and importlib.util.find_spec("milvus_lite") is not None


def collection_namer(prefix):
    """A function giving fresh collection names ``<prefix><n>_<session tag>``."""
    counter = itertools.count()
    return lambda: f"{prefix}{next(counter)}_{SESSION_TAG}"


def _server(tmp_path_factory, authorization):
    from milvus_server import MilvusServer, executable

    if not HAS_PYMILVUS or executable() is None:
        pytest.fail("the Milvus tests need a Milvus server: pip install pymilvus milvus==2.3.5 "
                    f"(or set {MILVUS_URI_ENV} to one)")
    server = MilvusServer(tmp_path_factory.mktemp("milvus-server-auth" if authorization else "milvus-server"),
                          authorization=authorization)
    return server


@pytest.fixture(scope="session")
def milvus_server(tmp_path_factory):
    """Connection parameters of a real Milvus server: ``$ANCHORDIV_MILVUS_URI`` (with
    ``$ANCHORDIV_MILVUS_TOKEN``) when set, else a ``milvus-server`` started for the session."""
    if os.environ.get(MILVUS_URI_ENV):
        yield {"uri": os.environ[MILVUS_URI_ENV], "token": os.environ.get(MILVUS_TOKEN_ENV) or None}
        return
    server = _server(tmp_path_factory, authorization=False)
    try:
        yield {"uri": server.uri, "token": None}
    finally:
        server.stop()


@pytest.fixture(scope="session")
def milvus_auth_server(tmp_path_factory):
    """A Milvus server with authorization on: ``$ANCHORDIV_MILVUS_URI`` when a token is given
    with it, else a ``milvus-server --authorization-enabled true`` (credentials root:Milvus)."""
    if os.environ.get(MILVUS_URI_ENV) and os.environ.get(MILVUS_TOKEN_ENV):
        yield {"uri": os.environ[MILVUS_URI_ENV], "token": os.environ[MILVUS_TOKEN_ENV]}
        return
    server = _server(tmp_path_factory, authorization=True)
    try:
        yield {"uri": server.uri, "token": server.token}
    finally:
        server.stop()


@pytest.fixture(scope="module")
def milvus_lite(tmp_path_factory):
    """Connection parameters of a milvus-lite file (one embedded server) for the module."""
    if not HAS_MILVUS_LITE:
        pytest.fail("the Milvus tests need milvus-lite: pip install pymilvus milvus-lite")
    return {"uri": str(tmp_path_factory.mktemp("milvus") / "index.db"), "token": None}


#: The Milvus deployments every Milvus test runs against, by fixture suffix.
MILVUS_KINDS = ("lite", "server")


@pytest.fixture(scope="module", params=MILVUS_KINDS)
def milvus(request):
    """Connection parameters (uri, token) of each Milvus the tests run against: a milvus-lite
    file of this module, and the session's Milvus server."""
    return request.getfixturevalue(f"milvus_{request.param}")
