"""WordNet as broad anchors: posterior adaptation toward class-name anchors (paper §5.4, Fig. 5).

Data: the WordNet 3.0 noun database of the Debian package ``wordnet-base``
(``apt-get install -y wordnet-base``), read directly from ``/usr/share/wordnet/data.noun``:
each line holds a synset offset, its lemmas, its pointers (``@`` / ``@i`` hypernym,
``~`` / ``~i`` hyponym) and a gloss after ``|``.

Task (text retrieval standing in for ImageNet images and their WordNet classes):

* root: ``animal.n.01`` (offset 00015388; ``--root`` changes it);
* classes: disjoint subtrees below the root with 20 to 120 hyponyms, chosen greedily
  from the largest, the ``--classes`` largest kept (e.g. *equine*, *snake*, *primate*,
  *hunting dog*, *beetle*);
* items: the glosses of up to ``--per-class`` hyponyms of each class (quoted usage
  examples removed), labelled by their class; every item is a query against all others;
* target anchors: the class names, ``"{lemma}"`` (first lemma of the class synset);
* broad anchors: the first lemmas of every other synset below the root (neither an item
  synset nor a class synset), ``--broad`` of them drawn at random; with ``--broad-root``
  they are drawn below another synset instead (``00001740``, entity.n.01: all nouns).

The adaptation protocol compares posterior Gaussian, GMM, latent Gaussian and latent
spherical models (broad → target; latent rank k = 128 as in App. E.5) with the same
models fitted on the target anchors alone, softmax and cosine, over target budgets.

Usage::

    apt-get update && apt-get install -y wordnet-base
    .venv/bin/python scripts/wordnet_adaptation.py     # about 2 minutes on 2 cores
    .venv/bin/python scripts/wordnet_adaptation.py --broad-root 00001740 \
        --out docs/results/wordnet_adaptation_all_nouns  # broad anchors from all of WordNet
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import _common as C

DATA_NOUN = Path("/usr/share/wordnet/data.noun")


def parse_nouns(path: Path = DATA_NOUN) -> dict:
    """offset → (lemmas, gloss, hypernyms, hyponyms) for every noun synset of ``data.noun``."""
    if not path.is_file():
        raise SystemExit(f"{path} not found; install it with: apt-get update && apt-get install -y wordnet-base")
    out = {}
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if line.startswith("  "):  # licence header
                continue
            data, _, gloss = line.partition(" | ")
            f = data.split()
            n_words = int(f[3], 16)
            lemmas = [re.sub(r"\(\w+\)$", "", f[4 + 2 * i]).replace("_", " ") for i in range(n_words)]
            i = 4 + 2 * n_words
            n_ptr = int(f[i])
            i += 1
            hyper, hypo = [], []
            for _ in range(n_ptr):
                sym, off, pos = f[i], f[i + 1], f[i + 2]
                i += 4
                if pos != "n":
                    continue
                if sym in ("@", "@i"):
                    hyper.append(off)
                elif sym in ("~", "~i"):
                    hypo.append(off)
            out[f[0]] = (lemmas, gloss.strip(), hyper, hypo)
    return out


def descendants(syn: dict, root: str) -> set:
    out, stack = set(), [root]
    while stack:
        for h in syn[stack.pop()][3]:
            if h not in out:
                out.add(h)
                stack.append(h)
    return out


def clean_gloss(gloss: str) -> str:
    """The definition part of a gloss (quoted usage examples dropped)."""
    parts = [p.strip() for p in gloss.split(";")]
    keep = [p for p in parts if p and not p.startswith('"')]
    return "; ".join(keep) or gloss.strip()


def build(syn: dict, root: str, n_classes: int, per_class: int, n_broad: int, seed: int,
          broad_root: str | None = None, lo: int = 20, hi: int = 120):
    import numpy as np

    rng = np.random.default_rng(seed)
    below = descendants(syn, root)
    sizes = {o: len(descendants(syn, o)) for o in below}
    cands = sorted((o for o in below if lo <= sizes[o] <= hi), key=lambda o: (-sizes[o], o))
    chosen, used = [], set()
    for o in cands:
        sub = descendants(syn, o) | {o}
        if sub & used:
            continue
        chosen.append(o)
        used |= sub
    if len(chosen) < n_classes:
        raise SystemExit(f"only {len(chosen)} classes below {root}")
    classes = chosen[:n_classes]
    texts, labels, item_syn = [], [], set()
    for c in classes:
        members = sorted(descendants(syn, c))
        pick = sorted(rng.choice(len(members), size=min(per_class, len(members)), replace=False))
        for j in pick:
            o = members[j]
            texts.append(clean_gloss(syn[o][1]))
            labels.append(syn[c][0][0])
            item_syn.add(o)
    target = [syn[c][0][0] for c in classes]
    excluded = item_syn | set(classes) | {root}
    broad_below = below if broad_root in (None, root) else descendants(syn, broad_root)
    pool = sorted({syn[o][0][0] for o in broad_below - excluded} - set(target))
    broad = sorted(rng.choice(pool, size=min(n_broad, len(pool)), replace=False).tolist())
    info = {"root": f"{root} ({syn[root][0][0]})", "n_below_root": len(below),
            "broad_root": f"{broad_root or root} ({syn[broad_root or root][0][0]})",
            "classes": {syn[c][0][0]: sizes[c] for c in classes}, "broad_pool": len(pool)}
    return texts, labels, target, broad, info


def main(argv: list[str] | None = None) -> int:
    p = C.parser(__doc__.split("\n\n")[0], "wordnet_adaptation")
    p.add_argument("--root", default="00015388", help="root synset offset (default: 00015388, animal.n.01)")
    p.add_argument("--classes", type=int, default=40, help="classes (default: 40)")
    p.add_argument("--per-class", type=int, default=20, help="items per class (default: 20)")
    p.add_argument("--broad", type=int, default=3000, help="broad anchors (default: 3000)")
    p.add_argument("--broad-root", default=None,
                   help="draw the broad lemmas below this synset instead (e.g. 00001740, entity.n.01: all nouns)")
    p.add_argument("--gmm-components", type=int, default=8, help="GMM components (default: 8)")
    p.add_argument("--rank", type=int, default=128, help="latent rank k (default: 128, App. E.5)")
    p.add_argument("--draws", type=int, default=5, help="target draws per budget (default: 5)")
    args = p.parse_args(argv)
    C.setup(args.threads)

    from anchordiv import experiments as ex

    syn = parse_nouns()
    texts, labels, target, broad, info = build(syn, args.root, args.classes, args.per_class, args.broad, args.seed,
                                               args.broad_root)
    enc = C.load_encoder(args.encoder)
    folder = args.data / ("wordnet_adaptation" + (f"_{args.broad_root}" if args.broad_root else ""))
    coll = C.collection(folder / "collection", texts, {"cls": labels}, enc)
    yml = C.anchors_file(folder / "anchors.yaml", {"target": target, "broad": broad})
    A = C.anchor_sets(yml, enc)
    data = ex.EvalData.from_collection(coll, factors=["cls"], name="WordNet animal glosses")
    log = C.RunLog(args.out, "wordnet_adaptation", sys.argv)
    n = len(target)
    budgets = sorted({b for b in (1, 2, 4, 8, 16) if b < n} | {n})
    mp = {"gmm": {"n_components": args.gmm_components}, "latent_gaussian": {"rank": args.rank},
          "latent_spherical": {"rank": args.rank}}
    broad_name = f"WordNet lemmas below {info['broad_root']}"
    res = ex.adaptation(data, A["broad"], A["target"], "cls", budgets=budgets, n_draws=args.draws,
                        model_params=mp, names=(broad_name, "class names"),
                        out_dir=args.out / "adaptation", tau=enc.tau, seed=args.seed, progress=False)
    log.add("adaptation", res, f"anchordiv eval adaptation {folder / 'collection'} --broad {yml}:broad "
                               f"--anchors {yml}:target --factor cls --budgets {','.join(map(str, budgets))} "
                               f"--draws {args.draws} --rank {args.rank} --components {args.gmm_components} "
                               f"--out {args.out / 'adaptation'}")
    log.write(encoder=enc.name, tau=enc.tau, n_items=len(texts), n_target=n, n_broad=len(broad), data=str(folder),
              **info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
