"""The report as HTML: ``templates/report.html.j2`` rendered from a :class:`~anchordiv.report.view.ReportView`.

Autoescaping is on and the template marks nothing safe: every name and text is escaped.
The templates are package data of :mod:`anchordiv` (``anchordiv/templates/``).
"""

from __future__ import annotations

import re

from .._util import require
from .view import ReportView

__all__ = ["FRAGMENT_CLASS", "scope_css", "render_html"]

#: The element that holds a report rendered as a fragment; its styles apply inside it only.
FRAGMENT_CLASS = "anchordiv-report"


def scope_css(css: str, scope: str = "." + FRAGMENT_CLASS) -> str:
    """The rules of ``css`` (one selector list per line start) applied inside ``scope`` only:
    ``body`` becomes the scope itself, every other selector is prefixed with it."""
    def rule(match: re.Match) -> str:
        selectors = [sel.strip() for sel in match.group(1).split(",")]
        return ", ".join(scope if sel == "body" else f"{scope} {sel}" for sel in selectors) + " {"

    return re.sub(r"(?m)^([^\s{}][^{}]*?)\s*\{", rule, css)


def render_html(view: ReportView, fragment: bool = False) -> str:
    """The page: ``templates/report.html.j2`` rendered with autoescaping on (``fragment``: a
    ``<div>`` whose styles apply inside it only, for a notebook cell)."""
    jinja2 = require("jinja2", "jinja2", "write_report")
    env = jinja2.Environment(loader=jinja2.PackageLoader("anchordiv", "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True)
    # the template's own stylesheet (template text, not data): scoped, it stays template text
    env.filters["scope_css"] = lambda text: type(text)(scope_css(str(text)))
    return env.get_template("report.html.j2").render(vars(view), fragment=fragment)
