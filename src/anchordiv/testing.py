"""A shared check battery for geometries, in the manner of scikit-learn's ``estimator_checks``.

Every registered model passes it, and a user who registers a geometry of their own can run
it too::

    from anchordiv.testing import check_geometry
    check_geometry(lambda: MyGeometry(tau=0.05))          # raises AssertionError on a failure

or, with pytest, one test per check::

    @pytest.mark.parametrize("check", geometry_checks(lambda: MyGeometry(tau=0.05)), ids=str)
    def test_my_geometry(check):
        check()

Each check compares the geometry with an independent float64 computation from its own
primitives: the feature-map contract against ``divergence`` (d(q‖g) = κ(η_g) − κ(η_q) −
∇κ(η_q)ᵀ(η_g − η_q)), and for anchor models eq. F.1,
d_sym(q, g) = ½(η_q − η_g)ᵀ(∇κ(η_q) − ∇κ(η_g)).
"""

from __future__ import annotations

import copy
import os
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import torch

from .models import model_name
from .models.base import Geometry, NotFittedError

__all__ = ["check_geometry", "geometry_checks", "Check"]


def _unit(X: np.ndarray) -> np.ndarray:
    return X / np.linalg.norm(X, axis=1, keepdims=True)


def _data(seed: int = 0, d: int = 8) -> dict[str, np.ndarray]:
    """Unit vectors in a common cone (as CLIP embeddings are): anchors, queries, gallery."""
    rng = np.random.default_rng(seed)
    center = rng.normal(size=d) * 1.5
    draw = lambda n: _unit(rng.normal(size=(n, d)) + center)  # noqa: E731
    return {"anchors": draw(40), "broad": draw(120), "target": draw(6), "Q": draw(5), "G": draw(9)}


def _close(a: Any, b: Any, what: str, rtol: float = 1e-9) -> None:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    scale = max(1.0, float(np.abs(b).max(initial=0.0)))
    if a.shape != b.shape or not np.allclose(a, b, rtol=rtol, atol=rtol * scale):
        err = float(np.abs(a - b).max()) if a.shape == b.shape else float("nan")
        raise AssertionError(f"{what}: shapes {a.shape} vs {b.shape}, max |difference| {err:.3g}")


@dataclass(frozen=True)
class Check:
    """One named check of a geometry factory; calling it runs the check."""

    name: str
    run: Callable[[], None]

    def __call__(self) -> None:
        self.run()

    def __str__(self) -> str:
        return self.name


def _fitted(factory: Callable[[], Geometry], data: dict) -> Geometry:
    return factory().fit(data["anchors"])


def _with_tau(model: Geometry, tau: float) -> Geometry:
    params = model.get_params()
    params.update(tau=tau, logit_scale=None)
    return type(model)(**params)


# ------------------------------------------------------------------ the checks
def check_feature_contract(factory, data) -> None:
    """pairwise = o − φψᵀ equals the divergence computed pair by pair, symmetric and not."""
    m = _fitted(factory, data)
    Q, G = data["Q"], data["G"]
    nq, ng = len(Q), len(G)
    qq, gg = np.repeat(Q, ng, axis=0), np.tile(G, (nq, 1))
    forward = np.asarray(m.divergence(qq, gg)).reshape(nq, ng)
    for symmetric in (False, True):
        D = m.pairwise(Q, G, symmetric=symmetric)
        inner = (np.asarray(m.query_offsets(Q, symmetric))[:, None]
                 - np.asarray(m.query_features(Q, symmetric)) @ np.asarray(m.key_features(G, symmetric)).T)
        _close(D, inner, f"pairwise(symmetric={symmetric}) vs o − φψᵀ")
        if not m.tags().anchor_model:
            continue
        if symmetric:
            backward = np.asarray(m.divergence(gg, qq)).reshape(nq, ng)
            _close(D, 0.5 * (forward + backward), "pairwise(symmetric) vs ½[d(q‖g) + d(g‖q)]")
        else:
            _close(D, forward, "pairwise(symmetric=False) vs d(q‖g)")


