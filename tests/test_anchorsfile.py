"""Anchors files: plain text and YAML formats, mixture specs, and the embeddings cache."""

import hashlib
import os

import numpy as np
import pytest
import torch

from anchordiv.anchors import AnchorSet
from anchordiv.anchorsfile import (
    cache_path,
    embed_anchors,
    encoder_slug,
    load_anchor_texts,
    parse_anchor_spec,
    read_anchors_file,
    resolve_anchor_spec,
    resolve_anchors,
)

YAML = """\
# two sets
object:
  names: [cat, dog, car]
  template: ["a photo of a {}", "a drawing of a {}"]
  weights: [2, 1, 1]
  mix: 3
style:
  - a watercolor painting
  - a pencil sketch
"""


class FakeEncoder:
    """Deterministic unit vectors from a hash of each text; counts the texts it embeds."""

    def __init__(self, name="fake", dim=8, tau=0.02):
        self.name, self.dim, self.tau = name, dim, tau
        self.calls = []

    def encode_text(self, texts):
        self.calls.append(list(texts))
        rows = []
        for t in texts:
            seed = int.from_bytes(hashlib.sha256(t.encode()).digest()[:8], "little")
            v = np.random.default_rng(seed).normal(size=self.dim)
            rows.append(v / np.linalg.norm(v))
        return np.asarray(rows, dtype=np.float32)


@pytest.fixture
def yaml_file(tmp_path):
    p = tmp_path / "anchors.yaml"
    p.write_text(YAML)
    return p


def test_plain_text_skips_blank_lines_and_comments(tmp_path):
    p = tmp_path / "styles.txt"
    p.write_text("# styles\n\na watercolor painting\n  a pencil sketch  \n# end\n")
    sets = load_anchor_texts(p)
    assert list(sets) == ["styles"]
    texts, weights = sets["styles"]
    assert texts == ["a watercolor painting", "a pencil sketch"]
    assert weights is None


def test_yaml_names_templates_weights_and_mix(yaml_file):
    parsed = read_anchors_file(yaml_file)
    assert list(parsed.sets) == ["object", "style"]
    obj = parsed.sets["object"]
    assert obj.texts == ["a photo of a cat", "a drawing of a cat", "a photo of a dog",
                         "a drawing of a dog", "a photo of a car", "a drawing of a car"]
    # per-name weights are spread evenly over the templates
    assert obj.weights == [1.0, 1.0, 0.5, 0.5, 0.5, 0.5]
    assert parsed.sets["style"] == (["a watercolor painting", "a pencil sketch"], None)
    assert parsed.mix == {"object": 3.0, "style": 1.0}


def test_yaml_phrases_with_per_phrase_weights_and_top_level_list(tmp_path):
    p = tmp_path / "a.yml"
    p.write_text("s:\n  phrases: [x, y, z]\n  weights: [0, 1, 3]\nt:\n  names: [a, b]\n  template: 'the {}'\n"
                 "  weights: [1, 2]\n")
    sets = load_anchor_texts(p)
    assert sets["s"] == (["x", "y", "z"], [0.0, 1.0, 3.0])
    assert sets["t"] == (["the a", "the b"], [1.0, 2.0])
    q = tmp_path / "plain_list.yaml"
    q.write_text("- one\n- two\n")
    assert load_anchor_texts(q) == {"plain_list": (["one", "two"], None)}


@pytest.mark.parametrize("name, content, match", [
    ("empty.txt", "# nothing\n\n", "holds no anchors"),
    ("empty.yaml", "", "is empty"),
    ("emptyset.yaml", "a: []\n", "is empty"),
    ("notmpl.yaml", "a:\n  names: [x]\n  template: 'no placeholder'\n", "placeholder"),
    ("wlen.yaml", "a:\n  phrases: [x, y]\n  weights: [1]\n", "weights has 1 entries"),
    ("wneg.yaml", "a:\n  phrases: [x, y]\n  weights: [1, -2]\n", ">= 0"),
    ("wzero.yaml", "a:\n  phrases: [x]\n  weights: [0]\n", "all zero"),
    ("key.yaml", "a:\n  phrases: [x]\n  colour: red\n", "unknown key 'colour'"),
    ("both.yaml", "a:\n  phrases: [x]\n  names: [y]\n  template: '{}'\n", "exactly one of"),
    ("bad.yaml", "a: [x\n", "not valid YAML"),
    ("badname.yaml", "' a': [x]\n", "set name ' a'"),
    ("scalar.yaml", "just a string\n", "mapping of set name"),
])
def test_malformed_files_raise_clear_errors(tmp_path, name, content, match):
    p = tmp_path / name
    p.write_text(content)
    with pytest.raises(ValueError, match=match) as info:
        load_anchor_texts(p)
    assert str(p) in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_anchor_texts(tmp_path / "nope.txt")


