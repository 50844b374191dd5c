"""A shared check battery for geometries, in the manner of scikit-learn's ``estimator_checks``.

Every registered model passes it, and a user who registers a geometry of their own can run
it too::

    from anchordiv.testing import check_geometry
    report = check_geometry(lambda: MyGeometry(tau=0.05))  # raises AssertionError on a failure
    print(report)                                          # passed, skipped with the reason, failed

or, with pytest, one test per check::

    @pytest.mark.parametrize("check", geometry_checks(lambda: MyGeometry(tau=0.05)), ids=str)
    def test_my_geometry(check):
        check()

A check that does not apply to the geometry (eq. F.1 for a geometry without κ, say) raises
:class:`NotApplicable`, a ``unittest.SkipTest``: the report lists it as skipped with the
reason, and pytest shows it as a skip. The checks raise ``AssertionError`` explicitly, so
they also fail under ``python -O``.

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
import unittest
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np
import torch

from .models import model_name
from .models.base import Geometry, NotFittedError

__all__ = ["check_geometry", "geometry_checks", "Check", "CheckResult", "GeometryReport", "NotApplicable",
           "float32_rounding", "topk_up_to_rounding", "assert_topk_up_to_rounding", "recall_up_to_rounding",
           "FLOAT32_EPS"]

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


class NotApplicable(unittest.SkipTest):
    """Raised by a check that does not apply to the geometry; the reason says why. pytest
    reports it as a skip, :func:`check_geometry` lists it under ``skipped``."""


def _expect(condition: Any, message: str) -> None:
    """Raise ``AssertionError(message)`` unless ``condition``; unlike ``assert``, kept under ``python -O``."""
    if not condition:
        raise AssertionError(message)


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check: ``"passed"``, ``"skipped"`` (``message`` is the reason) or
    ``"failed"`` (``message`` is the error, ``error`` the exception)."""

    name: str
    outcome: str
    message: str = ""
    error: BaseException | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        return f"{self.outcome:<7} {self.name}" + (f": {self.message}" if self.message else "")


@dataclass(frozen=True)
class GeometryReport:
    """The results of :func:`check_geometry`, in the order of :data:`CHECKS`."""

    results: tuple[CheckResult, ...]

    def _select(self, outcome: str) -> dict[str, str]:
        return {r.name: r.message for r in self.results if r.outcome == outcome}

    @property
    def passed(self) -> list[str]:
        """Names of the checks that passed."""
        return list(self._select("passed"))

    @property
    def skipped(self) -> dict[str, str]:
        """Names of the checks that do not apply, with the reason."""
        return self._select("skipped")

    @property
    def failed(self) -> dict[str, str]:
        """Names of the checks that failed, with the error."""
        return self._select("failed")

    @property
    def ok(self) -> bool:
        """No check failed."""
        return not self.failed

    def __str__(self) -> str:
        head = (f"{len(self.results)} checks: {len(self.passed)} passed, {len(self.skipped)} skipped, "
                f"{len(self.failed)} failed")
        return "\n".join([head] + [str(r) for r in self.results])