def check_eq_f1(factory, data) -> None:
    """d_sym(q, g) = ½(η_q − η_g)ᵀ(∇κ(η_q) − ∇κ(η_g)) (paper eq. F.1), anchor models only."""
    m = _fitted(factory, data)
    if not m.tags().anchor_model:
        return
    eq, eg = np.asarray(m.natural_params(data["Q"])), np.asarray(m.natural_params(data["G"]))
    gq, gg = np.asarray(m.grad_cgf(eq)), np.asarray(m.grad_cgf(eg))
    f1 = 0.5 * np.einsum("ijk,ijk->ij", eq[:, None] - eg[None], gq[:, None] - gg[None])
    _close(m.pairwise(data["Q"], data["G"]), f1, "pairwise vs eq. F.1")


def check_array_kinds(factory, data) -> None:
    """numpy in → numpy out, torch in → torch out; dtypes kept (half precision → float32)."""
    m = _fitted(factory, data)
    Q, G = data["Q"], data["G"]
    ref = m.pairwise(Q, G)
    for dtype, out in ((np.float64, np.float64), (np.float32, np.float32), (np.float16, np.float32)):
        D = m.pairwise(Q.astype(dtype), G.astype(dtype))
        assert isinstance(D, np.ndarray) and D.dtype == out, f"numpy {dtype.__name__} in gave {type(D)} {D.dtype}"
        _close(D, ref, f"pairwise in {dtype.__name__}", rtol={np.float64: 1e-9, np.float32: 1e-3}.get(dtype, 3e-2))
    for dtype, out in ((torch.float64, torch.float64), (torch.float32, torch.float32), (torch.float16, torch.float32)):
        D = m.pairwise(torch.from_numpy(Q).to(dtype), torch.from_numpy(G).to(dtype))
        assert isinstance(D, torch.Tensor) and D.dtype == out, f"torch {dtype} in gave {type(D)} {D.dtype}"
    d, i = m.search(torch.from_numpy(Q), torch.from_numpy(G), k=3)
    assert isinstance(d, torch.Tensor) and i.dtype == torch.int64
    d, i = m.search(Q, G, k=3)
    assert isinstance(i, np.ndarray) and i.dtype == np.int64
    if torch.cuda.is_available():
        moved = copy.deepcopy(m).to("cuda")
        D = moved.pairwise(torch.from_numpy(Q).cuda(), torch.from_numpy(G).cuda())
        assert D.device.type == "cuda"
        _close(D.cpu().numpy(), ref, "pairwise on cuda", rtol=1e-6)


def check_low_temperature(factory, data) -> None:
    """τ = 1e-3 (logits up to 1000) gives finite divergences, in float32 and float64."""
    m = factory()
    if not m.tags().takes_temperature:
        return
    m = _with_tau(m, 1e-3).fit(data["anchors"])
    for dtype in (np.float64, np.float32):
        D = m.pairwise(data["Q"].astype(dtype), data["G"].astype(dtype))
        assert np.isfinite(D).all(), f"τ = 1e-3 in {dtype.__name__} gave non-finite divergences"


def check_fit(factory, data) -> None:
    """fit returns self, is idempotent, and a clone from get_params fits to the same geometry."""
    m = factory()
    assert m.fit(data["anchors"]) is m, "fit must return self"
    first = m.pairwise(data["Q"], data["G"])
    m.fit(data["anchors"])
    _close(m.pairwise(data["Q"], data["G"]), first, "a second fit on the same anchors")
    clone = type(m)(**m.get_params()).fit(data["anchors"])
    _close(clone.pairwise(data["Q"], data["G"]), first, "a clone from get_params()")
    assert repr(m).startswith(type(m).__name__), "repr names the class"


