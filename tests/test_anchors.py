import numpy as np
import pytest
import torch

import anchordiv as ad


def test_weights_normalised_and_defaults(rng):
    E = rng.normal(size=(4, 3))
    A = ad.AnchorSet(E, texts=list("abcd"), weights=[1, 1, 2, 0])
    np.testing.assert_allclose(A.weights.numpy(), [0.25, 0.25, 0.5, 0.0])
    assert len(A) == 4 and A.dim == 3
    U = ad.AnchorSet(E)
    np.testing.assert_allclose(U.weights.numpy(), np.full(4, 0.25))
    assert len(A.support()) == 3 and A.support().texts == ["a", "b", "c"]


def test_normalized_rows_have_unit_norm(rng):
    A = ad.AnchorSet(rng.normal(size=(5, 3)) * 7).normalized()
    np.testing.assert_allclose(A.embeddings.norm(dim=1).numpy(), np.ones(5), rtol=1e-12)


def test_torch_input_kept_on_device_and_dtype():
    E = torch.randn(6, 4, dtype=torch.float64)
    A = ad.AnchorSet(E)
    assert A.embeddings.dtype == torch.float64 and A.device == E.device


def test_mixture_masses(rng):
    A = ad.AnchorSet(rng.normal(size=(3, 4)), weights=[1, 2, 1], texts=["a1", "a2", "a3"])
    B = ad.AnchorSet(rng.normal(size=(2, 4)), texts=["b1", "b2"])
    M = ad.AnchorSet.mixture([A, B], [0.7, 0.3])
    w = M.weights.numpy()
    np.testing.assert_allclose(w[:3], 0.7 * np.array([0.25, 0.5, 0.25]))
    np.testing.assert_allclose(w[3:], [0.15, 0.15])
    assert M.texts == ["a1", "a2", "a3", "b1", "b2"]
    # proportions are normalised
    M2 = ad.AnchorSet.mixture([A, B], [7, 3])
    np.testing.assert_allclose(M2.weights.numpy(), w)


def test_subsample_reproducible(rng):
    A = ad.AnchorSet(rng.normal(size=(50, 3)), texts=[str(i) for i in range(50)])
    s1, s2, s3 = A.subsample(10, seed=1), A.subsample(10, seed=1), A.subsample(10, seed=2)
    assert s1.texts == s2.texts and s1.texts != s3.texts
    assert len(set(s1.texts)) == 10
    for t, row in zip(s1.texts, s1.embeddings):
        assert torch.equal(row, A.embeddings[int(t)])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(embeddings=np.array([[np.nan, 1.0]])), "NaN"),
        (dict(embeddings=np.array([[np.inf, 1.0]])), "NaN or inf"),
        (dict(embeddings=np.ones(3)), "2-D"),
        (dict(embeddings=np.ones((0, 3))), "empty"),
        (dict(embeddings=np.ones((2, 3)), weights=[1, -1]), "non-negative"),
        (dict(embeddings=np.ones((2, 3)), weights=[0, 0]), "all zero"),
        (dict(embeddings=np.ones((2, 3)), weights=[1, 1, 1]), "weights has 3"),
        (dict(embeddings=np.ones((2, 3)), texts=["a"]), "texts has 1"),
    ],
)
def test_bad_anchor_sets(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ad.AnchorSet(**kwargs)


def test_bad_mixture_and_subsample(rng):
    A = ad.AnchorSet(rng.normal(size=(3, 4)))
    B = ad.AnchorSet(rng.normal(size=(3, 5)))
    with pytest.raises(ValueError, match="same dimension"):
        ad.AnchorSet.mixture([A, B], [0.5, 0.5])
    with pytest.raises(ValueError, match="one entry per set"):
        ad.AnchorSet.mixture([A, A], [1.0])
    with pytest.raises(ValueError, match="all zero"):
        ad.AnchorSet.mixture([A, A], [0, 0])
    with pytest.raises(ValueError, match="exceeds"):
        A.subsample(4)
    with pytest.raises(ValueError, match="all-zero row"):
        ad.AnchorSet(np.zeros((2, 3))).normalized()


class _LetterEncoder:
    """A text encoder for the test: each text's letter counts (a–z), normalised."""

    def encode_text(self, texts):
        out = np.zeros((len(texts), 26), dtype=np.float32)
        for i, t in enumerate(texts):
            for ch in t.lower():
                if "a" <= ch <= "z":
                    out[i, ord(ch) - 97] += 1
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def test_from_texts_embeds_written_anchors():
    enc = _LetterEncoder()
    A = ad.AnchorSet.from_texts([" a husky ", "a beagle"], enc, weights=[3, 1])
    assert A.texts == ["a husky", "a beagle"] and A.dim == 26
    assert np.allclose(A.embeddings.numpy(), enc.encode_text(["a husky", "a beagle"]))
    assert np.allclose(A.weights.numpy(), [0.75, 0.25])
    model = ad.Softmax(tau=0.1).fit(A)
    assert model.anchor_texts_ == ["a husky", "a beagle"]


@pytest.mark.parametrize("texts,match", [
    ("a husky", "must be a list"),
    ([], "empty"),
    (["a husky", " "], r"texts\[1\] is ' '"),
    (["a husky", 3], r"texts\[1\] is 3"),
    (["a husky", "a husky "], r"texts\[1\] repeats texts\[0\]"),
])
def test_from_texts_refuses_bad_texts(texts, match):
    with pytest.raises(ValueError, match=match):
        ad.AnchorSet.from_texts(texts, _LetterEncoder())


def test_from_texts_needs_an_encoder():
    with pytest.raises(ValueError, match="encode_text"):
        ad.AnchorSet.from_texts(["a husky"], object())
    with pytest.raises(ValueError, match="one weight per anchor"):
        ad.AnchorSet.from_texts(["a husky", "a beagle"], _LetterEncoder(), weights=[1])
