"""Templates (decomposer.memo) change nothing: for every pattern in every form it matches,
a model holding the fuzz seed's custom node three times decomposes to the same bytes
with templates replayed as with every node built, and the copies do replay."""

from __future__ import annotations

from collections.abc import Sequence

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


def _count_replays(monkeypatch) -> list[bool]:
    """Whether each call of memo.replay from now on replayed (appended as they happen)."""
    replays: list[bool] = []
    original = memo.replay

    def counting(*args, **kwargs):
        result = original(*args, **kwargs)
        replays.append(result is not None)
        return result

    monkeypatch.setattr(memo, "replay", counting)
    return replays


def _decompose(model: onnx.ModelProto, reuse: bool, monkeypatch) -> bytes | str:
    monkeypatch.setattr(engine, "REUSE_TEMPLATES", reuse)
    try:
        out = decomposer.decompose(model, allow_unsupported=True, check=False)
    except decomposer.DecomposerError as exc:
        return f"{type(exc).__name__}: {exc}"
    return out.SerializeToString(deterministic=True)


@pytest.mark.parametrize("label, model", SEEDS, ids=[label for label, _ in SEEDS])
def test_templates_give_the_bytes_a_build_gives(label, model, monkeypatch):
    replays = _count_replays(monkeypatch)
    tripled = _tripled(model)
    built = _decompose(tripled, False, monkeypatch)
    assert not replays
    replayed = _decompose(tripled, True, monkeypatch)
    assert replayed == built
    nested_only = len(tripled.graph.node) == len(model.graph.node)
    if isinstance(built, bytes) and not nested_only:
        assert any(replays), "identical nodes were all built anew"


def test_nodes_alike_but_for_their_inputs_are_built_apart(monkeypatch):
    """Same op and attributes, inputs of other static sizes (3x3 and 4x4 inverses take
    different algorithms) and types: each gets its own build, and the numbers are right."""
    import numpy as np
    from onnx import TensorProto, helper

    from decomposer.testing import run_onnxruntime

    shapes = [("a", TensorProto.FLOAT, ["B", 3, 3]), ("b", TensorProto.FLOAT, ["B", 4, 4]),
              ("c", TensorProto.DOUBLE, ["B", 3, 3]), ("d", TensorProto.FLOAT, ["B", 3, 3])]
    nodes = [helper.make_node("Inverse", [name], [f"{name}_inv"], name=f"inv_{name}",
                              domain="custom.ops") for name, _, _ in shapes]
    graph = helper.make_graph(
        nodes, "inverses", [helper.make_tensor_value_info(*spec) for spec in shapes],
        [helper.make_tensor_value_info(f"{name}_inv", elem, dims) for name, elem, dims in shapes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("custom.ops", 1)])
    assert _decompose(model, True, monkeypatch) == _decompose(model, False, monkeypatch)
    rng = np.random.default_rng(0)
    feeds = {name: (rng.normal(size=(2, *dims[1:])) + 4 * np.eye(dims[1])).astype(
        np.float64 if elem == TensorProto.DOUBLE else np.float32)
        for name, elem, dims in shapes}
    monkeypatch.setattr(engine, "REUSE_TEMPLATES", True)
    got = run_onnxruntime(decomposer.decompose(model), feeds)
    for (name, _, _), result in zip(shapes, got, strict=True):
        np.testing.assert_allclose(result, np.linalg.inv(feeds[name]), rtol=1e-4, atol=1e-5)


def _chain(names: list[str], taken: Sequence[str] = (), turns: Sequence[int] = (1, 2)
           ) -> onnx.ModelProto:
    """Rot90AndScale nodes named ``names`` in a chain, turning by ``turns`` in turn; each
    of ``taken`` is already a tensor name in the model (an Identity of the input writes
    it, and it is a graph output)."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Identity", ["x"], [name], name=f"keep{index}")
             for index, name in enumerate(taken)]
    current = "x"
    for index, name in enumerate(names):
        nodes.append(helper.make_node("Rot90AndScale", [current], [f"t{index}"], name=name,
                                      domain="custom.ops", k=turns[index % len(turns)]))
        current = f"t{index}"
    spec = ["B", 3, 5, 5]
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, spec)],
        [helper.make_tensor_value_info(current, TensorProto.FLOAT, spec)] +
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, spec) for name in taken])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("custom.ops", 1)])


def test_replayed_names_survive_any_text(monkeypatch):
    """Replays write their nodes as bytes: names with "%", non-ASCII text, names long enough
    for a two-byte length, empty names (the output name is the prefix then) and every
    prefix length up to 40 give the bytes a build gives."""
    names = ["r%b", "r%s%%", "旋转/节点", "x" * 200, "", "", "a", "ab", "abc" * 50, "r%b"]
    # Every prefix length up to 40 (field lengths of 37, byte "%"), and a prefix that makes
    # node lengths of 37 * 128 + k (a two-byte length whose second byte is "%").
    names += [f"n{'_' * size}" for size in range(40)] + ["L" * 2370]
    model = _chain(names * 2)
    built = _decompose(model, False, monkeypatch)
    assert isinstance(built, bytes)
    assert _decompose(model, True, monkeypatch) == built


def test_a_taken_name_under_a_replay_prefix_is_allocated_as_a_build_would(monkeypatch):
    """When a name the replay would write already exists (here a tensor named like the
    second node's first new tensor), the replay allocates names one by one: the same bytes
    as building every node, and no name written twice."""
    monkeypatch.setattr(engine, "REUSE_TEMPLATES", False)
    first = decomposer.decompose(_chain(["r1"], turns=[1]))
    made = [name for node in first.graph.node for name in node.output
            if name.startswith("r1/")]
    assert len(made) >= 3
    taken = [name.replace("r1/", "r2/", 1) for name in made[:3]]
    model = _chain(["r1", "r2", "r3"], taken=taken, turns=[1])
    replays = _count_replays(monkeypatch)
    built = _decompose(model, False, monkeypatch)
    replayed = _decompose(model, True, monkeypatch)
    assert replayed == built and sum(replays) == 2
    out = onnx.ModelProto.FromString(replayed)
    written = [name for node in out.graph.node for name in node.output]
    assert len(written) == len(set(written))
    assert f"{taken[0]}_1" in written  # the replay of r2 went round the taken name