@dataclass(frozen=True)
class Check:
    """One named check of a geometry factory; calling it runs the check, which raises
    ``AssertionError`` on a failure and :class:`NotApplicable` when it does not apply."""

    name: str
    run: Callable[[], None]

    def __call__(self) -> None:
        self.run()

    def result(self) -> CheckResult:
        """Run the check and return its outcome instead of raising."""
        try:
            self.run()
        except NotApplicable as exc:
            return CheckResult(self.name, "skipped", str(exc))
        except Exception as exc:  # noqa: BLE001 - an error in a check is a failure too
            message = str(exc) if isinstance(exc, AssertionError) else f"{type(exc).__name__}: {exc}"
            return CheckResult(self.name, "failed", message, exc)
        return CheckResult(self.name, "passed")

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
        raise NotApplicable(f"{type(m).__name__} is not an anchor model (tags().anchor_model is False): "
                            "eq. F.1 needs κ")
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
        _expect(isinstance(D, np.ndarray) and D.dtype == out, f"numpy {dtype.__name__} in gave "
                f"{type(D).__name__} {getattr(D, 'dtype', None)}, not numpy {out.__name__}")
        _close(D, ref, f"pairwise in {dtype.__name__}", rtol={np.float64: 1e-9, np.float32: 1e-3}.get(dtype, 3e-2))
    for dtype, out in ((torch.float64, torch.float64), (torch.float32, torch.float32), (torch.float16, torch.float32)):
        D = m.pairwise(torch.from_numpy(Q).to(dtype), torch.from_numpy(G).to(dtype))
        _expect(isinstance(D, torch.Tensor) and D.dtype == out,
                f"torch {dtype} in gave {type(D).__name__} {getattr(D, 'dtype', None)}, not torch {out}")
    d, i = m.search(torch.from_numpy(Q), torch.from_numpy(G), k=3)
    _expect(isinstance(d, torch.Tensor) and isinstance(i, torch.Tensor) and i.dtype == torch.int64,
            f"search on torch gave {type(d).__name__} distances and {type(i).__name__} "
            f"{getattr(i, 'dtype', None)} indices, not torch tensors with torch.int64 indices")
    d, i = m.search(Q, G, k=3)
    _expect(isinstance(i, np.ndarray) and i.dtype == np.int64,
            f"search on numpy gave {type(i).__name__} {getattr(i, 'dtype', None)} indices, not numpy int64")
    if torch.cuda.is_available():
        moved = copy.deepcopy(m).to("cuda")
        D = moved.pairwise(torch.from_numpy(Q).cuda(), torch.from_numpy(G).cuda())
        _expect(D.device.type == "cuda", f"pairwise of cuda tensors on a model moved to cuda gave {D.device}")
        _close(D.cpu().numpy(), ref, "pairwise on cuda", rtol=1e-6)


def check_low_temperature(factory, data) -> None:
    """τ = 1e-3 (logits up to 1000) gives finite divergences, in float32 and float64."""
    m = factory()
    if not m.tags().takes_temperature:
        raise NotApplicable(f"{type(m).__name__} takes no temperature (tags().takes_temperature is False)")
    m = _with_tau(m, 1e-3).fit(data["anchors"])
    for dtype in (np.float64, np.float32):
        D = m.pairwise(data["Q"].astype(dtype), data["G"].astype(dtype))
        _expect(np.isfinite(D).all(), f"τ = 1e-3 in {dtype.__name__} gave non-finite divergences")


def check_fit(factory, data) -> None:
    """fit returns self, is idempotent, and a clone from get_params fits to the same geometry."""
    m = factory()
    _expect(m.fit(data["anchors"]) is m, "fit must return self")
    first = m.pairwise(data["Q"], data["G"])
    m.fit(data["anchors"])
    _close(m.pairwise(data["Q"], data["G"]), first, "a second fit on the same anchors")
    clone = type(m)(**m.get_params()).fit(data["anchors"])
    _close(clone.pairwise(data["Q"], data["G"]), first, "a clone from get_params()")
    _expect(repr(m).startswith(type(m).__name__), f"repr {repr(m)!r} must start with the class name")


def check_index_round_trip(factory, data) -> None:
    """Index save/load keeps the model, and search through the index equals model.search."""
    from .index import Index

    m = _fitted(factory, data)
    _expect(model_name(type(m)) is not None,
            f"{type(m).__name__} is not registered: call ad.register_model(name, cls) "
            "so that indexes holding it can be saved and loaded")
    ref = m.search(data["Q"], data["G"], k=4)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "g.index")
        Index(m).add(data["G"]).save(path)
        loaded = Index.load(path)
    _expect(type(loaded.model) is type(m),
            f"Index.load gave a {type(loaded.model).__name__} model, not {type(m).__name__}")
    got = loaded.search(data["Q"], k=4)
    np.testing.assert_array_equal(got[1], ref[1], err_msg="ids after Index save/load")
    _close(got[0], ref[0], "distances after Index save/load")


