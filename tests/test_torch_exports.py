"""Real torch exports, decomposed and run on stock ONNX Runtime, against torch eager."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from torch.onnx import OperatorExportTypes

import decomposer

from _helpers import run_onnxruntime
from seed_models import export_classic_stn, export_seed_stn


def test_seed_stn_end_to_end(tmp_path):
    src = tmp_path / "stn.onnx"
    model = export_seed_stn(src)
    original = onnx.load(src)
    assert [(n.domain, n.op_type) for n in original.graph.node] == [
        ("", "Conv"), ("custom.ops", "AffineGrid"), ("", "GridSample")]
    report = decomposer.decompose_file(src, tmp_path / "out.onnx")
    assert report.counts == {"AffineGrid": 1}
    out = onnx.load(tmp_path / "out.onnx")
    onnx.checker.check_model(out, full_check=True)
    assert {i.domain for i in out.opset_import} == {""}
    # Dynamic axes: several image sizes and grid sizes through one model.
    rng = np.random.default_rng(0)
    for image_hw, size in [((34, 40), (1, 64, 16, 24)), ((66, 66), (1, 64, 33, 7)),
                           ((10, 12), (1, 64, 1, 5))]:
        image = rng.normal(size=(1, 3, *image_hw)).astype(np.float32)
        theta = rng.uniform(-1, 1, (1, 2, 3)).astype(np.float32)
        size_arr = np.array(size, np.int64)
        (got,) = run_onnxruntime(out, {"image": image, "theta": theta, "size": size_arr})
        with torch.no_grad():
            expected = model(torch.from_numpy(image), torch.from_numpy(theta),
                             torch.from_numpy(size_arr)).numpy()
        assert got.shape == expected.shape
        np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("export_type", [OperatorExportTypes.ONNX_FALLTHROUGH,
                                         OperatorExportTypes.ONNX_ATEN_FALLBACK],
                         ids=["fallthrough", "aten_fallback"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_classic_stn_size_from_shape(tmp_path, export_type, align_corners):
    src = tmp_path / "classic.onnx"
    model = export_classic_stn(src, export_type, align_corners)
    original = onnx.load(src)
    aten = [n for n in original.graph.node if n.domain == "org.pytorch.aten"]
    assert len(aten) == 1  # affine_grid_generator, size computed from Shape(x)
    assert "Shape" in [n.op_type for n in original.graph.node]
    out = decomposer.decompose(original)
    onnx.checker.check_model(out, full_check=True)
    assert {i.domain for i in out.opset_import} == {""}
    rng = np.random.default_rng(1)
    for shape in [(2, 3, 16, 20), (1, 3, 7, 3), (3, 3, 1, 9)]:
        x = rng.normal(size=shape).astype(np.float32)
        (got,) = run_onnxruntime(out, {"x": x})
        with torch.no_grad():
            expected = model(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4)
