"""A shared check battery for geometries, in the manner of scikit-learn's ``estimator_checks``.

Every registered model passes it, and a user who registers a geometry of their own can run
it too::

    from anchordiv.testing import check_geometry
    check_geometry(lambda: MyGeometry(tau=0.05))          # raises AssertionError on a failure

or, with pytest, one test per check::

    @pytest.mark.parametrize("check", geometry_checks(lambda: MyGeometry(tau=0.05)), ids=str)
    def test_my_geometry(check):
        check()

For float32 results (an index, a float32 search), :func:`assert_topk_up_to_rounding` accepts a
top-k when every returned key's float64 divergence is within the float32 rounding bound
(:func:`float32_rounding`) of the float64 k-th, so that a test holds on every CPU and SIMD level::

    from anchordiv.testing import assert_topk_up_to_rounding
    dist, ids = index.search(Q32, k=10)
    assert_topk_up_to_rounding(model, Q32, G32, ids, dist)

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

__all__ = ["check_geometry", "geometry_checks", "Check", "float32_rounding", "topk_up_to_rounding",
           "assert_topk_up_to_rounding", "recall_up_to_rounding", "FLOAT32_EPS"]

#: Unit roundoff of float32.
FLOAT32_EPS = 2.0 ** -24


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


# ------------------------------------------------ float32 results against a float64 truth
def _float64(X: Any) -> np.ndarray:
    if isinstance(X, torch.Tensor):
        X = X.detach().cpu().numpy()
    return np.asarray(X, dtype=np.float64)


def float32_rounding(model: Geometry, Q: Any, G: Any, symmetric: bool = True,
                     l2_norm: float | None = None) -> np.ndarray:
    """Per query, a bound on how far a float32 computation of its divergences to ``G`` may be
    from the float64 ones: 4(m + 2)·u·s, with u the float32 unit roundoff, m the number of
    terms (the key feature dimension, plus one) and s the size of the terms the divergence is
    computed from, s = |o(q)| + ‖φ(q)‖·M, M = max ‖ψ(g)‖ (the inner-product form o − φᵀψ, in
    which every exact search and re-ranking computes it). Higham's γ_m bound, doubled for the
    two computations compared, as :func:`anchordiv.index._certify.rounding_slack`.

    ``l2_norm``: the divergences were instead ranked as float32 squared L2 distances
    ‖φ‖² + M'² − 2φᵀψ of an augmented index layout with key norm M' = ``l2_norm`` (an approximate
    index without re-ranking); s then also holds ‖φ‖² + M'².

    Computed from the float64 features of the float32-rounded inputs, so only the rounding
    of the arithmetic is bounded, not that of the inputs themselves."""
    Q64, G64 = _float64(Q), _float64(G)
    offsets = np.abs(_float64(model.query_offsets(Q64, symmetric)))
    phi = np.linalg.norm(_float64(model.query_features(Q64, symmetric)), axis=1)
    psi = _float64(model.key_features(G64, symmetric))
    M = float(np.linalg.norm(psi, axis=1).max(initial=0.0))
    scale = offsets + phi * M
    if l2_norm is not None:
        scale = scale + phi ** 2 + max(M, l2_norm) ** 2
    return 4.0 * (psi.shape[1] + 3) * FLOAT32_EPS * scale


def _truth(model, Q64, G64, ids, symmetric, exclude, allowed, tol):
    """(float64 divergences of ``ids``, float64 k-th per query, tol per query, valid distinct rows)."""
    D = np.array(_float64(model.pairwise(Q64, G64, symmetric)))
    rows = np.arange(len(Q64))[:, None]
    if allowed is not None:
        mask = np.ones(D.shape[1], dtype=bool)
        mask[np.asarray(allowed, dtype=np.int64)] = False
        D[:, mask] = np.inf
    if exclude is not None:
        ex = np.asarray(exclude, dtype=np.int64).reshape(len(Q64), -1)
        D[np.broadcast_to(rows, ex.shape)[ex >= 0], ex[ex >= 0]] = np.inf
    tol = (float32_rounding(model, Q64, G64, symmetric) if tol is None
           else np.broadcast_to(np.asarray(tol, dtype=np.float64), (len(Q64),)))
    kth = np.sort(D, axis=1)[:, ids.shape[1] - 1]
    valid = (ids >= 0) & (ids < D.shape[1])
    got = np.where(valid, np.take_along_axis(D, np.clip(ids, 0, D.shape[1] - 1), axis=1), np.inf)
    distinct = np.array([len(set(r) - {-1}) == sum(i >= 0 for i in r) for r in ids.tolist()])
    return got, kth, tol, valid & distinct[:, None]


def _ids(ids: Any, n_q: int) -> np.ndarray:
    ids = np.asarray(ids.cpu() if isinstance(ids, torch.Tensor) else ids).astype(np.int64)
    if ids.ndim != 2 or ids.shape[0] != n_q:
        raise ValueError(f"ids must have shape (|Q|, k) = ({n_q}, k), not {ids.shape}")
    return ids


def topk_up_to_rounding(model: Geometry, Q: Any, G: Any, ids: Any, dist: Any = None, *,
                        symmetric: bool = True, exclude: Any = None, allowed: Any = None,
                        tol: Any = None) -> np.ndarray:
    """Per query, whether ``ids`` (rows of ``G``, shape (|Q|, k)) is a top-k of the float64
    divergences up to float32 rounding: the ids are distinct rows, each one's float64
    divergence is at most the float64 k-th + ``tol`` (per query; default
    :func:`float32_rounding`), and ``dist`` (when given) is within ``tol`` of the float64
    divergences of ``ids``.

    ``exclude`` (|Q|, e) rows left out per query (−1 for none) and ``allowed`` (rows that may be
    returned) restrict the float64 truth as the search was restricted."""
    Q64, G64 = _float64(Q), _float64(G)
    ids = _ids(ids, len(Q64))
    if not len(Q64):
        return np.zeros(0, dtype=bool)
    got, kth, tol, ok = _truth(model, Q64, G64, ids, symmetric, exclude, allowed, tol)
    ok = ok.all(1) & np.isfinite(got).all(1) & (got <= (kth + tol)[:, None]).all(1)
    if dist is not None:
        d = _float64(dist).reshape(ids.shape)
        ok &= (np.abs(d - got) <= tol[:, None]).all(1)
    return ok


def recall_up_to_rounding(model: Geometry, Q: Any, G: Any, ids: Any, *, symmetric: bool = True,
                          exclude: Any = None, allowed: Any = None, tol: Any = None) -> float:
    """Share of the returned ``ids`` (rows of ``G``, (|Q|, k); −1 a miss) that belong to a float64
    top-k up to rounding: distinct valid rows whose float64 divergence is at most the float64
    k-th + ``tol`` (per query; default :func:`float32_rounding`, a negative ``tol`` counts only
    keys certainly in every top-k), averaged over all |Q|·k results."""
    Q64, G64 = _float64(Q), _float64(G)
    ids = _ids(ids, len(Q64))
    got, kth, tol, ok = _truth(model, Q64, G64, ids, symmetric, exclude, allowed, tol)
    return float((ok & (got <= (kth + tol)[:, None])).mean())


def assert_topk_up_to_rounding(model: Geometry, Q: Any, G: Any, ids: Any, dist: Any = None, **kwargs) -> None:
    """Raise ``AssertionError`` naming the first query where :func:`topk_up_to_rounding` fails,
    with its ids' float64 divergences against the float64 k-th and the tolerance."""
    ok = topk_up_to_rounding(model, Q, G, ids, dist, **kwargs)
    if not ok.all():
        r = int(np.flatnonzero(~ok)[0])
        Q64, G64 = _float64(Q)[r:r + 1], _float64(G)
        one = {key: (np.asarray(v)[r:r + 1] if key == "exclude" else v) for key, v in kwargs.items()
               if key != "tol"}
        tol = kwargs.get("tol")
        row_ids = _ids(ids, len(ok))[r:r + 1]
        got, kth, tol, _ = _truth(model, Q64, G64, row_ids, kwargs.get("symmetric", True), one.get("exclude"),
                                  one.get("allowed"), None if tol is None else
                                  np.broadcast_to(np.asarray(tol, dtype=np.float64), (len(ok),))[r:r + 1])
        returned = "" if dist is None else f", returned distances {_float64(dist)[r].tolist()}"
        raise AssertionError(
            f"{int((~ok).sum())} of {len(ok)} queries are not a float64 top-{row_ids.shape[1]} up to float32 "
            f"rounding; the first is query {r}: ids {row_ids[0].tolist()} at float64 divergences "
            f"{got[0].tolist()}{returned}, against the float64 k-th {float(kth[0])!r} + tolerance {float(tol[0])!r}")
