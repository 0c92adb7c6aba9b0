"""The pattern registry: which pattern answers for which node.

In: ``Pattern`` instances, registered explicitly with the place they came from.
Out: ``Registry.lookup(node)`` gives the pattern and the spelling (:class:`Form`) the node
matched, or None.

Lookup order for a node ``domain::op_type``: the exact (domain, op_type) key, then a
pattern that accepts any domain for that op_type. torch's ATen fallbacks
(``org.pytorch.aten::name`` and ``ATen(operator=name)``) are looked up by ATen name.
Registering two patterns under one key is an error unless ``override=True``.
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import onnx

from decomposer.errors import PatternError
from decomposer.forms import ATEN_DOMAIN, Form, aten_operator
from decomposer.graphs import norm_domain
from decomposer.pattern import Pattern

_ANY = "*"


@dataclass(frozen=True)
class Entry:
    pattern: Pattern[Any]
    source: str


class Registry:
    def __init__(self) -> None:
        self._entries: list[Entry] = []
        self._by_key: dict[tuple[str, str], Entry] = {}
        self._forms: dict[tuple[str, str], Form] = {}
        self.loaded_sources: set[str] = set()  # --patterns files/modules already loaded

    def register(self, pattern: Pattern[Any], *, source: str = "built-in",
                 override: bool = False) -> Pattern[Any]:
        if not isinstance(pattern, Pattern):
            raise PatternError(f"{pattern!r} is not a decomposer.Pattern instance")
        if not getattr(type(pattern), "op_type", None):
            raise PatternError(f"pattern {type(pattern).__name__} does not set op_type")
        forms: dict[tuple[str, str], Form] = {}
        for form in pattern.spellings():
            for domain, op in form.keys():
                forms.setdefault((domain if domain is not None else _ANY, op), form)
            if form.aten:
                forms.setdefault((ATEN_DOMAIN, "ATen:" + form.aten), form)
        keys = list(forms)
        entry = Entry(pattern, source)
        # The same class defined in the same file, registered again (a module imported
        # under two names, e.g. installed as an entry point and imported by its own tests)
        # is a reload, not a clash: the newer definition replaces the older silently.
        clashes = sorted({self._by_key[k].source + ": " + self._by_key[k].pattern.name
                          for k in keys if k in self._by_key
                          and not _same_definition(self._by_key[k].pattern, pattern)})
        if clashes and not override:
            raise PatternError(
                f"pattern {pattern.name} from {source} clashes with {', '.join(clashes)} "
                f"on the same (domain, op_type); register it with override=True (command "
                f"line: --override) to replace it")
        if any(k in self._by_key for k in keys):
            replaced = {id(self._by_key[k]) for k in keys if k in self._by_key}
            self._entries = [e for e in self._entries if id(e) not in replaced]
        for key in keys:
            self._by_key[key] = entry
            self._forms[key] = forms[key]
        self._entries.append(entry)
        return pattern

    def lookup(self, node: onnx.NodeProto) -> tuple[Pattern[Any], Form] | None:
        """(pattern, spelling) for ``node``, or None when no pattern answers for it."""
        domain = norm_domain(node.domain)
        native = (domain, node.op_type) if (domain, node.op_type) in self._by_key \
            else (_ANY, node.op_type)
        if native in self._by_key and domain != ATEN_DOMAIN:
            return self._by_key[native].pattern, self._forms[native]
        aten_name = aten_operator(node)
        if aten_name is not None:
            key = (ATEN_DOMAIN, "ATen:" + aten_name)
            if key in self._by_key:
                return self._by_key[key].pattern, self._forms[key]
        if native in self._by_key:
            return self._by_key[native].pattern, self._forms[native]
        return None

    def answers_exactly(self, domain: str, op_type: str) -> bool:
        """Whether a pattern is registered for exactly ``domain::op_type`` (not through a
        pattern that accepts any domain)."""
        return (norm_domain(domain), op_type) in self._by_key

    def __iter__(self) -> Iterator[Entry]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def copy(self) -> Registry:
        clone = Registry()
        clone._entries = list(self._entries)
        clone._by_key = dict(self._by_key)
        clone._forms = dict(self._forms)
        clone.loaded_sources = set(self.loaded_sources)
        return clone


def _same_definition(a: Pattern[Any], b: Pattern[Any]) -> bool:
    """Whether two pattern instances come from two imports of one class definition (the
    same qualified name in the same file). One class registered twice is a duplicate."""
    ta, tb = type(a), type(b)
    if ta is tb:
        return False
    if ta.__qualname__ != tb.__qualname__:
        return False
    try:
        return os.path.samefile(inspect.getfile(ta), inspect.getfile(tb))
    except (TypeError, OSError):
        return False


_default: Registry | None = None


def build_registry(*, entry_points: bool = True, override: bool = False) -> Registry:
    """A new registry: the built-in patterns, then installed ``decomposer.patterns`` entry
    points (a clash with a built-in is an error unless ``override``)."""
    from decomposer.plugins import load_entry_points

    # Imported by name: `patterns/` installs as decomposer.patterns through a package-dir
    # mapping that type checkers cannot follow, so its one entry point is typed here.
    builtin_patterns: Callable[[], list[Pattern[Any]]] = importlib.import_module(
        "decomposer.patterns").builtin_patterns
    registry = Registry()
    for pattern in builtin_patterns():
        registry.register(pattern, source="built-in")
    if entry_points:
        load_entry_points(registry, override=override)
    return registry


def default_registry() -> Registry:
    """The process-wide registry: built-ins, entry points, and what ``register`` added."""
    global _default
    if _default is None:
        _default = build_registry()
    return _default
