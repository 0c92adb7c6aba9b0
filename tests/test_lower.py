"""``lower``: decomposing standard ops an engine lacks (``--lower GridSample`` for onnx2torch).

In: models holding standard ONNX nodes that a pattern also rewrites (GridSample-16 in the
seed STN, Trilu-14, AffineGrid-20, GridSample-20). Out: checks that those nodes are kept by
default and decomposed only on request, with torch as the oracle for the numbers; that
bad requests fail with one clear error; that ``--verify`` checks the lowered nodes; and that
a second run changes nothing.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

import decomposer
from decomposer.cli import main
from decomposer.errors import InvalidModelError, UnsupportedNodeError
from decomposer.testing import run_onnxruntime

from _helpers import make_model, op_types

STN = Path(__file__).resolve().parent / "data" / "stn_custom.onnx"


def stn_feeds(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"image": rng.normal(size=(1, 3, 11, 9)).astype(np.float32),
            "theta": rng.uniform(-1, 1, (1, 2, 3)).astype(np.float32),
            "size": np.array([1, 64, 7, 5], np.int64)}


def stn_torch(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    weights = {t.name: torch.from_numpy(onnx.numpy_helper.to_array(t).copy())
               for t in model.graph.initializer}
    with torch.no_grad():
        features = F.conv2d(torch.from_numpy(feeds["image"]), weights["conv.weight"],
                            weights["conv.bias"])
        grid = F.affine_grid(torch.from_numpy(feeds["theta"]), feeds["size"].tolist(),
                             align_corners=False)
        return F.grid_sample(features, grid, align_corners=False).numpy()


def test_standard_gridsample_is_kept_by_default_and_lowered_on_request():
    model = onnx.load(STN)
    kept = decomposer.decompose(model)
    assert "GridSample" in op_types(kept)

    lowered, report = decomposer.decompose_with_report(model, lower=["GridSample"])
    assert "GridSample" not in op_types(lowered) and "AffineGrid" not in op_types(lowered)
    assert report.lowered == ["GridSample"] and report.to_dict()["lowered"] == ["GridSample"]
    assert sorted(node.op_type for node in report.replaced) == ["AffineGrid", "GridSample"]
    onnx.checker.check_model(lowered, full_check=True)
    feeds = stn_feeds(np.random.default_rng(0))
    got = run_onnxruntime(lowered, feeds)[0]
    np.testing.assert_allclose(got, stn_torch(model, feeds), atol=1e-5, rtol=1e-5)
    # Idempotent: nothing is left to lower.
    again, second = decomposer.decompose_with_report(lowered, lower=["GridSample"])
    assert not second.replaced and again == lowered


def test_trilu_and_affine_grid_20_are_lowered():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 4, 5])
    trilu = make_model([helper.make_node("Trilu", ["x"], ["y"], name="tri", upper=0)], [x],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 4, 5])], 14)
    out = decomposer.decompose(trilu, lower=["Trilu"])
    assert "Trilu" not in op_types(out)
    data = np.random.default_rng(1).normal(size=(2, 4, 5)).astype(np.float32)
    np.testing.assert_array_equal(run_onnxruntime(out, {"x": data})[0],
                                  torch.tril(torch.from_numpy(data)).numpy())

    theta = helper.make_tensor_value_info("theta", TensorProto.FLOAT, ["N", 2, 3])
    size = helper.make_tensor_value_info("size", TensorProto.INT64, [4])
    affine = make_model([helper.make_node("AffineGrid", ["theta", "size"], ["grid"], name="ag",
                                          align_corners=1)], [theta, size],
                        [helper.make_tensor_value_info("grid", TensorProto.FLOAT,
                                                       [None] * 4)], 20)
    out = decomposer.decompose(affine, lower=["AffineGrid"])
    assert op_types(out).count("AffineGrid") == 0
    feeds = {"theta": np.random.default_rng(2).uniform(-1, 1, (2, 2, 3)).astype(np.float32),
             "size": np.array([2, 3, 6, 5], np.int64)}
    want = F.affine_grid(torch.from_numpy(feeds["theta"]), [2, 3, 6, 5], align_corners=True)
    np.testing.assert_allclose(run_onnxruntime(out, feeds)[0], want.numpy(), atol=1e-6)


@pytest.mark.parametrize("name, message", [
    ("Frobnicate", "not a standard ONNX op"),
    # the list grows with the patterns: its start, and sorted
    ("Conv", "no pattern rewrites it (lowerable: AffineGrid, BitwiseAnd, "),
])
def test_a_bad_request_is_one_clear_error(name, message):
    with pytest.raises(InvalidModelError, match=message.replace("(", r"\(").replace(")", r"\)")):
        decomposer.decompose(onnx.load(STN), lower=[name])


def test_a_lowered_node_the_pattern_cannot_rewrite_is_reported():
    """GridSample-20 takes 5-D cubic; torch (and the pattern) have no volumetric bicubic."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 4, 5])
    grid = helper.make_tensor_value_info("g", TensorProto.FLOAT, [1, 2, 2, 2, 3])
    model = make_model([helper.make_node("GridSample", ["x", "g"], ["y"], name="cubic3d",
                                         mode="cubic")], [x, grid],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 5)], 20)
    with pytest.raises(UnsupportedNodeError, match="cubic3d"):
        decomposer.decompose(model, lower=["GridSample"])
    kept = decomposer.decompose(model, lower=["GridSample"], allow_unsupported=True)
    assert op_types(kept) == ["GridSample"]


def test_cli_lower_verifies_the_lowered_node(tmp_path, capsys):
    source = tmp_path / "stn.onnx"
    shutil.copy(STN, source)
    target, report = tmp_path / "out.onnx", tmp_path / "report.json"
    code = main([str(source), str(target), "--lower", "GridSample", "--verify",
                 "--input-value", "size=1,64,7,5", "--input-shape", "image:1x3x11x9",
                 "--report", str(report)])
    assert code == 0, capsys.readouterr().err
    data = json.loads(report.read_text())
    assert data["lowered"] == ["GridSample"]
    checked = {check["pattern"] for check in data["verification"]["checks"]}
    assert {"GridSample", "AffineGrid"} <= checked
    assert "GridSample" not in op_types(onnx.load(target))


def test_cli_bad_lower_is_one_line_exit_2(tmp_path, capsys):
    source = tmp_path / "stn.onnx"
    shutil.copy(STN, source)
    code = main([str(source), str(tmp_path / "out.onnx"), "--lower", "GridSample,Conv"])
    err = capsys.readouterr().err
    assert code == 2 and "cannot lower 'Conv'" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out.onnx").exists()