def test_parse_anchor_spec(yaml_file, tmp_path):
    assert parse_anchor_spec(str(yaml_file)) == (yaml_file, None)
    assert parse_anchor_spec(f"{yaml_file}:style") == (yaml_file, [("style", None)])
    assert parse_anchor_spec(f"{yaml_file}:object:0.7, style:0.3") == (
        yaml_file, [("object", 0.7), ("style", 0.3)])
    odd = tmp_path / "my:anchors.txt"  # a path holding ':' still works
    odd.write_text("x\n")
    assert parse_anchor_spec(f"{odd}:my_anchors") == (odd, [("my_anchors", None)])
    with pytest.raises(FileNotFoundError, match="--anchors: anchors file"):
        parse_anchor_spec(f"{tmp_path}/missing.yaml:object", arg="--anchors")
    with pytest.raises(ValueError, match="bad proportion 'lots'"):
        parse_anchor_spec(f"{yaml_file}:object:lots")
    for bad in ("inf", "nan", "1e999"):
        with pytest.raises(ValueError, match=f"bad proportion '{bad}'.*finite"):
            parse_anchor_spec(f"{yaml_file}:object:{bad},style:0.3")
    with pytest.raises(ValueError, match="empty set selection"):
        parse_anchor_spec(f"{yaml_file}:")


def test_set_names_with_spaces_and_labels(tmp_path):
    p = tmp_path / "findings.yaml"
    p.write_text("'pleural effusion': [fluid in the pleural space]\n'big heart': [x]\n")
    assert list(read_anchors_file(p).sets) == ["pleural effusion", "big heart"]
    assert parse_anchor_spec(f"{p}:pleural effusion:0.3,big heart") == (
        p, [("pleural effusion", 0.3), ("big heart", None)])
    labels = {}
    assert parse_anchor_spec(f"{p}:pleural effusion=Effusion", labels=labels) == (p, [("pleural effusion", None)])
    assert labels == {"pleural effusion": "Effusion"}
    # a label may hold the spec characters, escaped
    labels = {}
    parse_anchor_spec(f"{p}:big heart=Cardio\\:megaly\\,x", labels=labels)
    assert labels == {"big heart": "Cardio:megaly,x"}
    with pytest.raises(ValueError, match="missing label"):
        parse_anchor_spec(f"{p}:x=", labels={})


@pytest.mark.parametrize("key, bad", [('"a,b"', ","), ('"a:b"', ":"), ('"x=y"', "="), ('"a\\\\b"', "\\"),
                                      ('"a:b,c"', ",:"), ('"tab\\tname"', "\t")])
def test_set_names_with_spec_characters_are_refused(tmp_path, key, bad):
    """A set name is joined raw into specs (PATH:NAME[:P],...) and context names: 'a,b' would
    select the mixture of a and b. Such names are refused with the set and the characters."""
    p = tmp_path / "sets.yaml"
    p.write_text(f"{key}: [x]\nok: [y]\n")
    with pytest.raises(ValueError, match="set name") as info:
        read_anchors_file(p)
    assert str(p) in str(info.value)
    assert f"holds {', '.join(repr(c) for c in bad)};" in str(info.value)


def test_embedded_anchors_refuse_spec_characters_in_set_names(tmp_path):
    from anchordiv.anchorsfile import EmbeddedAnchors

    A = AnchorSet(np.eye(2))
    with pytest.raises(ValueError, match=r"set name 'a,b'.*','"):
        EmbeddedAnchors(path=tmp_path / "x.yaml", sets={"a,b": A}, mix={"a,b": 1.0}, encoder="fake", tau=0.05)


def test_a_cache_with_other_set_names_is_recomputed(yaml_file):
    enc = FakeEncoder()
    emb = embed_anchors(yaml_file, enc)
    z = dict(np.load(emb.cache_file))
    z["set_names"] = np.array(["object,style", "style"])
    np.savez(emb.cache_file, **z)
    again = embed_anchors(yaml_file, enc)
    assert list(again.sets) == ["object", "style"] and not again.from_cache


