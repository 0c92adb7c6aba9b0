"""AffineGrid pattern: every form, opset, rank, size mode and dtype, against torch.

Oracle: ``torch.nn.functional.affine_grid`` (the custom node's ``forward``), plus ONNX's own
backend test data where ONNX and torch agree.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

import decomposer
from decomposer.patterns.affine_grid import AffineGrid, affine_grid_reference
from decomposer.testing import Case, check_pattern

from _helpers import FLOAT_TYPES, custom_nodes, make_model, run_onnxruntime

RUNTIME_SIZES = {
    2: [(2, 3, 5, 7), (1, 1, 1, 1), (3, 2, 1, 6), (1, 4, 8, 1), (2, 1, 16, 9)],
    3: [(2, 1, 3, 4, 5), (1, 1, 1, 1, 1), (1, 2, 1, 5, 1), (2, 1, 4, 1, 3)],
}
# 28 is the newest opset of onnx 1.23, and ONNX Runtime 1.32 runs it; newer onnx releases
# are tested up to what they define.
CUSTOM_OPSETS = [o for o in (11, 13, 16, 17, 18, 19, 20, 21, 23, 25, 28)
                 if o <= onnx.defs.onnx_opset_version()]
DEFAULT_DOMAIN_OPSETS = [11, 13, 16, 17, 18, 19]


def torch_grid(theta: np.ndarray, size, align_corners: int) -> np.ndarray:
    """The oracle: torch's affine_grid, in float64 then rounded to theta's dtype."""
    grid = F.affine_grid(torch.from_numpy(theta.astype(np.float64)), list(map(int, size)),
                         align_corners=bool(align_corners))
    return grid.numpy().astype(theta.dtype)


def affine_model(*, domain="custom.ops", opset=16, k=2, align=0, size_mode="input",
                 dtype=np.float32, const_size=None, form="native") -> onnx.ModelProto:
    """theta (N, k, k+1) and a size fed as a graph input, Shape(x), or a constant."""
    elem = FLOAT_TYPES[dtype]
    inputs = [helper.make_tensor_value_info("theta", elem, ["N", k, k + 1])]
    nodes, inits = [], []
    if size_mode == "input":
        inputs.append(helper.make_tensor_value_info("size", TensorProto.INT64, [k + 2]))
    elif size_mode == "shape":
        spatial = ["D", "H", "W"][3 - k:]
        inputs.append(helper.make_tensor_value_info("x", elem, ["N", "C", *spatial]))
        nodes.append(helper.make_node("Shape", ["x"], ["size"], name="shape_of_x"))
    elif size_mode == "constant":
        inits.append(onnx.numpy_helper.from_array(np.array(const_size, np.int64), "size"))
    extra = []
    if form == "native":
        attrs = {} if align is None else {"align_corners": align}
        nodes.append(helper.make_node("AffineGrid", ["theta", "size"], ["grid"], name="affine",
                                      domain=domain, **attrs))
        if domain not in ("", "ai.onnx"):
            extra.append(domain)
    else:  # torch's ATen fallbacks, align_corners a constant bool input
        nodes.append(helper.make_node("Constant", [], ["align"], name="align_const",
                                      value=helper.make_tensor("v", TensorProto.BOOL, [],
                                                               [bool(align)])))
        if form == "aten_fallthrough":
            nodes.append(helper.make_node("affine_grid_generator", ["theta", "size", "align"],
                                          ["grid"], name="affine", domain="org.pytorch.aten"))
        else:
            nodes.append(helper.make_node("ATen", ["theta", "size", "align"], ["grid"],
                                          name="affine", domain="org.pytorch.aten",
                                          operator="affine_grid_generator", overload_name=""))
        extra.append("org.pytorch.aten")
    outputs = [helper.make_tensor_value_info("grid", elem, [None] * (k + 2))]
    return make_model(nodes, inputs, outputs, opset, extra_opsets=extra, initializers=inits)


def feeds_for(model: onnx.ModelProto, size, dtype, rng) -> dict[str, np.ndarray]:
    k = len(size) - 2
    theta = rng.uniform(-1.5, 1.5, (size[0], k, k + 1)).astype(dtype)
    names = {i.name for i in model.graph.input}
    feeds = {"theta": theta}
    if "size" in names:
        feeds["size"] = np.array(size, np.int64)
    if "x" in names:
        feeds["x"] = np.zeros(size, dtype)
    return feeds


def expected_ops(k: int, align: int, dtype=np.float32, size_fed: bool = True,
                 target: str = "portable", grid_is_output: bool = True) -> Counter:
    """The factored form: only the last MatMul and Reshape (2-D; target ort, float32: one
    Conv) or Mul and Add (3-D) are output-sized; nothing is baked or looped. Shape nodes, and
    the Slice that takes one dim of a shape below opset 15, are not counted."""
    # coords per axis: Gather, Sub (1 - n), an integer Range, Cast (steps and n), Div;
    # one Transpose: of theta, or (2-D portable) of the small product R.
    ops = Counter({"Cast": 2 * k, "Gather": k, "Sub": k, "Range": k, "Div": k, "Transpose": 1})
    if k == 2 and not (target == "ort" and dtype != np.float64):
        # Portable (and float64, which has no Conv kernel): Reshape(L @ R), L = Pad(y) = (y, 1);
        # R = Transpose(coef @ (x, 1)^T) (Unsqueeze, Pad, MatMul), coef a Gather of theta's
        # rows with a zero column (Pad), viewed as (N, 2, W*2); both targets are Concats of
        # shape pieces, W*2 read from the basis reshaped to 1-D.
        ops.update({"Pad": 3, "Gather": 1, "Unsqueeze": 2, "MatMul": 2, "Reshape": 3,
                    "Concat": 2})
        if grid_is_output and dtype != np.float16:
            ops.update({"Sub": 1})  # Sub(view, 0) writes the caller's buffer, not a Reshape
    else:
        # theta's columns: Unsqueeze, Split; each Expanded over W (R_x, R_t, R_y);
        # R_c = x * R_x + R_t, x Unsqueezed to full rank.
        ops.update({"Unsqueeze": 2, "Split": 1, "Mul": 1, "Add": 1, "Expand": 3})
        if k == 2:
            # L = (y, 1) as the weight of a 1x1 Conv over R = [R_y; R_c]: writes (N, H, W, 2).
            ops.update({"Concat": 1, "Unsqueeze": 1, "Pad": 1, "Conv": 1})
            if not size_fed:  # Slice/Concat keep the weight from being constant-folded
                ops.update({"Slice": 1, "Concat": 1})
        else:
            # z * R_z + (y * R_y + R_c): one broadcast Add writes (N, D, H, W, 3).
            ops.update({"Expand": 1, "Unsqueeze": 2, "Mul": 2, "Add": 2})
    if align:
        # max(n - 1, 1) on n gathered again as a (1,) tensor (TVM's Max takes no 0-d size)
        ops.update({"Sub": k, "Max": k, "Gather": k})
    if dtype == np.float16:
        ops.update({"Cast": 2})  # theta to float32, grid back to float16
    return ops


def decomposed_ops(model: onnx.ModelProto, keep=("Shape",)) -> Counter:
    shapes = {n.output[0] for n in model.graph.node if n.op_type == "Shape"}
    return Counter(n.op_type for n in model.graph.node
                   if n.op_type != "Constant" and n.op_type not in keep
                   and not (n.op_type == "Slice" and n.input[0] in shapes))


def assert_matches_torch(model, sizes, align, dtype=np.float32, atol=1e-5):
    rng = np.random.default_rng(0)
    worst = 0.0
    for size in sizes:
        feeds = feeds_for(model, size, dtype, rng)
        (grid,) = run_onnxruntime(model, feeds)
        expected = torch_grid(feeds["theta"], size, align)
        assert grid.dtype == expected.dtype and grid.shape == expected.shape, size
        error = float(np.max(np.abs(grid.astype(np.float64) - expected.astype(np.float64))))
        worst = max(worst, error)
        assert error <= atol, f"size {size}: max abs error {error:.3g} > {atol}"
    return worst


@pytest.mark.parametrize("opset", CUSTOM_OPSETS)
@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("size_mode", ["input", "shape"])
def test_custom_domain_dynamic_size(opset, k, align, size_mode):
    model = affine_model(opset=opset, k=k, align=align, size_mode=size_mode)
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    assert not custom_nodes(out)
    assert decomposed_ops(out) == expected_ops(k, align, size_fed=size_mode == "input")
    assert [i.domain for i in out.opset_import] == [""]
    assert_matches_torch(out, RUNTIME_SIZES[k], align)


@pytest.mark.parametrize("opset", [11, 16, 20])
@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("align", [0, 1])
def test_constant_size(opset, k, align):
    size = RUNTIME_SIZES[k][0]
    model = affine_model(opset=opset, k=k, align=align, size_mode="constant", const_size=size)
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    assert decomposed_ops(out) == expected_ops(k, align, size_fed=False)
    assert_matches_torch(out, [size], align)


@pytest.mark.parametrize("opset", [11, 17])
@pytest.mark.parametrize("also_output", [False, True])
def test_graph_output_grid_is_written_by_an_elementwise_op(opset, also_output):
    """A 2-D grid that is a graph output ends in Sub(view, 0), not in a Reshape (which
    ONNX Runtime copies into the caller's buffer on one thread); a grid only a node reads
    ends in the Reshape, whose view is free. Both against torch."""
    model = affine_model(opset=opset, k=2)
    graph = model.graph
    graph.node.append(helper.make_node("Neg", ["grid"], ["neg_grid"], name="consumer"))
    neg_out = helper.make_tensor_value_info("neg_grid", TensorProto.FLOAT, ["N", "H", "W", 2])
    if also_output:
        graph.output.append(neg_out)
    else:
        graph.output.pop()
        graph.output.append(neg_out)
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    consumer = [n.op_type for n in out.graph.node].index("Neg")
    ops = decomposed_ops(onnx.helper.make_model(
        helper.make_graph(out.graph.node[:consumer], "g", [], []), opset_imports=[]))
    assert ops == expected_ops(2, 0, grid_is_output=also_output)
    producers = {o: n for n in out.graph.node for o in n.output}
    producer = producers["grid"]
    if also_output:
        assert producer.op_type == "Sub"
        zero = producers[producer.input[1]]
        assert onnx.numpy_helper.to_array(zero.attribute[0].t).reshape(-1).tolist() == [0]
    else:
        assert producer.op_type == "Reshape"
    rng = np.random.default_rng(1)
    for size in RUNTIME_SIZES[2]:
        feeds = feeds_for(out, size, np.float32, rng)
        got = dict(zip([o.name for o in out.graph.output], run_onnxruntime(out, feeds),
                       strict=True))
        expected = torch_grid(feeds["theta"], size, 0)
        np.testing.assert_allclose(got["neg_grid"], -expected, atol=1e-5, rtol=0)
        if also_output:
            np.testing.assert_array_equal(got["grid"], -got["neg_grid"])


@pytest.mark.parametrize("opset", DEFAULT_DOMAIN_OPSETS)
@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("align", [0, 1])
def test_default_domain_below_opset_20(opset, k, align):
    model = affine_model(domain="", opset=opset, k=k, align=align)
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    assert "AffineGrid" not in [n.op_type for n in out.graph.node]
    assert_matches_torch(out, RUNTIME_SIZES[k], align)


@pytest.mark.parametrize("opset", [20, 21])
def test_default_domain_at_opset_20_is_standard_and_untouched(opset):
    model = affine_model(domain="", opset=opset)
    out, report = decomposer.decompose_with_report(model)
    assert out.SerializeToString(deterministic=True) == model.SerializeToString(
        deterministic=True)
    assert report.replaced == [] and report.unsupported == []


@pytest.mark.parametrize("domain", ["custom", "Custom", "ai.onnx.contrib", "my.company.ops"])
def test_any_custom_domain_spelling(domain):
    out = decomposer.decompose(affine_model(domain=domain, opset=17, k=2, align=1))
    assert [i.domain for i in out.opset_import] == [""]
    assert_matches_torch(out, RUNTIME_SIZES[2], 1)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
@pytest.mark.parametrize("opset", [11, 17])
@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("align", [0, 1])
def test_dtypes(dtype, opset, k, align):
    out = decomposer.decompose(affine_model(opset=opset, k=k, align=align, dtype=dtype))
    onnx.checker.check_model(out, full_check=True)
    assert decomposed_ops(out) == expected_ops(k, align, dtype)
    # float16 is computed in float32 and rounded once: within one float16 ulp near 2.
    assert_matches_torch(out, RUNTIME_SIZES[k], align, dtype,
                         atol=2e-3 if dtype == np.float16 else 1e-10)


@pytest.mark.parametrize("opset", [11, 17])
@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("size_mode", ["input", "shape", "constant"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_target_ort_forms(opset, k, size_mode, dtype):
    """--target ort: the 2-D float32 grid comes from a 1x1 Conv (kept dynamic unless size is
    fed); everything else is the portable form."""
    size = RUNTIME_SIZES[k][0]
    model = affine_model(opset=opset, k=k, size_mode=size_mode, const_size=size, dtype=dtype)
    out = decomposer.decompose(model, target="ort")
    onnx.checker.check_model(out, full_check=True)
    assert decomposed_ops(out) == expected_ops(k, 0, dtype, size_fed=size_mode == "input",
                                               target="ort")
    sizes = [size] if size_mode == "constant" else RUNTIME_SIZES[k]
    assert_matches_torch(out, sizes, 0, dtype, atol=1e-5 if dtype == np.float32 else 1e-10)


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("size_mode", ["input", "constant"])
def test_portable_form_has_no_conv_and_no_fold_barrier(k, size_mode):
    model = affine_model(k=k, size_mode=size_mode, const_size=RUNTIME_SIZES[k][0])
    out = decomposer.decompose(model)
    kinds = set(decomposed_ops(out))
    # The fold barrier is an empty Slice of R concatenated to the weight; slices of shapes
    # (one dim, below opset 15) are not counted by decomposed_ops.
    assert not kinds & {"Conv", "ConvTranspose", "Slice"}, kinds
    # Every Concat builds a shape: its inputs are Shape outputs (sliced or not) and
    # constants, never tensor data.
    producers = {o: n for n in out.graph.node for o in n.output}
    for node in out.graph.node:
        if node.op_type == "Concat":
            for name in node.input:
                source = producers[name]
                if source.op_type == "Slice":
                    source = producers[source.input[0]]
                assert source.op_type in ("Shape", "Constant"), (node.name, name)


def test_align_corners_defaults_to_zero():
    out = decomposer.decompose(affine_model(align=None))
    assert_matches_torch(out, RUNTIME_SIZES[2], 0)


@pytest.mark.parametrize("form", ["aten_fallthrough", "aten_fallback"])
@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("k", [2, 3])
def test_aten_forms(form, align, k):
    model = affine_model(form=form, align=align, k=k, size_mode="shape", opset=16)
    out, report = decomposer.decompose_with_report(model)
    onnx.checker.check_model(out, full_check=True)
    assert [i.domain for i in out.opset_import] == [""]
    # The align_corners constant fed only the replaced node: it is gone too.
    assert "align_const" not in [n.name for n in out.graph.node]
    assert report.removed_constants == 1
    assert_matches_torch(out, RUNTIME_SIZES[k], align)


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("align", [0, 1])
def test_pattern_kit_against_reference_and_torch(k, align):
    rng = np.random.default_rng(1)
    cases = []
    for dtype in (np.float32, np.float64):
        sizes = RUNTIME_SIZES[k]
        sets = [[rng.uniform(-1, 1, (s[0], k, k + 1)).astype(dtype), np.array(s, np.int64)]
                for s in sizes]
        cases.append(Case(sets[0], {"align_corners": align}, symbolic={0: [0]},
                          more_inputs=sets[1:], output_rank=k + 2,
                          id=f"{k}d-{np.dtype(dtype).name}"))
    results = check_pattern(AffineGrid(), cases, opsets=[11, 13, 18, 20],
                            oracle=lambda theta, size, align_corners=0: torch_grid(
                                theta, size, align_corners))
    assert all(r.max_abs_error < 1e-5 for r in results)


def test_reference_matches_torch():
    rng = np.random.default_rng(2)
    for k, sizes in RUNTIME_SIZES.items():
        for size in sizes:
            for align in (0, 1):
                theta = rng.normal(size=(size[0], k, k + 1))
                np.testing.assert_allclose(affine_grid_reference(theta, size, align),
                                           torch_grid(theta, size, align), atol=1e-12)


def _backend_cases():
    from onnx.backend.test.case.node import collect_testcases

    return [c for c in collect_testcases(None)
            if c.name.startswith("test_affine_grid") and not c.name.endswith("_expanded")]


@pytest.mark.parametrize("case", _backend_cases(), ids=lambda c: c.name)
@pytest.mark.parametrize("home", ["custom.ops@20", "default@16", "custom.ops@11"])
def test_onnx_backend_cases_rehomed(case, home):
    domain, opset = home.split("@")
    domain = "" if domain == "default" else domain
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    model.graph.node[0].domain = domain
    del model.opset_import[:]
    model.opset_import.extend([helper.make_opsetid("", int(opset))] +
                              ([helper.make_opsetid(domain, 1)] if domain else []))
    model.ir_version = helper.find_min_ir_version_for(list(model.opset_import), True)
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    inputs, (expected_onnx,) = case.data_sets[0]
    theta, size = inputs
    (grid,) = run_onnxruntime(out, {"theta": theta, "size": size})
    align = next((a.i for a in case.model.graph.node[0].attribute
                  if a.name == "align_corners"), 0)
    np.testing.assert_allclose(grid, torch_grid(theta, size, align), atol=1e-5, rtol=0)
    # ONNX's stored outputs agree with torch here (no spatial size of 1 in these cases).
    np.testing.assert_allclose(grid, expected_onnx, atol=1e-5, rtol=0)


# -- rejections: the reason is part of the contract ------------------------------------------


def _rejection(model) -> str:
    with pytest.raises(decomposer.UnsupportedNodeError) as info:
        decomposer.decompose(model)
    assert "'affine'" in str(info.value) and "AffineGrid" in str(info.value)
    return str(info.value)


def test_unknown_rank_is_rejected_with_reason():
    # theta and size both come out of a Reshape to a run-time shape: rank and length unknown.
    reshapes = [helper.make_node("Reshape", ["theta_raw", "theta_shape"], ["theta"]),
                helper.make_node("Reshape", ["size_raw", "size_shape"], ["size"])]
    inputs = [helper.make_tensor_value_info("theta_raw", TensorProto.FLOAT, ["A"]),
              helper.make_tensor_value_info("theta_shape", TensorProto.INT64, ["R"]),
              helper.make_tensor_value_info("size_raw", TensorProto.INT64, ["B"]),
              helper.make_tensor_value_info("size_shape", TensorProto.INT64, ["S"])]
    node = helper.make_node("AffineGrid", ["theta", "size"], ["grid"], name="affine",
                            domain="custom.ops")
    model = make_model([*reshapes, node], inputs,
                       [helper.make_tensor_value_info("grid", TensorProto.FLOAT, [None] * 4)],
                       16, extra_opsets=["custom.ops"])
    assert "cannot tell 2-D from 3-D" in _rejection(model)


def test_conflicting_rank_is_rejected():
    model = affine_model(k=2)
    model.graph.input[1].type.tensor_type.shape.dim[0].dim_value = 5
    assert "theta says 2-D but size says 3-D" in _rejection(model)


def test_bad_align_corners_value_is_rejected():
    model = affine_model(align=2)
    assert "align_corners" in _rejection(model)


def test_unknown_attribute_is_rejected():
    model = affine_model()
    model.graph.node[0].attribute.append(helper.make_attribute("align_corner", 1))
    assert "unknown attribute(s) ['align_corner']" in _rejection(model)


def test_integer_theta_is_rejected():
    model = affine_model()
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.INT32
    assert "theta must be float16, float32 or float64" in _rejection(model)


def test_aten_with_runtime_align_corners_is_rejected():
    model = affine_model(form="aten_fallback", size_mode="shape")
    model.graph.node.remove(next(n for n in model.graph.node if n.name == "align_const"))
    model.graph.input.append(helper.make_tensor_value_info("align", TensorProto.BOOL, []))
    assert "align_corners (input 3) must be a constant" in _rejection(model)


@pytest.mark.parametrize("opset", [11, 18])
def test_int32_size(opset):
    """An int32 size gives an int32 Range (TensorRT's preferred index type)."""
    model = affine_model(opset=opset, k=2, align=1)
    model.graph.input[1].type.tensor_type.elem_type = TensorProto.INT32
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    rng = np.random.default_rng(5)
    for size in RUNTIME_SIZES[2]:
        theta = rng.uniform(-1, 1, (size[0], 2, 3)).astype(np.float32)
        (grid,) = run_onnxruntime(out, {"theta": theta, "size": np.array(size, np.int32)})
        np.testing.assert_allclose(grid, torch_grid(theta, size, 1), atol=1e-6, rtol=0)


@pytest.mark.parametrize("target", ["portable", "ort"])
@pytest.mark.parametrize("size", [(0, 1, 4, 5), (0, 1, 3, 4, 5)])
def test_empty_batch_gives_an_empty_grid(size, target):
    """A detector that found no boxes feeds an STN an empty batch. torch refuses N = 0, so
    the oracle is ONNX's own AffineGrid-20 (its reference implementation): an empty grid
    of shape (0, (D,) H, W, k), not an error."""
    from onnx.reference import ReferenceEvaluator

    k = len(size) - 2
    out = decomposer.decompose(affine_model(k=k), target=target)
    feeds = {"theta": np.zeros((0, k, k + 1), np.float32), "size": np.array(size, np.int64)}
    (grid,) = run_onnxruntime(out, feeds)
    (expected,) = ReferenceEvaluator(affine_model(domain="", opset=20, k=k)).run(None, feeds)
    assert grid.shape == expected.shape == (0, *size[2:], k)