def check_prior_round_trip(factory, data) -> None:
    """fit(target, prior=broad) gives prior_; a fitted prior and the broad set agree; save/load keeps it."""
    m = factory()
    if not m.tags().accepts_prior:
        raise NotApplicable(f"{type(m).__name__} takes no prior (tags().accepts_prior is False)")
    from .index import Index

    a = factory().fit(data["target"], prior=data["broad"])
    b = factory().fit(data["target"], prior=factory().fit(data["broad"]))
    _expect(getattr(a, "prior_", None) is not None, "a posterior fit keeps its prior in prior_")
    _close(a.pairwise(data["Q"], data["G"]), b.pairwise(data["Q"], data["G"]), "prior as a set vs as a fitted model")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "p.index")
        Index(a).add(data["G"]).save(path)
        loaded = Index.load(path).model
    _close(loaded.pairwise(data["Q"], data["G"]), a.pairwise(data["Q"], data["G"]), "posterior model after save/load")
    plain = factory().fit(data["anchors"])
    _expect(getattr(plain, "prior_", None) is None, "a plain fit has no prior_")


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
            _expect(name in msg and words in msg, f"error for a bad {name} ({words}) should say so: {msg!r}")
        else:
            raise AssertionError(f"a bad {name} ({words}) must raise ValueError")
    for k in (0, -1, 2.5, True):
        try:
            m.search(Q, G, k=k)
        except ValueError as exc:
            _expect("k" in str(exc), f"error for k={k!r} should name k: {str(exc)!r}")
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


def check_geometry(factory: Callable[[], Geometry], seed: int = 0, *,
                   raise_on_failure: bool = True) -> GeometryReport:
    """Run every check on the geometries ``factory`` builds and return the report: the checks
    passed, skipped (with the reason) and failed (with the error). With ``raise_on_failure``
    a failure raises ``AssertionError`` whose message is the report."""
    report = GeometryReport(tuple(check.result() for check in geometry_checks(factory, seed)))
    if raise_on_failure and not report.ok:
        first = next(r for r in report.results if r.outcome == "failed")
        raise AssertionError(f"{first.name}: {first.message}\n{report}") from first.error
    return report


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
    o, f = model.query_terms(Q64, symmetric)
    offsets, phi = np.abs(_float64(o)), np.linalg.norm(_float64(f), axis=1)
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


# ------------------------------------------------------------------ index backends
def _backend_data() -> dict[str, Any]:
    """A softmax and a Gaussian model (float64 anchors) with float32 queries and a float32 gallery
    without duplicates, under ids that are not row numbers."""
    from .models import make_model

    data = _data(seed=3)
    rng = np.random.default_rng(3)
    center = rng.normal(size=8) * 1.5
    G = _unit(rng.normal(size=(48, 8)) + center).astype(np.float32)
    Q = _unit(rng.normal(size=(6, 8)) + center).astype(np.float32)
    ids = rng.permutation(1000)[:48].astype(np.int64) * 3 + 7
    models = {name: make_model(name, tau=0.05).fit(data["anchors"]) for name in ("softmax", "gaussian")}
    return {"models": models, "G": G, "Q": Q, "ids": ids, "more": _unit(rng.normal(size=(8, 8)) + center)}


def _rows_of(found_ids: Any, stored_ids: np.ndarray) -> np.ndarray:
    """Rows (positions in ``stored_ids``) of returned ids; −1 stays −1, an id never stored is refused."""
    found = np.asarray(found_ids.cpu() if isinstance(found_ids, torch.Tensor) else found_ids).astype(np.int64)
    order = np.argsort(stored_ids)
    at = np.clip(np.searchsorted(stored_ids[order], found), 0, len(stored_ids) - 1)
    hit = stored_ids[order][at] == found
    if not (hit | (found == -1)).all():
        raise AssertionError(f"search returned ids that were never stored: {found[~hit & (found != -1)][:5].tolist()}")
    return np.where(hit, order[at], -1)


def _expect_error(kind: type, what: str, call: Callable[[], Any]) -> None:
    try:
        call()
    except kind:
        return
    except Exception as exc:  # noqa: BLE001 - the wrong kind of error is a failure too
        raise AssertionError(f"{what}: expected {kind.__name__}, got {type(exc).__name__}: {exc}") from exc
    raise AssertionError(f"{what}: expected {kind.__name__}, nothing was raised")


