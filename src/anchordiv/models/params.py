"""Declared parameters of a geometry: one :class:`Param` per constructor argument.

A geometry class lists its parameters once, in ``PARAMS``; the command line (``--param``,
``--rank``, ``--components``, ``--seed``), the experiments (clipping to the anchors) and the
service's request schema read that declaration. The temperature (``tau`` / ``logit_scale``)
is not declared: every model with ``tags().takes_temperature`` takes it, checked by
:func:`anchordiv._util.check_tau`.
"""

from __future__ import annotations

import inspect
import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable

#: The kinds of a declared parameter.
KINDS = ("float", "int", "rank", "choice", "bool", "any")
#: Constructor arguments every anchor model takes and no model declares.
TEMPERATURE_PARAMS = ("tau", "logit_scale")

_BOOLS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}


@dataclass(frozen=True)
class Param:
    """One parameter of a geometry: its name, kind, default, range and help.

    Kinds: ``"float"`` and ``"int"`` (numbers in [``low``, ``high``], an end left out with
    ``low_open`` / ``high_open``), ``"rank"`` (an int k ≥ 1, or a float variance fraction in
    (0, 1]), ``"choice"`` (one of ``choices``), ``"bool"``, ``"any"`` (any value, passed through).
    A default of None means "chosen by the model" (e.g. ν0 = d + 20) and is always accepted.

    ``at_most(n_anchors, dim)`` is the largest integer value a fit on ``n_anchors`` anchors of
    dimension ``dim`` allows; the experiments clip integer values to it (:meth:`clip`).
    ``seed`` marks the fit's random seed, which the experiments and ``--seed`` set.
    ``request_max`` is the largest value a shared service should accept (the fit's cost grows
    with it); None for no cap beyond ``high``.
    """

    name: str
    kind: str
    default: Any
    help: str = ""
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple = ()
    at_most: Callable[[int, int], int] | None = None
    seed: bool = False
    request_max: float | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.name, str) and self.name.isidentifier()):
            raise ValueError(f"Param name must be an identifier, got {self.name!r}.")
        if self.kind not in KINDS:
            raise ValueError(f"Param {self.name!r}: kind must be one of {', '.join(KINDS)}, got {self.kind!r}.")
        if self.kind == "choice" and not self.choices:
            raise ValueError(f"Param {self.name!r}: a choice needs choices=(...).")

    # ------------------------------------------------------------------ checks
    def range_text(self) -> str:
        """The accepted values in words, e.g. ``an int in [1, inf)``."""
        if self.kind == "rank":
            return "an int k >= 1 or a variance fraction in (0, 1]"
        if self.kind == "choice":
            return "one of " + ", ".join(map(repr, self.choices))
        if self.kind == "bool":
            return "true or false"
        if self.kind == "any":
            return "any value"
        lo = "-inf" if self.low is None else _text(self.low)
        hi = "inf" if self.high is None else _text(self.high)
        left = "(" if self.low_open or self.low is None else "["
        right = ")" if self.high_open or self.high is None else "]"
        return f"{'an int' if self.kind == 'int' else 'a number'} in {left}{lo}, {hi}{right}"

    def check(self, value: Any, arg: str | None = None) -> Any:
        """``value`` converted to the kind and checked against the range, else a ``ValueError``
        naming ``arg`` (default the parameter's name)."""
        if value is None and self.default is None:
            return None
        arg = arg or self.name
        bad = ValueError(f"{arg} must be {self.range_text()}, got {value!r}.")
        if self.kind == "any":
            return value
        if self.kind == "choice":
            if value not in self.choices:
                raise bad
            return value
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise bad
            return value
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
            raise bad
        if self.kind == "rank":
            if isinstance(value, numbers.Integral) or float(value).is_integer() and float(value) > 1:
                if int(value) < 1:
                    raise bad
                return int(value)
            if not 0 < float(value) <= 1:
                raise bad
            return float(value)
        if self.kind == "int":
            if not (isinstance(value, numbers.Integral) or float(value).is_integer()):
                raise bad
            value = int(value)
        else:
            value = float(value)
        if self.low is not None and (value < self.low or self.low_open and value == self.low):
            raise bad
        if self.high is not None and (value > self.high or self.high_open and value == self.high):
            raise bad
        return value

    def parse(self, text: str, arg: str | None = None) -> Any:
        """The value of a command-line string, checked (:meth:`check`); an error quotes ``text``."""
        try:
            return self._parse(str(text).strip(), arg)
        except ValueError:
            raise ValueError(f"{arg or self.name} must be {self.range_text()}, got {text!r}.") from None

    def _parse(self, raw: str, arg: str | None) -> Any:
        if self.default is None and raw.lower() in ("none", ""):
            return None
        if self.kind == "bool":
            if raw.lower() not in _BOOLS:
                raise ValueError(raw)
            return _BOOLS[raw.lower()]
        if self.kind in ("choice", "any"):
            value: Any = raw
            if self.kind == "any" or not all(isinstance(c, str) for c in self.choices):
                value = _number(raw, raw)
                if self.kind == "any" and raw.lower() in ("true", "false"):
                    value = raw.lower() == "true"
            return self.check(value, arg)
        if self.kind == "rank":
            value = _number(raw, None, as_float=any(c in raw for c in ".eE"))
        else:
            value = _number(raw, None)
        if value is None:
            raise ValueError(raw)
        return self.check(value, arg)

    def clip(self, value: Any, n_anchors: int, dim: int) -> Any:
        """An integer ``value`` clipped to what a fit on ``n_anchors`` anchors of dimension ``dim``
        allows, max(low, min(value, at_most(n_anchors, dim))); other values unchanged."""
        if self.at_most is None or isinstance(value, bool) or not isinstance(value, numbers.Integral):
            return value
        low = 1 if self.low is None else int(math.ceil(self.low))
        return max(low, min(int(value), int(self.at_most(int(n_anchors), int(dim)))))

    def describe(self) -> dict:
        """A JSON-ready description: name, kind, default, low, high, choices, help."""
        out = {"name": self.name, "kind": self.kind, "default": self.default, "help": self.help}
        if self.kind in ("float", "int"):
            out.update(low=self.low, high=self.high, low_open=self.low_open, high_open=self.high_open)
        if self.choices:
            out["choices"] = list(self.choices)
        if self.request_max is not None:
            out["request_max"] = self.request_max
        return out