@pytest.mark.parametrize("content, key, line", [
    ("a: [x]\nb: [y]\na: [z]\n", "'a'", 3),
    ("a:\n  phrases: [x]\n  phrases: [y]\n", "'phrases'", 3),
    ("a:\n  names: [x]\n  template: '{}'\n  weights: [1]\n  mix: 1\n  mix: 2\n", "'mix'", 6),
    ("a:\n  phrases: [{k: 1, k: 2}]\n", "'k'", 2),
])
def test_duplicate_yaml_keys_are_refused(tmp_path, content, key, line):
    """yaml.safe_load keeps the last of duplicate keys; a duplicate at any level is an error
    naming the key and its line."""
    p = tmp_path / "dup.yaml"
    p.write_text(content)
    with pytest.raises(ValueError, match=rf"duplicate key {key}.*line {line}") as info:
        read_anchors_file(p)
    assert str(p) in str(info.value)


def test_template_expansion_is_capped(tmp_path):
    """names × templates is bounded per file (default 100,000 phrases); the error names the set
    and the product, and max_phrases= raises the cap."""
    names = ", ".join(f"n{i}" for i in range(400))
    templates = ", ".join(f'"t{j} {{}}"' for j in range(300))
    p = tmp_path / "big.yaml"
    p.write_text(f"small: [a, b]\nbig:\n  names: [{names}]\n  template: [{templates}]\n")
    with pytest.raises(ValueError, match=r"set 'big'.*400 names × 300 templates = 120,000 phrases.*100,000"):
        read_anchors_file(p)
    assert len(read_anchors_file(p, max_phrases=120_002).sets["big"].texts) == 120_000
    with pytest.raises(ValueError, match=r"set 'big'.*120,002 phrases.*120,001"):
        read_anchors_file(p, max_phrases=120_001)
    with pytest.raises(ValueError, match="max_phrases"):
        resolve_anchors(f"{p}:small", FakeEncoder())
    two = tmp_path / "two.yaml"
    two.write_text(f"one:\n  names: [{names}]\n  template: [{templates}]\n"
                   f"two:\n  names: [{names}]\n  template: [{templates}]\n")
    with pytest.raises(ValueError, match=r"set 'two'.*240,000 phrases"):
        read_anchors_file(two, max_phrases=200_000)
    txt = tmp_path / "lines.txt"
    txt.write_text("\n".join(f"p{i}" for i in range(11)))
    with pytest.raises(ValueError, match=r"set 'lines'.*11 phrases.*10"):
        read_anchors_file(txt, max_phrases=10)


def _set_mass(A, texts):
    return float(sum(w for t, w in zip(A.texts, A.weights.tolist()) if t in texts))


def test_resolve_mixtures(yaml_file):
    enc = FakeEncoder()
    style = ["a watercolor painting", "a pencil sketch"]
    single = resolve_anchors(f"{yaml_file}:style", enc)
    assert isinstance(single, AnchorSet) and single.texts == style and len(single) == 2
    mixed = resolve_anchors(f"{yaml_file}:object:0.7,style:0.3", enc)
    assert len(mixed) == 8
    assert _set_mass(mixed, style) == pytest.approx(0.3)
    # within a set, the per-phrase weights are kept: cat phrases carry twice the mass of dog phrases
    w = dict(zip(mixed.texts, mixed.weights.tolist()))
    assert w["a photo of a cat"] == pytest.approx(2 * w["a photo of a dog"])
    equal = resolve_anchors(f"{yaml_file}:object,style", enc)
    assert _set_mass(equal, style) == pytest.approx(0.5)
    default = resolve_anchors(yaml_file, enc)  # file's mix: object 3, style 1
    assert _set_mass(default, style) == pytest.approx(0.25)
    # one embedding call for the whole file, each distinct phrase once
    assert len(enc.calls) == 1 and len(enc.calls[0]) == 8
    np.testing.assert_allclose(torch.linalg.norm(mixed.embeddings, dim=1).numpy(), 1.0, rtol=1e-5)


