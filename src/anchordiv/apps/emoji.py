"""Emoji as an object x style image set: the same emoji drawn by Google and by Twitter.

The npm packages ``emoji-datasource-google`` (images Apache-2.0) and
``emoji-datasource-twitter`` (images CC-BY-4.0) hold one 64x64 PNG per emoji under
``img/<vendor>/64/`` and an ``emoji.json`` with each emoji's name, category and
subcategory. Like ImageNet-R, every object (the emoji) comes in several styles (the
vendors). :func:`fetch` packs the pinned versions with ``npm pack`` into a cache folder
(verified by SHA-256) and unpacks only those files; :func:`load` reads them back.
Nothing is downloaded at import or by :func:`load`.

Usage: ``python -m anchordiv.apps.emoji [CACHE]`` fetches into ``CACHE`` (default
:func:`default_cache`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .._util import sha256_file as _sha256
from ..encoders import EMOJI_CLIP_ARCH, EMOJI_CLIP_DIR, EMOJI_SPEC

#: vendor -> (npm package, pinned version, SHA-256 of the ``npm pack`` tarball, image licence).
PACKAGES = {
    "google": ("emoji-datasource-google", "16.0.0",
               "fb5fd131b362aab7a55542d2a147a79708cce0a8b1c1bbacd470172708b5c438", "Apache-2.0"),
    "twitter": ("emoji-datasource-twitter", "16.0.0",
                "f64a530c63bca463bd8317fdc4615ce63a53a0c65018e4ce2d848aaba7a28877", "CC-BY-4.0"),
}
VENDORS = tuple(PACKAGES)

#: The committed emoji CLIP (:mod:`anchordiv.encoders`, spec ``emoji-clip``): its OpenCLIP
#: architecture, the folder of its weights and config, and its encoder spec.
CLIP_ARCH, CLIP_DIR, CLIP_SPEC = EMOJI_CLIP_ARCH, EMOJI_CLIP_DIR, EMOJI_SPEC

#: Caption templates naming the object and the style.
BOTH_TEMPLATES = (
    "a {name} emoji in {style} style",
    "{style}'s drawing of {name}",
    "{name}, drawn by {style}",
    "the {style} {name} emoji",
    "an emoji of {name} in the {style} style",
    "{name} ({style} emoji)",
)
#: Caption templates naming only the object; the first is the object anchor.
OBJECT_TEMPLATES = ("a {name} emoji", "an emoji of {name}", "{name}")
#: Caption templates naming only the style; the first is the style anchor.
STYLE_TEMPLATES = ("an emoji in {style} style", "a {style} emoji", "{style}'s drawing")


def default_cache() -> Path:
    """``$ANCHORDIV_EMOJI`` or ``~/.cache/anchordiv/emoji``."""
    return Path(os.environ.get("ANCHORDIV_EMOJI") or Path.home() / ".cache" / "anchordiv" / "emoji")


def object_anchor(name: str) -> str:
    """The object anchor text of an emoji name: ``"a {name} emoji"``."""
    return OBJECT_TEMPLATES[0].format(name=name)


def style_anchor(vendor: str) -> str:
    """The style anchor text of a vendor: ``"an emoji in {vendor} style"``."""
    return STYLE_TEMPLATES[0].format(style=vendor)


def with_text_tower(config: dict, path: str) -> dict:
    """``config`` with its Hugging Face text tower and tokenizer (when it has one) read from ``path``."""
    text = dict(config["text_cfg"])
    if "hf_model_name" in text:
        text.update(hf_model_name=path, hf_tokenizer_name=path)
    return {**config, "text_cfg": text}


def _unpack(tarball: Path, vendor: str, dest: Path) -> None:
    """Unpack ``package/emoji.json`` and ``package/img/<vendor>/64/*.png`` into ``dest``."""
    prefix = f"package/img/{vendor}/64/"
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(tarball, "r:gz") as tar:
        members = [m for m in tar.getmembers() if m.isfile() and (
            m.name == "package/emoji.json"
            or (m.name.startswith(prefix) and m.name.endswith(".png") and "/" not in m.name[len(prefix):]))]
        tar.extractall(tmp, members=members, filter="data")
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp / "package", dest)
    shutil.rmtree(tmp, ignore_errors=True)


def fetch(cache: Path | str | None = None, vendors: Sequence[str] = VENDORS) -> Path:
    """Pack the pinned emoji packages with ``npm pack`` (network) and unpack their images.

    Tarballs already in ``cache`` with the pinned SHA-256 are reused, so a second call
    reads nothing from the network.

    Returns
    -------
    Path
        ``cache``, holding ``<vendor>/emoji.json`` and ``<vendor>/img/<vendor>/64/*.png``.
    """
    cache = Path(cache) if cache is not None else default_cache()
    cache.mkdir(parents=True, exist_ok=True)
    for vendor in _check_vendors(vendors):
        package, version, digest, _ = PACKAGES[vendor]
        tarball = cache / f"{package}-{version}.tgz"
        if not tarball.is_file() or _sha256(tarball) != digest:
            npm = shutil.which("npm")
            if npm is None:
                raise RuntimeError(f"fetching {package}@{version} needs npm; install Debian's npm.")
            subprocess.run([npm, "pack", "--loglevel=error", f"{package}@{version}",
                            "--pack-destination", str(cache)],
                           check=True, stdout=subprocess.DEVNULL)
            if _sha256(tarball) != digest:
                raise RuntimeError(f"{tarball} does not have the pinned SHA-256 {digest}; delete it.")
        if not (cache / vendor / "emoji.json").is_file():
            _unpack(tarball, vendor, cache / vendor)
    return cache


def _check_vendors(vendors: Sequence[str]) -> list[str]:
    vendors = list(vendors)
    bad = [v for v in vendors if v not in PACKAGES]
    if bad or not vendors:
        raise ValueError(f"vendors must be a non-empty subset of {list(VENDORS)}, got {vendors!r}.")
    return vendors


@dataclass(frozen=True)
class Emoji:
    """One picture: an emoji (``name``, lower case) drawn by one ``vendor``."""

    name: str
    short_name: str
    category: str
    subcategory: str
    vendor: str
    path: Path


def load(cache: Path | str | None = None, vendors: Sequence[str] = VENDORS) -> list[Emoji]:
    """The base emoji (no skin-tone variants) that every vendor in ``vendors`` draws.

    Reads ``<cache>/<vendor>/emoji.json`` and its PNGs as :func:`fetch` leaves them; a
    name that occurs twice is kept once. Ordered by name, then vendor.

    Raises
    ------
    FileNotFoundError
        If a vendor's files are missing; the message says how to fetch them.
    """
    cache = Path(cache) if cache is not None else default_cache()
    vendors = _check_vendors(vendors)
    drawn: dict[str, dict[str, Emoji]] = {}
    for vendor in vendors:
        index = cache / vendor / "emoji.json"
        if not index.is_file():
            raise FileNotFoundError(
                f"no emoji images for {vendor!r} in {cache}: run `python -m anchordiv.apps.emoji {cache}` "
                "once (npm packs the pinned packages) or set ANCHORDIV_EMOJI to a folder that has them.")
        with open(index, encoding="utf-8") as f:
            entries = json.load(f)
        for e in entries:
            path = cache / vendor / "img" / vendor / "64" / str(e.get("image", ""))
            name = str(e.get("name") or "").strip().lower()
            if not name or not e.get(f"has_img_{vendor}", True) or not path.is_file():
                continue
            drawn.setdefault(name, {}).setdefault(vendor, Emoji(
                name, str(e.get("short_name", "")), str(e.get("category", "")),
                str(e.get("subcategory", "")), vendor, path))
    return [by_vendor[v] for name, by_vendor in sorted(drawn.items())
            if len(by_vendor) == len(vendors) for v in vendors]


def is_held_out(name: str, fraction: float = 0.2) -> bool:
    """Whether an emoji name is in the held-out split: the first 8 bytes of SHA-256 of
    the name, as a number in [0, 1), fall below ``fraction`` (a split by name, the same
    on every machine)."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction!r}.")
    u = int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "big") / 2.0 ** 64
    return u < fraction


if __name__ == "__main__":
    print(fetch(sys.argv[1] if len(sys.argv) > 1 else None))