def _check_topk(model, Q, G, stored_ids, found, dist, what: str, **kwargs) -> None:
    rows = _rows_of(found, stored_ids)
    if rows.shape[0] != len(Q):
        raise AssertionError(f"{what}: {rows.shape[0]} result rows for {len(Q)} queries")
    try:
        assert_topk_up_to_rounding(model, Q, G, rows, dist, **kwargs)
    except AssertionError as exc:
        raise AssertionError(f"{what}: {exc}") from None


class _Open:
    """An index of the backend under test, closed on exit."""

    def __init__(self, backend: str, model: Geometry, params: dict):
        from .index import Index

        self.index = Index(model, backend, **params)

    def __enter__(self):
        return self.index

    def __exit__(self, *exc) -> None:
        self.index.close()


def check_backend_contract(backend: str, params: dict, data: dict) -> None:
    """The name is registered, the class implements the required methods and states its tags."""
    from .index import BackendTags, backend_class
    from .index._registry import missing_methods

    cls = backend_class(backend)
    if cls.name != backend:
        raise AssertionError(f"backend_class({backend!r}) is {cls.__qualname__}, whose name is {cls.name!r}")
    missing = missing_methods(cls)
    if missing:
        raise AssertionError(f"{cls.__qualname__} does not implement {', '.join(missing)}")
    if not isinstance(cls.tags(), BackendTags):
        raise AssertionError(f"{cls.__qualname__}.tags() must return a BackendTags, got {cls.tags()!r}")
    unknown = sorted(set(cls.RUNTIME) - set(cls.DEFAULTS))
    if unknown:
        raise AssertionError(f"{cls.__qualname__}.RUNTIME names parameters missing from DEFAULTS: {unknown}")


def check_backend_round_trip(backend: str, params: dict, data: dict) -> None:
    """add in two batches under user ids → search equals the float64 brute force up to float32 rounding,
    for a softmax (augmented keys) and a Gaussian (Euclidean keys) model; numpy in, numpy out."""
    G, Q, ids = data["G"], data["Q"], data["ids"]
    for name, model in data["models"].items():
        with _Open(backend, model, params) as index:
            index.add(G[:20], ids=ids[:20]).add(G[20:], ids=ids[20:])
            if len(index) != len(G) or not np.array_equal(index.ids, ids) or index.dim != G.shape[1]:
                raise AssertionError(f"{name}: after two adds the index holds {len(index)} ids of dimension "
                                     f"{index.dim}, not the {len(G)} ids added in order")
            for k in (1, 5, len(G)):
                dist, found = index.search(Q, k=k)
                if not (isinstance(dist, np.ndarray) and isinstance(found, np.ndarray)):
                    raise AssertionError(f"{name}: numpy queries must give numpy results, got {type(dist).__name__}")
                if found.shape != (len(Q), k) or found.dtype != np.int64 or dist.shape != (len(Q), k):
                    raise AssertionError(f"{name}, k={k}: results of shape {dist.shape}, {found.shape} "
                                         f"({found.dtype}), not ({len(Q)}, {k}) with int64 ids")
                if not (np.diff(dist, axis=1) >= 0).all():
                    raise AssertionError(f"{name}, k={k}: distances are not ascending")
                _check_topk(model, Q, G, ids, found, dist, f"{name}, k={k}")
            tdist, tfound = index.search(torch.from_numpy(Q), k=3)
            if not (isinstance(tdist, torch.Tensor) and isinstance(tfound, torch.Tensor)):
                raise AssertionError(f"{name}: torch queries must give torch results")