@pytest.mark.parametrize("selection, match", [
    ("objects", "unknown anchor set 'objects' .*available sets: object, style"),
    ("object:0.7,style", "give a proportion for every set or for none"),
    ("object:-1,style:2", "proportion of set 'object' must be a finite number >= 0"),
    ("object:0,style:0", "proportions are all zero"),
    ("object,object", "named twice"),
    ("object:nan,style:1", "finite"),
])
def test_resolve_errors_name_the_argument_and_embed_nothing(yaml_file, selection, match):
    enc = FakeEncoder()
    with pytest.raises(ValueError, match=match) as info:
        resolve_anchors(f"{yaml_file}:{selection}", enc, arg="--anchors")
    assert str(info.value).startswith("--anchors:")
    assert enc.calls == []


def test_resolve_empty_file_names_the_argument(tmp_path):
    p = tmp_path / "empty.txt"
    p.write_text("\n")
    with pytest.raises(ValueError, match=r"^--anchors: anchors file .* holds no anchors"):
        resolve_anchors(p, FakeEncoder(), arg="--anchors")


def test_cache_reuse_and_invalidation(yaml_file):
    enc = FakeEncoder()
    first = embed_anchors(yaml_file, enc)
    assert not first.from_cache and first.cache_file == cache_path(yaml_file, "fake")
    assert first.cache_file.name == "anchors.yaml.anchors.fake.npz" and first.cache_file.is_file()
    assert first.tau == 0.02 and first.n_phrases == 8 and len(enc.calls) == 1

    again = embed_anchors(yaml_file, enc)
    assert again.from_cache and len(enc.calls) == 1
    for name in first.sets:
        np.testing.assert_array_equal(again.sets[name].embeddings.numpy(), first.sets[name].embeddings.numpy())
        assert again.sets[name].texts == first.sets[name].texts
        np.testing.assert_allclose(again.sets[name].weights.numpy(), first.sets[name].weights.numpy())
    assert again.mix == first.mix == {"object": 3.0, "style": 1.0}

    # a spec string with a matching cache loads no model at all
    by_name = embed_anchors(yaml_file, "fake")
    assert by_name.from_cache and by_name.tau == 0.02

    # another encoder: its own cache file
    other = FakeEncoder(name="open_clip:ViT-B-32/laion2b", dim=4)
    o = embed_anchors(yaml_file, other)
    assert not o.from_cache and o.cache_file != first.cache_file and o.sets["style"].dim == 4
    assert embed_anchors(yaml_file, enc).from_cache

    # editing the file invalidates the cache
    yaml_file.write_text(YAML.replace("a pencil sketch", "a charcoal drawing"))
    changed = embed_anchors(yaml_file, enc)
    assert not changed.from_cache and len(enc.calls) == 2
    assert changed.sets["style"].texts == ["a watercolor painting", "a charcoal drawing"]
    assert embed_anchors(yaml_file, enc).from_cache

    # refresh recomputes; a corrupt cache is recomputed; cache=False writes nothing
    assert not embed_anchors(yaml_file, enc, refresh=True).from_cache
    first.cache_file.write_bytes(b"not a zip file")
    assert not embed_anchors(yaml_file, enc).from_cache
    assert embed_anchors(yaml_file, enc).from_cache
    plain = yaml_file.with_name("plain.txt")
    plain.write_text("x\ny\n")
    assert embed_anchors(plain, enc, cache=False).cache_file is None
    assert not cache_path(plain, "fake").exists()


def test_resolve_anchor_spec_reports_details(yaml_file):
    res = resolve_anchor_spec(f"{yaml_file}:style:1", FakeEncoder())
    assert res.selection == [("style", 1.0)]
    assert res.embedded.encoder == "fake" and res.embedded.tau == 0.02
    assert res.anchors.texts == ["a watercolor painting", "a pencil sketch"]


def test_encoder_slug():
    assert encoder_slug("minilm") == "minilm"
    a, b = encoder_slug("open_clip:ViT-B-32/x"), encoder_slug("open_clip:ViT-B-32_x")
    assert a != b and os.sep not in a and ":" not in a


def test_real_minilm_anchors(yaml_file):
    from anchordiv.encoders import LazyEncoder

    enc = LazyEncoder("minilm", "cpu")
    emb = embed_anchors(yaml_file, enc)
    style = emb.sets["style"]
    assert style.dim == 384 and emb.tau == pytest.approx(0.05) and emb.encoder == "minilm"
    np.testing.assert_allclose(torch.linalg.norm(style.embeddings, dim=1).numpy(), 1.0, rtol=1e-4)
    assert embed_anchors(yaml_file, "minilm").from_cache
