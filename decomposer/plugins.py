"""Loading user patterns from files, modules and installed packages.

In: a ``--patterns`` value (a ``.py`` path, an importable module name, or a ``.onnx``
function library), or the ``decomposer.patterns`` entry-point group. Out: the patterns they
declare, registered in a :class:`Registry` with their origin (``file ...``,
``module ...``, ``entry point ...``).

A Python source declares patterns with a module-level ``PATTERNS`` list, with
``@decomposer.register`` on its pattern classes, or with ONNX function definitions: its
top-level onnxscript functions of a custom opset (``@script(Opset("mylab", 1))``) and a
``FUNCTIONS`` list (FunctionProtos or onnxscript functions); each definition answers for
its (domain, name) (:mod:`decomposer.functions`). A ``.onnx`` file declares the
``functions`` it holds (its graph may be empty). The origin is recorded either way.
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

import onnx

from decomposer.errors import PatternError
from decomposer.functions import function_patterns, is_custom_function
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
    if source.endswith(".onnx"):
        _load_function_library(path, registry, override)
        return
    is_file = source.endswith(".py") or path.is_file()
    label = f"file {source}" if is_file else f"module {source}"
    key = str(path.resolve()) if is_file and path.is_file() else source
    if key in registry.loaded_sources:
        return  # the same source given twice is loaded once
    with _attributing(label, registry, override):
        module = _import_file(path) if is_file else _import_module(source)
        _register_declared(module, getattr(module, "PATTERNS", None), label, registry, override)
        _register_functions(module_functions(module, label), label, registry, override)
    # Count what this source registered (an override replaces rather than grows).
    if not any(entry.source == label for entry in registry) \
            and not getattr(module, "PATTERNS", None):
        raise PatternError(f"{source} declares no pattern: define PATTERNS = [MyPattern()], "
                           f"decorate a Pattern subclass with @decomposer.register, or define "
                           f"the op as an onnxscript function of a custom opset")
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
            if isinstance(obj, ModuleType):
                _register_functions(module_functions(obj, label), label, registry, override)


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


def module_functions(module: ModuleType, label: str) -> list[onnx.FunctionProto]:
    """The function definitions a module declares: its ``FUNCTIONS`` list and its
    top-level onnxscript functions of a custom opset, in the order they appear."""
    found: list[onnx.FunctionProto] = []
    declared = getattr(module, "FUNCTIONS", None)
    listed = list(declared) if isinstance(declared, (list, tuple)) else \
        [] if declared is None else [declared]
    for item in listed:
        proto = _as_function(item)
        if proto is None:
            raise PatternError(f"{label}: FUNCTIONS holds {item!r}, which is neither an "
                               f"onnx.FunctionProto nor an onnxscript function")
        found.append(proto)
    listed_ids = {id(item) for item in listed}
    for name, value in vars(module).items():
        if name.startswith("_") or id(value) in listed_ids:
            continue
        if getattr(value, "__module__", None) not in (None, module.__name__) and \
                not _defined_in(value, module):
            continue  # imported from elsewhere, not declared here
        proto = _as_function(value)
        if proto is not None and is_custom_function(proto):
            found.append(proto)
    return found


def _defined_in(value: Any, module: ModuleType) -> bool:
    inner = getattr(value, "function", None)  # an onnxscript function wraps the Python one
    return getattr(inner, "__module__", None) == module.__name__


def _as_function(item: Any) -> onnx.FunctionProto | None:
    """``item`` as a FunctionProto: itself, or an onnxscript function's definition
    (duck-typed: the core does not import onnxscript)."""
    if isinstance(item, onnx.FunctionProto):
        return item
    to_proto = getattr(item, "to_function_proto", None)
    if callable(to_proto) and getattr(getattr(item, "opset", None), "domain", None) is not None:
        try:
            proto = to_proto()
        except Exception as exc:
            raise PatternError(f"onnxscript function {getattr(item, 'name', item)!r} cannot "
                               f"be converted to an ONNX function: "
                               f"{type(exc).__name__}: {exc}") from exc
        return proto if isinstance(proto, onnx.FunctionProto) else None
    return None


def _register_functions(functions: list[onnx.FunctionProto], label: str, registry: Registry,
                        override: bool) -> None:
    for pattern in function_patterns(functions, label):
        pattern.registry = registry
        registry.register(pattern, source=label, override=override)


def _load_function_library(path: Path, registry: Registry, override: bool) -> None:
    """Register the custom-domain functions of the ONNX file at ``path``."""
    key = str(path.resolve())
    if key in registry.loaded_sources:
        return
    label = f"file {path}"
    if not path.is_file():
        raise PatternError(f"--patterns {path}: no such file")
    try:
        library = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise PatternError(f"--patterns {path}: not a readable ONNX file "
                           f"({type(exc).__name__}: {exc})") from exc
    functions = [function for function in library.functions if is_custom_function(function)]
    if not functions:
        raise PatternError(f"--patterns {path}: the file defines no function of a custom "
                           f"domain (a function library keeps them in the model's functions)")
    _register_functions(functions, label, registry, override)
    registry.loaded_sources.add(key)


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