def check_backend_filters(backend: str, params: dict, data: dict) -> None:
    """An id allow-list and per-query excluded ids restrict the results as they restrict the brute force;
    a string filter is refused by a backend without ``expression_filters``."""
    G, Q, ids = data["G"], data["Q"], data["ids"]
    model = data["models"]["softmax"]
    rng = np.random.default_rng(5)
    allowed_rows = np.sort(rng.choice(len(G), size=12, replace=False))
    with _Open(backend, model, params) as index:
        index.add(G, ids=ids)
        allow = np.concatenate([ids[allowed_rows], [-5, 10 ** 9]])  # ids not stored are ignored
        dist, found = index.search(Q, k=4, filter=allow)
        _check_topk(model, Q, G, ids, found, dist, "filter (id allow-list)", allowed=allowed_rows)
        truth = np.asarray(model.pairwise(Q.astype(np.float64), G.astype(np.float64)))
        excluded_rows = np.argsort(truth, axis=1, kind="stable")[:, :2]
        excluded_rows[0, 1] = -1  # −1: nothing
        exclude = np.where(excluded_rows >= 0, ids[np.clip(excluded_rows, 0, None)], -1)
        dist, found = index.search(Q, k=5, exclude=exclude)
        _check_topk(model, Q, G, ids, found, dist, "exclude", exclude=excluded_rows)
        dist, found = index.search(Q, k=3, exclude=exclude, filter=allow)
        _check_topk(model, Q, G, ids, found, dist, "exclude with a filter", exclude=excluded_rows,
                    allowed=allowed_rows)
        if not index._backend.tags().expression_filters:
            _expect_error(ValueError, "a string filter on a backend without expression_filters",
                          lambda: index.search(Q, k=2, filter="id > 3"))


def check_backend_delete_upsert(backend: str, params: dict, data: dict) -> None:
    """delete and upsert leave what a brute force over the remaining and replaced vectors finds; the
    remaining ids keep their order and upserted ones follow."""
    G, Q, ids, more = data["G"], data["Q"], data["ids"], data["more"].astype(np.float32)
    model = data["models"]["softmax"]
    with _Open(backend, model, params) as index:
        index.add(G, ids=ids)
        gone = ids[[0, 5, 6, 30, 47]]
        index.delete(gone)
        keep = ~np.isin(ids, gone)
        if not np.array_equal(index.ids, ids[keep]):
            raise AssertionError("delete: the remaining ids changed order or content")
        dist, found = index.search(Q, k=6)
        _check_topk(model, Q, G[keep], ids[keep], found, dist, "after delete")
        replaced = ids[[1, 2, 40]]
        new_ids = np.concatenate([replaced, [10 ** 6, 10 ** 6 + 1, 10 ** 6 + 2, 10 ** 6 + 3, 10 ** 6 + 4]])
        index.upsert(more, ids=new_ids)
        still = keep & ~np.isin(ids, replaced)
        now_ids = np.concatenate([ids[still], new_ids])
        now_G = np.concatenate([G[still], more])
        if not np.array_equal(index.ids, now_ids):
            raise AssertionError("upsert: the ids are not the kept ones followed by the upserted ones")
        dist, found = index.search(Q, k=6)
        _check_topk(model, Q, now_G, now_ids, found, dist, "after upsert")
        index.upsert(more[:3], ids=new_ids[:3])  # repeated: still one row per id
        if len(index) != len(now_ids):
            raise AssertionError(f"a repeated upsert changed the size from {len(now_ids)} to {len(index)}")
        dist, found = index.search(Q, k=len(now_ids))
        if sorted(found[0].tolist()) != sorted(now_ids.tolist()):
            raise AssertionError("a search for every key does not return every stored id once")


def check_backend_save_load(backend: str, params: dict, data: dict) -> None:
    """save → load gives the same ids and results (up to rounding), and the loaded index takes adds."""
    from .index import Index

    G, Q, ids = data["G"], data["Q"], data["ids"]
    model = data["models"]["softmax"]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "backend.index")
        with _Open(backend, model, params) as index:
            index.add(G[:40], ids=ids[:40])
            before = index.search(Q, k=5)
            digest = index.save(path)
        loaded = Index.load(path)
        try:
            if loaded.backend != backend or loaded.file_digest != digest:
                raise AssertionError(f"the loaded index is a {loaded.backend!r} index with digest "
                                     f"{loaded.file_digest}, not the saved {backend!r} one ({digest})")
            if not np.array_equal(loaded.ids, ids[:40]):
                raise AssertionError("the loaded index has other ids than the saved one")
            dist, found = loaded.search(Q, k=5)
            _check_topk(model, Q, G[:40], ids[:40], found, dist, "after load")
            tol = float32_rounding(model, Q, G[:40])[:, None]
            if not (np.abs(np.asarray(dist, np.float64) - np.asarray(before[0], np.float64)) <= 2 * tol).all():
                raise AssertionError("the loaded index's distances differ from the saved index's beyond rounding")
            loaded.add(G[40:], ids=ids[40:])
            dist, found = loaded.search(Q, k=5)
            _check_topk(model, Q, G, ids, found, dist, "add after load")
        finally:
            loaded.close()


