"""Built-in decomposition patterns, one module per op (installed as ``decomposer.patterns``).

In: the modules in this package. Each one registers explicitly by listing its pattern
instances in a module-level ``PATTERNS`` list.
Out: ``builtin_patterns()``, every module's ``PATTERNS`` in module-name order, which the
default registry loads. Adding a decomposition means adding one module here (and its
test); nothing else changes. A module without ``PATTERNS`` is an error, not skipped.
"""

from __future__ import annotations

import importlib
import pkgutil

from decomposer.errors import PatternError
from decomposer.pattern import Pattern


def pattern_modules() -> list[str]:
    """Fully qualified names of the pattern modules, sorted."""
    return sorted(f"{__name__}.{info.name}" for info in pkgutil.iter_modules(__path__)
                  if not info.name.startswith("_"))


def builtin_patterns() -> list[Pattern]:
    patterns: list[Pattern] = []
    for module_name in pattern_modules():
        module = importlib.import_module(module_name)
        declared = getattr(module, "PATTERNS", None)
        if not declared:
            raise PatternError(f"pattern module {module_name} has no PATTERNS list; "
                               f"end it with PATTERNS = [YourPattern()]")
        patterns.extend(declared)
    return patterns
