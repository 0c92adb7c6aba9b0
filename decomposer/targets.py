"""What ``--target`` names, resolved into what a run does.

In: a target string. It is a mode (``portable``, ``ort``, ``qdq``), an engine that has a
profile in ``decomposer/data/engine_support.json`` (``opencv``, ``ncnn``, ``mnn``,
``tract``, ``rknn``, ``openvino``, ``tvm``, ``onnx2torch``, ``onnx2tf``, ``tensorrt``,
``tensorrt8.6``), or several of these joined by commas (``rknn,openvino``: one model that
runs on each). Out: :func:`resolve` gives a :class:`Target`:

- ``mode``: what the patterns are told (``Builder.target``). Every engine target is
  ``portable`` (ONNX Runtime's contrib ops count as unsupported) unless ``qdq`` is named
  with it; ``ort`` stands alone (it keeps ONNX Runtime-only ops no other engine has).
- ``engines``: the engines named, in the order given.
- ``max_opset``: the lowest opset cap of their profiles (RKNN reads opset 19 at most); a
  model above it is taken down as ``--target-opset`` would.
- ``fold``: one of them needs shape arithmetic over static sizes folded to constants
  (ncnn and RKNN refuse a Range whose size is computed): the model is folded first
  (:mod:`decomposer.freezing`).

:meth:`Target.lacked` names the op types they lack outright (the patterns see it in
``MatchContext.avoid``). :meth:`Target.lowering` then says, for one model, which nodes to
decompose although their opset defines them: every node a gap of one of the engines
holds for (the gap's op, condition and opset range, ``decomposer.engine_support``) where
the gap names a pattern (``lower``). A gap with no pattern is left to ``decomposer check
--engines``.

Under ``portable`` and ``qdq`` (no engine named) the gaps of the data file's
``majority_wrong`` list are lowered too: ops that most measured engines compute with other
numbers, silently. Where the pattern cannot lower such a node (a size known only at run
time), the node is kept and the run warns (:attr:`Lowering.soft`); under an engine target
that refusal is an unsupported node, since that engine would run it wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import onnx

from decomposer.engine_support import _data, gap_nodes, gaps, majority_wrong
from decomposer.errors import InvalidModelError
from decomposer.graphs import lowered_node_key, opset_map

__all__ = ["MODES", "Lowering", "Target", "engine_targets", "resolve"]

MODES = ("portable", "ort", "qdq")


def engine_targets() -> list[str]:
    """The engines ``--target`` accepts: every profile of the data file."""
    return list(_data()["profiles"])


@dataclass(frozen=True)
class Lowering:
    """The standard nodes a run decomposes for its target.

    ``nodes``: ``"OpType:first output"`` (how ``OpClassifier``'s ``lowered`` names one
    node) -> why (the gap's engine and evidence). ``soft``: the first outputs of the nodes
    kept with a warning when their pattern refuses them."""

    nodes: dict[str, str] = field(default_factory=dict)
    soft: frozenset[str] = frozenset()

    @property
    def keys(self) -> frozenset[str]:
        return frozenset(self.nodes)

    def reason(self, output: str) -> str:
        return next((why for key, why in self.nodes.items()
                     if key.split(":", 1)[1] == output), "")

    def union(self, other: Lowering) -> Lowering:
        hard = {key.split(":", 1)[1] for part in (self, other) for key in part.nodes
                if key.split(":", 1)[1] not in part.soft}
        return Lowering({**self.nodes, **other.nodes}, (self.soft | other.soft) - hard)

    def only(self, known: Callable[[str], bool]) -> Lowering:
        """The nodes whose op type ``known`` accepts (a pattern lowers it)."""
        kept = {key: why for key, why in self.nodes.items() if known(key.split(":", 1)[0])}
        outputs = {key.split(":", 1)[1] for key in kept}
        return Lowering(kept, frozenset(self.soft & outputs))


@dataclass(frozen=True)
class Target:
    spelling: str
    mode: str
    engines: tuple[str, ...] = ()
    max_opset: int | None = None
    fold: bool = False  # an engine needs static shape arithmetic folded (its profile)

    def opset_cap(self, model: onnx.ModelProto) -> int | None:
        """The opset to take ``model`` down to for these engines, or None: the profiles'
        cap, and the ``take_down`` opset of each gap it hits (where decomposer.opsets
        writes the op in an older form, or without it: ONNX's function body or a
        pattern), measured to run on the engine."""
        caps = [self.max_opset] if self.max_opset is not None else []
        if self.engines:
            caps += [int(entry["take_down"]) for _, entry, _ in
                     gap_nodes(model, list(self.engines)) if entry.get("take_down")]
        return min(caps) if caps else None

    def lacked(self, opset: int) -> frozenset[str]:
        """The op types one of these engines lacks outright at ``opset``: a gap with no
        condition, in its opset range and above its ``take_down`` opset (below it the op is
        written in a form the engine runs). Patterns are told to write something else."""
        return frozenset(
            entry["op"] for entry in gaps()
            if entry["engine"] in self.engines and not entry.get("when") and
            int(entry.get("min_opset", 0)) <= opset <= int(entry.get("max_opset", 10**6))
            and opset > int(entry.get("take_down", 0)))

    def lowering(self, model: onnx.ModelProto, opset: int | None = None) -> Lowering:
        """The nodes of ``model`` (at ``opset``, default its own) this target lowers."""
        if self.mode == "ort":
            return Lowering()
        if opset is None:
            opset = opset_map(list(model.opset_import)).get("", 1)
        nodes: dict[str, str] = {}
        for _, entry, node in gap_nodes(model, list(self.engines), opset):
            if entry.get("lower") and node.output:
                nodes[lowered_node_key(node)] = f"{entry['engine']}: {entry['evidence']}"
        soft: set[str] = set()
        if not self.engines:
            for _, entry, node in gap_nodes(model, None, opset, majority_wrong()):
                if entry.get("lower") and node.output and \
                        lowered_node_key(node) not in nodes:
                    nodes[lowered_node_key(node)] = entry["evidence"]
                    soft.add(node.output[0])
        return Lowering(nodes, frozenset(soft))


def resolve(spelling: str) -> Target:
    """The :class:`Target` a ``--target`` value names; InvalidModelError for a bad one."""
    names = [part.strip() for part in str(spelling).split(",") if part.strip()]
    profiles = _data()["profiles"]
    unknown = [name for name in names if name not in MODES and name not in profiles]
    if not names or unknown:
        raise InvalidModelError(
            f"unknown target {', '.join(unknown) or repr(spelling)}; use one of: "
            f"{', '.join(MODES)}, or engines {', '.join(profiles)} (several joined by commas)")
    modes = [name for name in names if name in MODES]
    engines = tuple(dict.fromkeys(name for name in names if name not in MODES))
    if len(set(modes)) > 1 or ("ort" in modes and engines):
        raise InvalidModelError(
            f"target {spelling!r} mixes {', '.join(dict.fromkeys(modes + list(engines)))}: "
            "ort keeps ONNX Runtime-only ops, which no other engine runs; name one mode, "
            "with engines or not")
    caps = [int(profiles[name]["max_opset"]) for name in engines
            if profiles[name].get("max_opset")]
    return Target(",".join(names), modes[0] if modes else "portable", engines,
                  min(caps) if caps else None,
                  any(profiles[name].get("fold") for name in engines))