def check_backend_bad_input(backend: str, params: dict, data: dict) -> None:
    """Unknown parameters, wrong dimensions, duplicate or unknown ids, k too large, an empty index and
    metadata the backend cannot store raise ValueError."""
    from .index import Index

    G, Q, ids = data["G"], data["Q"], data["ids"]
    model = data["models"]["softmax"]
    _expect_error(ValueError, "an unknown backend parameter",
                  lambda: Index(model, backend, **params, no_such_parameter=1))
    with _Open(backend, model, params) as index:
        _expect_error(ValueError, "a search of an empty index", lambda: index.search(Q, k=1))
        index.add(G[:10], ids=ids[:10])
        _expect_error(ValueError, "vectors of another dimension", lambda: index.add(G[:2, :5], ids=[1, 2]))
        _expect_error(ValueError, "queries of another dimension", lambda: index.search(Q[:, :5], k=1))
        _expect_error(ValueError, "ids already stored", lambda: index.add(G[10:12], ids=ids[:2]))
        _expect_error(ValueError, "duplicate ids in one batch", lambda: index.add(G[10:12], ids=[5, 5]))
        _expect_error(ValueError, "k larger than the index", lambda: index.search(Q, k=11))
        _expect_error(ValueError, "k = 0", lambda: index.search(Q, k=0))
        _expect_error(ValueError, "deleting an id never stored", lambda: index.delete([-12345]))
        if not index._backend.tags().stores_metadata:
            _expect_error(ValueError, "metadata on a backend without stores_metadata",
                          lambda: index.add(G[10:11], ids=[10 ** 7], metadata={"label": ["a"]}))
        if len(index) != 10 or not np.array_equal(index.ids, ids[:10]):
            raise AssertionError("a refused call changed the index")
        dist, found = index.search(Q, k=3)
        _check_topk(model, Q, G[:10], ids[:10], found, dist, "after refused calls")


BACKEND_CHECKS = (check_backend_contract, check_backend_round_trip, check_backend_filters,
                  check_backend_delete_upsert, check_backend_save_load, check_backend_bad_input)


def backend_checks(backend: str, **params: Any) -> Iterator[Check]:
    """The checks of :func:`check_backend`, one :class:`Check` each (for ``pytest.mark.parametrize``)."""
    data: dict = {}

    def bind(check):
        def run() -> None:
            if not data:
                data.update(_backend_data())
            check(backend, dict(params), data)
        return run

    for check in BACKEND_CHECKS:
        yield Check(check.__name__.removeprefix("check_backend_"), bind(check))


def check_backend(backend: str, **params: Any) -> None:
    """Run every backend check on the registered backend ``backend`` with ``params``; raises
    ``AssertionError`` naming the first failure.

    Results are compared with a float64 brute force up to float32 rounding, so pass
    parameters that make an approximate backend exhaustive (faiss ``index_type="flat"``,
    milvus ``index_type="FLAT"``). Each check opens its indexes one after the other and
    closes them; a backend that names its store (milvus: ``collection_name``) needs
    ``overwrite=True`` so that each starts from an empty one::

        from anchordiv.testing import check_backend
        check_backend("my_backend")
        check_backend("milvus", uri="./check.db", collection_name="check", overwrite=True)
    """
    for check in backend_checks(backend, **params):
        try:
            check()
        except AssertionError as exc:
            raise AssertionError(f"check_backend({backend!r}) failed {check.name}: {exc}") from exc


__all__ += ["check_backend", "backend_checks", "BACKEND_CHECKS"]
