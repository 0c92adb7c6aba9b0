"""``torch.searchsorted`` with tensor values -> ``custom.ops::SearchSorted(sorted_sequence,
values[, sorter], out_int32, right)``.

torch's exporter has no ONNX function for aten.searchsorted. ``side`` folds into ``right``;
a Python-number ``values`` and ``side="left"`` with ``right=True`` (which torch rejects)
are left to torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from decomposer.torch.emit import emit_opaque
from decomposer.torch.probe import OPAQUE_DOMAIN
from decomposer.torch.routes import NOT_ROUTED, ROUTING_NAMESPACE, Exporting, Route


@torch.library.custom_op(f"{ROUTING_NAMESPACE}::searchsorted", mutates_args=())
def searchsorted_op(sorted_sequence: torch.Tensor, values: torch.Tensor, out_int32: bool,
                    right: bool, sorter: torch.Tensor | None) -> torch.Tensor:
    return torch.searchsorted(sorted_sequence, values, out_int32=out_int32, right=right,
                              sorter=sorter)


@searchsorted_op.register_fake
def _(sorted_sequence: torch.Tensor, values: torch.Tensor, out_int32: bool, right: bool,
      sorter: torch.Tensor | None) -> torch.Tensor:
    return values.new_empty(values.shape, dtype=torch.int32 if out_int32 else torch.int64)


def _translate(sorted_sequence: Any, values: Any, out_int32: bool, right: bool,
               sorter: Any) -> Any:
    inputs = [sorted_sequence, values] + ([sorter] if sorter is not None else [])
    return emit_opaque(OPAQUE_DOMAIN, 1, "SearchSorted", inputs,
                       {"out_int32": int(out_int32), "right": int(right)})


class SearchSortedRoute(Route):
    functions = (torch.searchsorted,)

    signature = staticmethod(lambda sorted_sequence, input, *, out_int32=False, right=False,
                             side=None, out=None, sorter=None: None)

    def route(self, export: Exporting, function: Any, bound: dict[str, Any]) -> Any:
        if bound["out"] is not None:
            return NOT_ROUTED
        sequence, values, sorter = bound["sorted_sequence"], bound["input"], bound["sorter"]
        if not isinstance(values, torch.Tensor) or bound["side"] not in (None, "left", "right"):
            return NOT_ROUTED  # a Python number: torch's own export path, and its error
        right = bool(bound["right"]) or bound["side"] == "right"
        if bound["side"] == "left" and bound["right"]:
            return NOT_ROUTED  # torch raises on the contradiction; let it
        tensors = [sequence, values] + ([sorter] if sorter is not None else [])
        attrs = (("out_int32", int(bool(bound["out_int32"]))), ("right", int(right)))
        if not export.rewrites("SearchSorted", tensors, attrs):
            return NOT_ROUTED
        export.note("SearchSorted")
        return searchsorted_op(sequence, values, bool(bound["out_int32"]), right, sorter)

    def translations(self, opset: int) -> dict[Any, Callable[..., Any]]:
        return {searchsorted_op._opoverload: _translate}
