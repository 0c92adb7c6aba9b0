"""CustomRotScale against torch.rot90(x, rotations, dims) * scale_factor, and the seed
article's CustomRotateScale module exported with torch exactly as written."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import decomposer
from decomposer.patterns.custom_rot_scale import CustomRotScale
from decomposer.testing import check_pattern

from _helpers import make_model, run_onnxruntime
from _rotation_cases import (
    KS,
    OPSETS,
    case,
    expected_ops,
    inputs,
    negative_step_slices,
    torch_rot_scale,
)
from seed_models import export_rotate_scale

DIMS = {"height,width": (-2, -1), "width,height": (-1, -2)}


def oracle(x, rotations=1, scale_factor=1.0, dims="height,width"):
    return torch_rot_scale(x, rotations, DIMS["".join(dims.split()).lower()], scale_factor)


@pytest.mark.parametrize("domain", ["", "custom.ops"])
@pytest.mark.parametrize("dims", ["height,width", "width,height"])
def test_rotations_dims_and_opsets(domain, dims):
    cases = [case({"rotations": k, "scale_factor": 1.5, "dims": dims}, label=f"k={k}")
             for k in KS]
    check_pattern(CustomRotScale(), cases, opsets=OPSETS, domain=domain, oracle=oracle,
                  atol=1e-6, rtol=0)


def test_defaults_and_spelling_variants():
    check_pattern(CustomRotScale(), [case({}), case({"dims": " Width , Height "}),
                                     case({"rotations": 4, "scale_factor": 1.0})],
                  opsets=[13, 20], domain="", oracle=oracle, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int64])
def test_dtypes_preserved(dtype):
    check_pattern(CustomRotScale(), [case({"rotations": 1, "scale_factor": 3.0}, dtype=dtype)],
                  opsets=[11, 23], oracle=oracle, atol=0, rtol=0)


def test_bad_dims_string_names_the_node():
    node = helper.make_node("CustomRotScale", ["x"], ["y"], name="rs", domain="custom.ops",
                            dims="depth,width")
    model = make_model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                              ["N", "C", "H", "W"])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 4)], 18,
                       extra_opsets=["custom.ops"])
    with pytest.raises(decomposer.UnsupportedNodeError) as info:
        decomposer.decompose(model)
    assert "node 'rs' (custom.ops::CustomRotScale)" in str(info.value)
    assert "attribute 'dims': 'depth,width' is not one of" in str(info.value)


def test_seed_article_module_exported_as_written(tmp_path):
    src = tmp_path / "rotate_model.onnx"
    module = export_rotate_scale(src)
    original = onnx.load(src)
    (node,) = original.graph.node
    assert (node.domain, node.op_type) == ("", "CustomRotScale")
    out = decomposer.decompose(original)
    onnx.checker.check_model(out, full_check=True)
    # k=2 is a double flip: rows, then columns as swap/rows/swap; no negative-step Slice.
    assert Counter(n.op_type for n in out.graph.node if n.op_type != "Constant") == \
        expected_ops(2, scaled=True)
    assert not negative_step_slices(out)
    for shape in [(1, 3, 224, 224), (2, 3, 5, 9)]:
        (x,) = inputs(shapes=[shape])[0]
        # The static export fixes the input shape; run the graph on the shape it declares.
        if shape != (1, 3, 224, 224):
            out.graph.input[0].type.tensor_type.shape.Clear()
            for _ in shape:
                out.graph.input[0].type.tensor_type.shape.dim.add()
        (got,) = run_onnxruntime(out, {"input": x})
        with torch.no_grad():
            np.testing.assert_allclose(got, module(torch.from_numpy(x)).numpy(), atol=1e-6,
                                       rtol=0)
