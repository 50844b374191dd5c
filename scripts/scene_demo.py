"""Every protocol on the demo's compositional scene collection (``anchordiv.apps.demo``).

The collection: generated one-sentence scenes in which a dog breed, a place and a piece
of clothing vary independently (:func:`anchordiv.apps.demo.make_scene_collection`). Anchor
sets: three prompts per value of each factor (:func:`anchordiv.apps.demo.scene_anchor_sets`
with design ``prompts3``, 18 phrases per factor), plus, for ``adaptation``, a broad set
of generic dog and scene phrases written here that never names the six breeds, places
or garments of the collection.

Usage::

    .venv/bin/python scripts/scene_demo.py            # all protocols, about 10 minutes on 2 cores
    .venv/bin/python scripts/scene_demo.py --only coordinate table

Writes ``docs/results/scene_demo/<protocol>/`` and ``docs/results/scene_demo/run.json``.
"""

from __future__ import annotations

import sys

import _common as C

#: Broad anchors for adaptation: dogs, places and clothing in general (none of the collection's values).
BROAD = {
    "dogs": [
        "a labrador retriever", "a german shepherd", "a golden retriever", "a border collie", "a rottweiler",
        "a chihuahua", "a great dane", "a greyhound", "a shih tzu", "a boxer dog", "a bulldog", "a doberman",
        "a schnauzer", "a bernese mountain dog", "a shiba inu", "a cocker spaniel", "a jack russell terrier",
        "a basset hound", "a saint bernard", "a whippet", "a mixed-breed dog", "a puppy", "an old dog",
        "a dog of a particular breed", "a small dog breed", "a large dog breed", "a herding dog", "a hunting dog",
        "a toy dog", "a fluffy dog",
    ],
    "scenes": [
        "in a garden", "by a lake", "in the desert", "on a farm", "in a living room", "on a bridge",
        "in the snow", "at a campsite", "in a parking lot", "on a boat", "in a backyard", "at the vet",
        "in a meadow", "on a country road", "in a shop", "a dog outdoors", "a dog indoors", "a dog outside in nature",
        "a dog in town", "a dog at home",
    ],
    "clothing": [
        "wearing a collar", "wearing a harness", "wearing a jacket", "wearing a scarf", "wearing sunglasses",
        "wearing a costume", "wearing a cap", "wearing a vest", "wearing socks", "wearing a leash",
        "a dog dressed up", "a dog in an outfit", "a dog without clothes", "a pet in a costume",
        "a pet wearing accessories",
    ],
    "activities": [
        "a dog running", "a dog sleeping", "a dog playing fetch", "a dog eating", "a dog barking",
        "a dog sitting still", "a dog walking on a leash", "a dog swimming", "a dog jumping", "a dog lying down",
    ],
}


