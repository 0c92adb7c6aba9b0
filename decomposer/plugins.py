"""Loading user patterns from files, modules and installed packages.

In: a ``--patterns`` value (a ``.py`` path or an importable module name), or the
``decomposer.patterns`` entry-point group. Out: the patterns they declare, registered in a
:class:`Registry` with their origin (``file ...``, ``module ...``, ``entry point ...``).

A source declares patterns either with a module-level ``PATTERNS`` list or with
``@decomposer.register`` on its pattern classes; both work, and the origin is recorded
either way.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from decomposer.errors import PatternError
from decomposer.pattern import Pattern
from decomposer.registry import Registry

ENTRY_POINT_GROUP = "decomposer.patterns"

# Set while a pattern source is being imported, so that @register calls it makes are
# attributed to it and land in the registry being filled.
_loading: list[tuple[str, Registry, bool]] = []


def current_target() -> tuple[str, Registry, bool] | None:
    """(source label, registry, override) of the source being imported, if any."""
    return _loading[-1] if _loading else None


@contextlib.contextmanager
def _attributing(label: str, registry: Registry, override: bool) -> Iterator[None]:
    _loading.append((label, registry, override))
    try:
        yield
    finally:
        _loading.pop()


def load_pattern_source(source: str, registry: Registry, *, override: bool = False) -> None:
    """Import ``source`` (a .py file or module name) and register the patterns it declares."""
    path = Path(source)
    is_file = source.endswith(".py") or path.is_file()
    label = f"file {source}" if is_file else f"module {source}"
    key = str(path.resolve()) if is_file and path.is_file() else source
    if key in registry.loaded_sources:
        return  # the same source given twice is loaded once
    with _attributing(label, registry, override):
        module = _import_file(path) if is_file else _import_module(source)
        _register_declared(module, getattr(module, "PATTERNS", None), label, registry, override)
    # Count what this source registered (an override replaces rather than grows).
    if not any(entry.source == label for entry in registry) \
            and not getattr(module, "PATTERNS", None):
        raise PatternError(f"{source} declares no pattern: define PATTERNS = [MyPattern()] "
                           f"or decorate a Pattern subclass with @decomposer.register")
    registry.loaded_sources.add(key)


def load_entry_points(registry: Registry, *, override: bool = False) -> None:
    """Register the patterns of every installed ``decomposer.patterns`` entry point."""
    from importlib.metadata import entry_points

    for entry in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        label = f"entry point {entry.name} ({entry.value})"
        with _attributing(label, registry, override):
            try:
                obj = entry.load()
            except Exception as exc:
                raise PatternError(f"{label}: cannot load: {type(exc).__name__}: {exc}") from exc
            declared = getattr(obj, "PATTERNS", None) if isinstance(obj, ModuleType) else obj
            _register_declared(obj, declared, label, registry, override)


def _register_declared(module: Any, declared: Any, label: str, registry: Registry,
                       override: bool) -> None:
    if declared is None:
        return
    items = declared if isinstance(declared, (list, tuple)) else [declared]
    registered = {id(entry.pattern) for entry in registry}
    for item in items:
        pattern = item() if isinstance(item, type) and issubclass(item, Pattern) else item
        if not isinstance(pattern, Pattern):
            raise PatternError(f"{label}: {item!r} is not a decomposer.Pattern")
        if id(pattern) not in registered:
            registry.register(pattern, source=label, override=override)


def _import_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise PatternError(f"--patterns {path}: no such file")
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]
    name = f"decomposer_user_patterns_{path.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise PatternError(f"--patterns {path}: cannot import this file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except PatternError:
        raise
    except Exception as exc:
        sys.modules.pop(name, None)
        raise PatternError(f"--patterns {path}: importing it failed: "
                           f"{type(exc).__name__}: {exc}") from exc
    return module


def _import_module(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except PatternError:
        raise
    except Exception as exc:
        raise PatternError(f"--patterns {name}: not a .py file and not importable as a "
                           f"module ({type(exc).__name__}: {exc})") from exc