def _text(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() and abs(bound) < 1e16 else f"{bound:g}"


def _number(raw: str, fallback: Any, as_float: bool = False) -> Any:
    convs = (float,) if as_float else (int, float)
    for conv in convs:
        try:
            return conv(raw)
        except ValueError:
            continue
    return fallback


def _inferred(name: str, default: Any) -> Param:
    """A declaration for a constructor argument that its class does not declare."""
    if isinstance(default, bool):
        return Param(name, "bool", default)
    if isinstance(default, numbers.Integral):
        return Param(name, "int", int(default))
    if isinstance(default, numbers.Real):
        return Param(name, "float", float(default))
    return Param(name, "any", None if default is inspect.Parameter.empty else default)


def declared_params(cls: type) -> dict[str, Param]:
    """The parameters of geometry class ``cls`` by name: its ``PARAMS``, then any other keyword of
    its constructor (kind inferred from the default), without ``tau`` and ``logit_scale``."""
    out = {p.name: p for p in getattr(cls, "PARAMS", ())}
    for name, p in inspect.signature(cls.__init__).parameters.items():
        if name == "self" or name in out or name in TEMPERATURE_PARAMS:
            continue
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        out[name] = _inferred(name, p.default)
    return out


def check_declaration(cls: type) -> None:
    """A ``ValueError`` when ``cls.PARAMS`` names an argument its constructor lacks, or repeats one."""
    declared = [p.name for p in getattr(cls, "PARAMS", ())]
    if not isinstance(getattr(cls, "PARAMS", ()), tuple) or not all(
            isinstance(p, Param) for p in getattr(cls, "PARAMS", ())):
        raise ValueError(f"{cls.__qualname__}.PARAMS must be a tuple of anchordiv.models.Param.")
    repeated = sorted({n for n in declared if declared.count(n) > 1})
    if repeated:
        raise ValueError(f"{cls.__qualname__}.PARAMS declares {', '.join(repeated)} more than once.")
    sig = inspect.signature(cls.__init__).parameters
    takes_any = any(p.kind == p.VAR_KEYWORD for p in sig.values())
    missing = [n for n in declared if n not in sig and not takes_any]
    if missing:
        raise ValueError(f"{cls.__qualname__}.PARAMS declares {', '.join(missing)}, which its __init__ does not "
                         "take; add the keyword argument or remove the declaration.")
    reserved = [n for n in declared if n in TEMPERATURE_PARAMS]
    if reserved:
        raise ValueError(f"{cls.__qualname__}.PARAMS declares {', '.join(reserved)}; the temperature is not "
                         "declared (tags().takes_temperature says a model takes it).")
