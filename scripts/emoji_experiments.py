"""The paper's object x style experiments (Figures 3 and 8, Tables 2 and 3) on emoji pictures.

Data: the held-out emoji of ``anchordiv.apps.emoji`` (objects never seen in training, 20 % of
the names, each drawn by Google and by Twitter), as an image folder
``<data>/emoji/held_out/<short_name>/<vendor>.png`` (links into the npm cache), embedded
with the committed emoji CLIP (``anchordiv.apps.emoji.CLIP_SPEC``) by
``anchordiv.io.embed_collection`` (what ``anchordiv embed`` runs) with the labels
``object`` (the emoji name) and ``style`` (the vendor).

Anchor sets (``anchors.yaml``):

* ``objects``: ``a {name} emoji`` for every held-out emoji;
* ``styles``: the style captions of each vendor (``an emoji in {vendor} style``, ...).

Protocols: ``coordinate`` (p·objects + (1 − p)·styles, p from style to object),
``budget`` (object and style anchors), ``table`` (object and style as factors, against
cosine and ITI).

Usage::

    .venv/bin/python scripts/emoji_experiments.py     # npm cache from python -m anchordiv.apps.emoji
"""

from __future__ import annotations

import os
import sys

import _common as C


def build_folder(folder, pictures):
    """``folder/<short_name>/<vendor>.png`` links to the pictures; returns paths and labels."""
    paths, labels = [], {"object": [], "style": []}
    for e in pictures:
        target = folder / e.short_name / f"{e.vendor}.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.is_symlink() or os.readlink(target) != str(e.path):
            if target.is_symlink() or target.exists():
                target.unlink()
            target.symlink_to(e.path)
        paths.append(str(target))
        labels["object"].append(e.name)
        labels["style"].append(e.vendor)
    return paths, labels


def main(argv: list[str] | None = None) -> int:
    p = C.parser(__doc__.split("\n\n")[0], "emoji")
    p.set_defaults(encoder=None)
    args = p.parse_args(argv)
    C.setup(args.threads)

    from anchordiv.apps import emoji
    from anchordiv import experiments as ex
    from anchordiv.io import embed_collection, load_collection

    folder = args.data / "emoji"
    pictures = [e for e in emoji.load(emoji.fetch()) if emoji.is_held_out(e.name)]
    names = sorted({e.name for e in pictures})
    spec = args.encoder or emoji.CLIP_SPEC
    enc = C.load_encoder(spec)
    paths, labels = build_folder(folder / "held_out", pictures)
    cdir = folder / "collection"
    if not (cdir / "collection.json").is_file():
        embed_collection(paths, enc, cdir, kind="image", labels=labels, progress=False)
    coll = load_collection(cdir)
    sets = {"objects": [emoji.object_anchor(n) for n in names],
            "styles": [t.format(style=v) for v in emoji.VENDORS for t in emoji.STYLE_TEMPLATES]}
    yml = C.anchors_file(folder / "anchors.yaml", sets)
    A = C.anchor_sets(yml, enc)
    data = ex.EvalData.from_collection(coll, factors=["object", "style"], name="held-out emoji pictures")
    tau = enc.tau
    log = C.RunLog(args.out, "emoji", sys.argv)
    run = set(args.only or ["coordinate", "budget", "table"])
    common = {"tau": tau, "seed": args.seed, "progress": False}
    para = ["softmax", "gaussian", "latent_gaussian"]

    if "coordinate" in run:
        res = ex.coordinate(data, A["objects"], A["styles"], "object", "style", models=para,
                            proportions=[0, 0.1, 0.25, 0.5, 0.75, 0.9, 1], n_draws=5, anchor_fraction=0.8,
                            names=("objects", "styles"), out_dir=args.out / "coordinate", **common)
        log.add("coordinate", res, f"anchordiv eval coordinate {cdir} --anchors {yml}:objects --anchors {yml}:styles "
                                   f"--factor object --factor style --model {','.join(para)} "
                                   "--proportions 0,0.1,0.25,0.5,0.75,0.9,1 --draws 5 --anchor-fraction 0.8 "
                                   f"--out {args.out / 'coordinate'}")
    if "budget" in run:
        n = len(A["objects"])
        budgets = sorted({b for b in (1, 4, 16, 64, 256) if b < n} | {n})
        res = ex.budget(data, A["objects"], "object", budgets=budgets, n_draws=5, name="object names",
                        out_dir=args.out / "budget", **common)
        log.add("budget", res, f"anchordiv eval budget {cdir} --anchors {yml}:objects --factor object "
                               f"--budgets {','.join(map(str, budgets))} --draws 5 --out {args.out / 'budget'}")
        n = len(A["styles"])
        budgets = sorted({1, 2, 4, n})
        res = ex.budget(data, A["styles"], "style", budgets=budgets, n_draws=5, name="style phrases",
                        out_dir=args.out / "budget_style", **common)
        log.add("budget_style", res, f"anchordiv eval budget {cdir} --anchors {yml}:styles --factor style "
                                     f"--budgets {','.join(map(str, budgets))} --draws 5 "
                                     f"--out {args.out / 'budget_style'}")
    if "table" in run:
        entries = [("objects", A["objects"], "object"), ("styles", A["styles"], "style")]
        res = ex.table(data, entries, models=para, n_draws=1, out_dir=args.out / "table", **common)
        log.add("table", res, f"anchordiv eval table {cdir} --anchors {yml}:objects --factor object --anchors "
                              f"{yml}:styles --factor style --model {','.join(para)} --out {args.out / 'table'}")
    log.write(encoder=C.portable(spec), tau=tau, n_items=len(coll), n_emoji=len(names), styles=list(emoji.VENDORS),
              data=str(folder), anchors={k: len(v) for k, v in A.items()},
              source={v: f"{pkg}@{ver} ({lic})" for v, (pkg, ver, _, lic) in emoji.PACKAGES.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
