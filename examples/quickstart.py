"""Fit every anchor model on random unit vectors and print a table of divergences.

Run: python examples/quickstart.py
"""

import numpy as np

import anchordiv as ad


def unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def main(seed: int = 0, d: int = 64, n_anchors: int = 500, tau: float = 0.01) -> None:
    rng = np.random.default_rng(seed)
    cone = rng.normal(size=d) * 2  # CLIP-like embeddings share a dominant direction
    anchors = ad.AnchorSet(unit(rng.normal(size=(n_anchors, d)) + cone))
    queries = unit(rng.normal(size=(3, d)) + cone)
    gallery = unit(rng.normal(size=(4, d)) + cone)

    geometries = {
        "cosine": ad.Cosine(),
        "iti": ad.ImageTextInversion(),
        "softmax": ad.Softmax(tau=tau),
        "gaussian": ad.Gaussian(tau=tau),
        "gmm": ad.GaussianMixture(n_components=4, tau=tau),
        "latent_gaussian": ad.LatentGaussian(rank=0.95, tau=tau),
        "latent_spherical": ad.LatentSpherical(rank=0.95, tau=tau),
    }
    print(f"{n_anchors} anchors, d={d}, tau={tau}: symmetrized divergence of query 0 to 4 gallery items\n")
    print(f"{'model':<18}" + "".join(f"{'g' + str(j):>12}" for j in range(len(gallery))) + f"{'nearest':>10}")
    for name, model in geometries.items():
        model.fit(anchors)
        row = model.pairwise(queries[:1], gallery)[0]
        print(f"{name:<18}" + "".join(f"{v:12.4f}" for v in row) + f"{'g' + str(int(row.argmin())):>10}")


if __name__ == "__main__":
    main()
