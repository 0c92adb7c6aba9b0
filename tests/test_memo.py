"""Templates (decomposer.memo) change nothing: for every pattern in every form it matches,
a model holding the fuzz seed's custom node three times decomposes to the same bytes
with templates replayed as with every node built, and the copies do replay."""

from __future__ import annotations

import onnx
import pytest

import decomposer
import decomposer.engine as engine
import decomposer.memo as memo
from decomposer.graphs import OpClassifier, opset_map

from fuzz import labelled_seeds

SEEDS = labelled_seeds()


def _tripled(model: onnx.ModelProto) -> onnx.ModelProto:
    """Each non-standard node of the main graph twice more, reading the same inputs and
    writing new graph outputs."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    classifier = OpClassifier(set())
    opsets = opset_map(list(out.opset_import))
    nodes = []
    for node in out.graph.node:
        nodes.append(node)
        if classifier.is_standard(node, opsets):
            continue
        for copy_index in (1, 2):
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.name = f"{node.name or node.op_type}_copy{copy_index}"
            for position, name in enumerate(node.output):
                if name:
                    copy.output[position] = f"{name}_copy{copy_index}"
                    out.graph.output.append(onnx.ValueInfoProto(name=copy.output[position]))
            nodes.append(copy)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def _decompose(model: onnx.ModelProto, reuse: bool, monkeypatch) -> bytes | str:
    monkeypatch.setattr(engine, "REUSE_TEMPLATES", reuse)
    try:
        out = decomposer.decompose(model, allow_unsupported=True, check=False)
    except decomposer.DecomposerError as exc:
        return f"{type(exc).__name__}: {exc}"
    return out.SerializeToString(deterministic=True)


@pytest.mark.parametrize("label, model", SEEDS, ids=[label for label, _ in SEEDS])
def test_templates_give_the_bytes_a_build_gives(label, model, monkeypatch):
    replays = []
    original = memo.replay

    def counting(*args, **kwargs):
        result = original(*args, **kwargs)
        replays.append(result is not None)
        return result

    monkeypatch.setattr(memo, "replay", counting)
    tripled = _tripled(model)
    built = _decompose(tripled, False, monkeypatch)
    assert not replays
    replayed = _decompose(tripled, True, monkeypatch)
    assert replayed == built
    nested_only = len(tripled.graph.node) == len(model.graph.node)
    if isinstance(built, bytes) and not nested_only:
        assert any(replays), "identical nodes were all built anew"