def check_index_round_trip(factory, data) -> None:
    """Index save/load keeps the model, and search through the index equals model.search."""
    from .index import Index

    m = _fitted(factory, data)
    if model_name(type(m)) is None:
        raise AssertionError(f"{type(m).__name__} is not registered: call ad.register_model(name, cls) "
                             "so that indexes holding it can be saved and loaded")
    ref = m.search(data["Q"], data["G"], k=4)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "g.index")
        Index(m).add(data["G"]).save(path)
        loaded = Index.load(path)
    assert type(loaded.model) is type(m)
    got = loaded.search(data["Q"], k=4)
    np.testing.assert_array_equal(got[1], ref[1])
    _close(got[0], ref[0], "distances after Index save/load")


def check_prior_round_trip(factory, data) -> None:
    """fit(target, prior=broad) gives prior_; a fitted prior and the broad set agree; save/load keeps it."""
    m = factory()
    if not m.tags().accepts_prior:
        return
    from .index import Index

    a = factory().fit(data["target"], prior=data["broad"])
    b = factory().fit(data["target"], prior=factory().fit(data["broad"]))
    assert getattr(a, "prior_", None) is not None, "a posterior fit keeps its prior in prior_"
    _close(a.pairwise(data["Q"], data["G"]), b.pairwise(data["Q"], data["G"]), "prior as a set vs as a fitted model")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "p.index")
        Index(a).add(data["G"]).save(path)
        loaded = Index.load(path).model
    _close(loaded.pairwise(data["Q"], data["G"]), a.pairwise(data["Q"], data["G"]), "posterior model after save/load")
    plain = factory().fit(data["anchors"])
    assert getattr(plain, "prior_", None) is None, "a plain fit has no prior_"


def check_bad_inputs(factory, data) -> None:
    """The documented bad inputs raise clear errors naming the argument."""
    m = factory()
    if m.tags().needs_anchors:
        try:
            m.pairwise(data["Q"], data["G"])
        except NotFittedError:
            pass
        else:
            raise AssertionError("an unfitted geometry must raise NotFittedError")
    m = _fitted(factory, data)
    Q, G = data["Q"], data["G"]
    bad = Q.copy()
    bad[1, 2] = np.nan
    cases = [((bad, G), "Q", "NaN"), ((Q, np.vstack([G, np.full((1, G.shape[1]), np.inf)])), "G", "NaN or inf"),
             ((Q[0], G), "Q", "2-D"), ((Q[:, :-1], G), "Q", "dimension"), ((Q[:0], G), "Q", "empty")]
    for args, name, words in cases:
        try:
            m.pairwise(*args)
        except ValueError as exc:
            msg = str(exc)
            assert name in msg and words in msg, f"error for a bad {name} ({words}) should say so: {msg!r}"
        else:
            raise AssertionError(f"a bad {name} ({words}) must raise ValueError")
    for k in (0, -1, 2.5, True):
        try:
            m.search(Q, G, k=k)
        except ValueError as exc:
            assert "k" in str(exc)
        else:
            raise AssertionError(f"k={k!r} must raise ValueError")


CHECKS = (check_feature_contract, check_eq_f1, check_array_kinds, check_low_temperature, check_fit,
          check_index_round_trip, check_prior_round_trip, check_bad_inputs)


def geometry_checks(factory: Callable[[], Geometry], seed: int = 0) -> Iterator[Check]:
    """The checks of :data:`CHECKS` bound to ``factory`` (a callable returning an unfitted geometry)."""
    data = _data(seed)
    label = type(factory()).__name__
    for check in CHECKS:
        yield Check(f"{label}-{check.__name__}", lambda c=check: c(factory, data))


def check_geometry(factory: Callable[[], Geometry], seed: int = 0) -> None:
    """Run every check on the geometries ``factory`` builds; an ``AssertionError`` names the failing one."""
    for check in geometry_checks(factory, seed):
        try:
            check()
        except AssertionError as exc:
            raise AssertionError(f"{check.name}: {exc}") from exc