def main(argv: list[str] | None = None) -> int:
    p = C.parser(__doc__.split("\n\n")[0], "scene_demo")
    p.add_argument("--n", type=int, default=480, help="scenes in the collection (default: 480)")
    args = p.parse_args(argv)
    C.setup(args.threads)

    from anchordiv import experiments as ex
    from anchordiv.apps.demo import ANCHOR_FACTORS, make_scene_collection, scene_anchor_sets

    enc = C.load_encoder(args.encoder)
    texts, labels = make_scene_collection(args.n, seed=args.seed)
    folder = args.data / "scene_demo"
    coll = C.collection(folder / "collection", texts, {f: labels[f].tolist() for f in ("breed", "place", "clothing")},
                        enc)
    sets = scene_anchor_sets("prompts3")
    yaml_path = C.anchors_file(folder / "anchors.yaml", sets)
    broad_path = C.anchors_file(folder / "broad.yaml", {"broad": [t for ts in BROAD.values() for t in ts]})
    A = C.anchor_sets(yaml_path, enc)
    broad = C.anchor_sets(broad_path, enc)["broad"]
    data = ex.EvalData.from_collection(coll, factors=["breed", "place", "clothing"], name="scene demo")
    tau = enc.tau
    log = C.RunLog(args.out, "scene_demo", sys.argv)
    run = set(args.only or ex.PROTOCOLS)
    coll_dir, yml, byml = folder / "collection", yaml_path, broad_path
    common = {"tau": tau, "seed": args.seed, "progress": False}
    para = ["softmax", "gaussian", "gmm", "latent_gaussian", "latent_spherical"]

    if "coordinate" in run:
        res = ex.coordinate(data, A["breeds"], A["places"], "breed", "place", models=para,
                            proportions=[0, 0.1, 0.25, 0.5, 0.75, 0.9, 1], n_draws=5, anchor_fraction=0.8,
                            names=("breeds", "places"), out_dir=args.out / "coordinate", **common)
        log.add("coordinate", res, f"anchordiv eval coordinate {coll_dir} --anchors {yml}:breeds --anchors "
                                   f"{yml}:places --factor breed --factor place --model {','.join(para)} "
                                   "--proportions 0,0.1,0.25,0.5,0.75,0.9,1 --draws 5 --anchor-fraction 0.8 "
                                   f"--out {args.out / 'coordinate'}")
    if "budget" in run:
        res = ex.budget(data, A["breeds"], "breed", budgets=[1, 2, 4, 8, 12, 18], n_draws=5, name="breeds",
                        out_dir=args.out / "budget", **common)
        log.add("budget", res, f"anchordiv eval budget {coll_dir} --anchors {yml}:breeds --factor breed "
                               f"--budgets 1,2,4,8,12,18 --draws 5 --out {args.out / 'budget'}")
    if "adaptation" in run:
        mp = {"latent_gaussian": {"rank": 16}, "latent_spherical": {"rank": 16}, "gmm": {"n_components": 4}}
        res = ex.adaptation(data, broad, A["breeds"], "breed", budgets=[1, 2, 3, 6, 12, 18], n_draws=5,
                            model_params=mp, names=("generic dog/scene phrases", "breeds"),
                            out_dir=args.out / "adaptation", **common)
        log.add("adaptation", res, f"anchordiv eval adaptation {coll_dir} --broad {byml} --anchors {yml}:breeds "
                                   "--factor breed --budgets 1,2,3,6,12,18 --draws 5 --rank 16 --components 4 "
                                   f"--out {args.out / 'adaptation'}")
    if "components" in run:
        entries = [(name, A[name], ANCHOR_FACTORS[name]) for name in ("breeds", "places", "clothing")]
        res = ex.components(data, entries, n_components=[1, 2, 3, 6, 12], n_draws=3,
                            out_dir=args.out / "components", **common)
        log.add("components", res, f"anchordiv eval components {coll_dir} --anchors {yml}:breeds --factor breed "
                                   f"--anchors {yml}:places --factor place --anchors {yml}:clothing --factor clothing "
                                   f"--components 1,2,3,6,12 --draws 3 --out {args.out / 'components'}")
    if "table" in run:
        entries = [(name, A[name], ANCHOR_FACTORS[name]) for name in ("breeds", "places", "clothing")]
        models = ["softmax", "gaussian", "latent_gaussian", "latent_spherical"]
        res = ex.table(data, entries, models=models, per_value=True, n_draws=5, anchor_fraction=0.8,
                       out_dir=args.out / "table", **common)
        log.add("table", res, f"anchordiv eval table {coll_dir} --anchors {yml}:breeds --factor breed --anchors "
                              f"{yml}:places --factor place --anchors {yml}:clothing --factor clothing "
                              f"--model {','.join(models)} --per-value --draws 5 --anchor-fraction 0.8 "
                              f"--out {args.out / 'table'}")
    if "runtime" in run:
        res = ex.runtime(n_anchors=[256, 1024, 4096, 8192], n_queries=500, n_gallery=5000, repeats=2,
                         out_dir=args.out / "runtime", progress=False)
        log.add("runtime", res, "anchordiv eval runtime --n-anchors 256,1024,4096,8192 --queries 500 --gallery 5000 "
                                f"--repeats 2 --out {args.out / 'runtime'}")
    log.write(encoder=enc.name, tau=tau, n_items=len(texts), data=str(folder),
              anchors={k: len(v) for k, v in A.items()}, broad=len(broad))
    return 0


if __name__ == "__main__":
    sys.exit(main())
