"""What a decomposition run did, as data.

In: filled in by the engine while it rewrites a model.
Out: ``Report`` with per-pattern counts, every replaced node, every node left alone with
the reason, and the opset; ``Report.to_dict()`` is the ``--report FILE.json`` layout.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class NodeIssue:
    """A non-standard node that was not rewritten, and why."""

    name: str
    op_type: str
    domain: str
    graph: str
    reason: str

    def describe(self) -> str:
        where = f" in {self.graph}" if self.graph != "main graph" else ""
        label = self.name or "<unnamed>"
        domain = self.domain or "<default domain>"
        return f"node '{label}' ({domain}::{self.op_type}){where}: {self.reason}"


@dataclass(frozen=True)
class ReplacedNode:
    name: str
    op_type: str
    domain: str
    graph: str
    pattern: str
    new_nodes: int


@dataclass
class Report:
    opset: int = 0  # the output's default-domain opset
    target: str = "portable"
    # --target-opset: the input's opset, when the model was taken down from it
    source_opset: int | None = None
    taken_down: bool = False
    lowered: list[str] = field(default_factory=list)  # standard op types decomposed on request
    # "OpType:first output" of the standard nodes the --target lowered (its engines'
    # gaps); the ones kept, and why, are in warnings
    lowered_nodes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # inputs given dims or frozen (--overwrite-input-shape, --freeze-input), and whether the
    # model was folded (those, or a --target whose engine needs static shape arithmetic)
    fixed_inputs: list[str] = field(default_factory=list)
    folded: bool = False
    replaced: list[ReplacedNode] = field(default_factory=list)
    unsupported: list[NodeIssue] = field(default_factory=list)
    dropped_opset_imports: list[str] = field(default_factory=list)
    # value_info entries that contradicted their standard producers (see
    # checking.stale_value_info): dropped so that the model passes the checker
    dropped_value_info: list[str] = field(default_factory=list)
    removed_constants: int = 0
    # model-local functions whose every call was inlined, so the output holds them no more
    inlined_functions: list[str] = field(default_factory=list)
    input_path: str | None = None
    output_path: str | None = None
    dry_run: bool = False
    verification: Any = None

    @property
    def counts(self) -> dict[str, int]:
        """Replaced nodes per pattern, in a stable order (most first, then by name)."""
        tally: dict[str, int] = {}
        for node in self.replaced:
            tally[node.pattern] = tally.get(node.pattern, 0) + 1
        return dict(sorted(tally.items(), key=lambda item: (-item[1], item[0])))

    @property
    def changed(self) -> bool:
        return bool(self.replaced or self.taken_down or self.removed_constants or self.folded
                    or self.dropped_opset_imports or self.dropped_value_info)

    def summary(self) -> str:
        """The CLI's one-line summary, e.g.
        ``decomposed 3 nodes (OpA x2, OpB x1) -> out.onnx (opset 16)``."""
        total = len(self.replaced)
        noun = "node" if total == 1 else "nodes"
        parts = ", ".join(f"{name} x{count}" for name, count in self.counts.items())
        head = ("would decompose" if self.dry_run else "decomposed") + f" {total} {noun}"
        if parts:
            head += f" ({parts})"
        if self.output_path and not self.dry_run:
            head += f" -> {self.output_path}"
        if self.taken_down:
            head += f" (opset {self.source_opset} -> {self.opset})"
        else:
            head += f" (opset {self.opset})"
        if self.unsupported:
            head += f"; {len(self.unsupported)} unsupported node(s) kept"
        if self.fixed_inputs:
            head += f"; fixed input(s) {', '.join(self.fixed_inputs)}, folded"
        if self.inlined_functions:
            head += f"; inlined function(s) {', '.join(self.inlined_functions)}"
        if self.dropped_value_info:
            head += (f"; dropped value_info contradicting its producer: "
                     f"{', '.join(self.dropped_value_info)}")
        return head

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "input": self.input_path,
            "output": None if self.dry_run else self.output_path,
            "dry_run": self.dry_run,
            "opset": self.opset,
            "source_opset": self.source_opset if self.taken_down else None,
            "target": self.target,
            "lowered": list(self.lowered),
            "lowered_nodes": list(self.lowered_nodes),
            "warnings": list(self.warnings),
            "fixed_inputs": list(self.fixed_inputs),
            "folded": self.folded,
            "counts": self.counts,
            "replaced": [asdict(n) for n in self.replaced],
            "unsupported": [asdict(n) for n in self.unsupported],
            "dropped_opset_imports": list(self.dropped_opset_imports),
            "dropped_value_info": list(self.dropped_value_info),
            "removed_constants": self.removed_constants,
            "inlined_functions": list(self.inlined_functions),
        }
        if self.verification is not None:
            data["verification"] = self.verification.to_dict()
        return data
