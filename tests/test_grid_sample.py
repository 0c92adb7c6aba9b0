"""GridSample / grid_sampler against torch.nn.functional.grid_sample, through the pattern kit.

Every mode x padding x align_corners x dtype x 2-D/3-D combination runs on ONNX Runtime
against torch eager (the oracle) and the pattern's numpy reference, with every dim dynamic
and further input sets of other sizes (H or W = 1 included); then exact nearest ties,
pixel centres, far out-of-range and NaN/inf grids, every matching form (custom domain with
the opset-16 and opset-20 spellings, default domain below 16, torch's ATen fallthrough and
fallback nodes, mmcv), rejections, and torch-exported spatial transformers end to end.
"""

from __future__ import annotations

import functools
import io
import itertools
import warnings

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper
from torch.onnx import OperatorExportTypes

import decomposer
from decomposer.patterns.grid_sample import (
    GridSample,
    channel_chunks,
    grid_sample_reference,
)
from decomposer.registry import default_registry
from decomposer.testing import Case
from decomposer.testing import check_pattern as kit_check_pattern

from _helpers import make_model, run_onnxruntime
from seed_models import ClassicSTN, SpatialTransformer

# Empty output sizes (a grid with H_out or W_out 0) fail in the decomposition's last Reshape
# (a run-time target holding 0 copies a dim): a known defect, kept visible by
# tests/test_testing_kit.py::test_known_empty_size_defects; size 1 is still derived here.
check_pattern = functools.partial(kit_check_pattern, edge_sizes=(1,))

MODES_2D = ["bilinear", "nearest", "bicubic"]
MODES_3D = ["bilinear", "nearest"]
PADDINGS = ["zeros", "border", "reflection"]
DTYPES = [np.float32, np.float64, np.float16]
OPSETS = [11, 13, 16, 20, 21]
MODE_CODES = {"bilinear": 0, "nearest": 1, "bicubic": 2}
PADDING_CODES = {"zeros": 0, "border": 1, "reflection": 2}
TOLERANCE = {np.float32: 2e-5, np.float64: 1e-9, np.float16: 2e-3}


# -- the oracle -------------------------------------------------------------------------------


def torch_grid_sample(x, grid, mode, padding, align_corners):
    """torch eager; float16 is computed by torch in float32 and rounded once (what the
    decomposition promises), mixed dtypes in the wider one."""
    x, grid = np.asarray(x), np.asarray(grid)
    wide = np.float64 if np.float64 in (x.dtype, grid.dtype) else np.float32
    with torch.no_grad():
        result = F.grid_sample(torch.from_numpy(x.astype(wide)),
                               torch.from_numpy(grid.astype(wide)), mode=mode,
                               padding_mode=padding, align_corners=bool(align_corners))
    return result.numpy().astype(x.dtype)


def onnx_oracle(x, grid, mode="bilinear", padding_mode="zeros", align_corners=0):
    """The ONNX attribute spellings (any case, opset 16 or 20 names) in torch's terms."""
    mode = mode.strip().lower()
    mode = {"linear": "bilinear", "cubic": "bicubic"}.get(mode, mode)
    return torch_grid_sample(x, grid, mode, padding_mode.strip().lower(), align_corners)


def mmcv_oracle(x, grid, interpolation_mode=0, padding_mode=0, align_corners=0):
    return torch_grid_sample(x, grid, MODES_2D[interpolation_mode], PADDINGS[padding_mode],
                             align_corners)


# -- inputs -----------------------------------------------------------------------------------


def make_grid(rng, shape, special=True):
    """Uniform in [-1.25, 1.25] plus exact borders, the centre and far out-of-range values."""
    grid = rng.uniform(-1.25, 1.25, shape)
    if special:
        flat = grid.reshape(-1)
        values = [-1.0, 1.0, 0.0, -2.5, 2.5, 3.75, -3.75, 1.0 / 3.0]
        picks = rng.choice(flat.size, size=min(flat.size, 2 * len(values)), replace=False)
        for slot, index in enumerate(picks):
            flat[index] = values[slot % len(values)]
    return grid


def sample_inputs(rng, k, dtype, channels=3):
    """(x, grid) sets: a main one and others with other sizes, H = 1, W = 1 (2-D) or
    D = 1 (3-D), another batch and output size."""
    if k == 2:
        shapes = [((2, channels, 5, 7), (2, 4, 6)), ((1, channels, 1, 4), (1, 3, 2)),
                  ((3, channels, 6, 1), (3, 1, 5)), ((1, channels, 2, 2), (1, 2, 2))]
    else:
        shapes = [((2, channels, 3, 4, 5), (2, 2, 3, 4)), ((1, channels, 1, 3, 2), (1, 3, 2, 2)),
                  ((2, channels, 2, 1, 3), (1 * 2, 1, 2, 3))]
    sets = []
    for x_shape, out_shape in shapes:
        x = rng.normal(size=x_shape).astype(dtype)
        grid = make_grid(rng, (*out_shape, k)).astype(dtype)
        sets.append([x, grid])
    return sets


def combos():
    """(k, mode, dtype, opset) for every mode and dtype, the opsets spread over them."""
    keys = [(2, mode, dtype) for mode in MODES_2D for dtype in DTYPES] + \
           [(3, mode, dtype) for mode in MODES_3D for dtype in DTYPES]
    return [(*key, OPSETS[index % len(OPSETS)]) for index, key in enumerate(keys)]


def static_channels(k):
    """Case.symbolic: every dim of X and the grid dynamic but X's channels."""
    return {0: [0, *range(2, k + 2)], 1: list(range(k + 2))}


def dtype_id(dtype):
    return np.dtype(dtype).name


# -- every combination ------------------------------------------------------------------------


@pytest.mark.parametrize("k, mode, dtype, opset", combos(),
                         ids=[f"{k}d-{m}-{dtype_id(d)}-opset{o}" for k, m, d, o in combos()])
def test_every_padding_and_alignment_against_torch(k, mode, dtype, opset):
    rng = np.random.default_rng([k, MODES_2D.index(mode), DTYPES.index(dtype)])
    cases = []
    for padding, align in itertools.product(PADDINGS, (0, 1)):
        main, *more = sample_inputs(rng, k, dtype)
        # align 0 keeps C static (zeros padding then pads the input with zeros), align 1
        # makes every dim dynamic (zeros padding then masks the taps): both spellings.
        cases.append(Case(main, {"mode": mode, "padding_mode": padding, "align_corners": align},
                          symbolic=static_channels(k) if align == 0 else "all",
                          more_inputs=more, id=f"{k}-D {mode} {padding} align={align}"))
    tolerance = TOLERANCE[dtype]
    check_pattern(GridSample(), cases, opsets=[opset], domain="custom.ops", oracle=onnx_oracle,
                  atol=tolerance, rtol=tolerance)


def test_reference_matches_torch_without_the_build():
    """The numpy reference alone, on bigger random grids (it is what --verify runs)."""
    rng = np.random.default_rng(7)
    for k, modes in ((2, MODES_2D), (3, MODES_3D)):
        x_shape = (2, 3, 9, 8) if k == 2 else (2, 2, 5, 6, 7)
        x = rng.normal(size=x_shape).astype(np.float32)
        grid = make_grid(rng, (2, *([6] * k), k)).astype(np.float32)
        for mode, padding, align in itertools.product(modes, PADDINGS, (False, True)):
            np.testing.assert_allclose(grid_sample_reference(x, grid, mode, padding, align),
                                       torch_grid_sample(x, grid, mode, padding, align),
                                       atol=2e-5, rtol=2e-5, err_msg=f"{mode} {padding} {align}")


@pytest.mark.parametrize("channels, static", [(9, True), (16, True), (16, False)])
def test_static_channels_are_gathered_in_chunks(channels, static):
    """A static channel count >= 8 is gathered in chunks (uneven for 9): same numbers."""
    rng = np.random.default_rng(channels)
    cases = []
    for mode, padding in [("bilinear", "zeros"), ("nearest", "zeros"), ("bicubic", "border")]:
        main, *more = sample_inputs(rng, 2, np.float32, channels)
        cases.append(Case(main, {"mode": mode, "padding_mode": padding, "align_corners": 0},
                          symbolic={0: [0, 2, 3], 1: [0, 1, 2]} if static else "all",
                          more_inputs=more, id=f"C={channels} {mode} {padding}"))
    results = check_pattern(GridSample(), cases, opsets=[13], domain="custom.ops",
                            oracle=onnx_oracle, atol=2e-5, rtol=2e-5)
    chunks = max(1, len(channel_chunks(channels if static else None)))
    assert chunks > 1 if static else chunks == 1
    for result in results:
        # unchunked bicubic gathers its 4 rows of taps one by one (tap groups)
        groups = 4 if chunks == 1 and result.case.attrs["mode"] == "bicubic" else 1
        assert result.op_types.count("GatherElements") == chunks * groups


@pytest.mark.parametrize("k", [2, 3])
def test_zeros_padding_pads_few_static_channels_and_masks_the_rest(k):
    rng = np.random.default_rng(k)
    for symbolic, padded in (("all", False), (static_channels(k), True)):
        main, *more = sample_inputs(rng, k, np.float32)
        cases = [Case(main, {"mode": mode, "padding_mode": "zeros"}, symbolic=symbolic,
                      more_inputs=more) for mode in (MODES_2D if k == 2 else MODES_3D)]
        for result in check_pattern(GridSample(), cases, opsets=[12], domain="custom.ops",
                                    oracle=onnx_oracle, atol=2e-5, rtol=2e-5):
            assert ("Pad" in result.op_types) == padded
            assert ("Where" in result.op_types) != padded or "IsNaN" in result.op_types


def test_mixed_input_and_grid_dtypes_compute_in_the_wider():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 3, 5, 7)).astype(np.float32)
    grid = make_grid(rng, (2, 4, 6, 2))
    cases = [Case([x, grid.astype(np.float64)], {"mode": "bilinear"}, symbolic="all"),
             Case([x.astype(np.float16), grid.astype(np.float32)], {"mode": "bicubic"},
                  symbolic="all")]
    check_pattern(GridSample(), cases[:1], opsets=[13], domain="custom.ops",
                  oracle=onnx_oracle, atol=1e-6, rtol=1e-6)
    check_pattern(GridSample(), cases[1:], opsets=[13], domain="custom.ops",
                  oracle=onnx_oracle, atol=2e-3, rtol=2e-3)


# -- exact values: ties, pixel centres, borders ------------------------------------------------


def tie_grid(n, align_corners, extra_folds=True):
    """Normalized coordinates whose unnormalized value is exactly m + 0.5 (dyadic, so torch's
    float32 math and ours are exact): inside, on the border and, for reflection, outside."""
    scale = (n - 1) / 2 if align_corners else n / 2
    offset = 0.0 if align_corners else -0.5
    halves = np.arange(-3, n + 3) + 0.5 if extra_folds else np.arange(0, n - 1) + 0.5
    grid = (halves - offset) / scale - 1
    assert np.all((grid + 1) * scale + offset == halves)  # exact
    return grid


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("align", [0, 1])
def test_nearest_ties_round_half_to_even_after_reflecting(k, align):
    n = 9 if align else 8  # (n - 1) / 2 or n / 2 a power of two: exact tie values
    ties = tie_grid(n, align)
    rng = np.random.default_rng(11)
    x_shape = (1, 2, *([n] * k))
    x = rng.normal(size=x_shape).astype(np.float32)
    # Every tie value on every axis, the other axes at a tie or a pixel centre.
    points = np.array(list(itertools.product(ties, repeat=k)))[:, ::-1] if k == 2 else \
        np.stack([ties, np.roll(ties, 3), np.roll(ties, 5)], axis=-1)
    grid = points.reshape(1, 1, -1, k) if k == 2 else points.reshape(1, 1, 1, -1, k)
    grid = grid.astype(np.float32)
    cases = [Case([x, grid], {"mode": "nearest", "padding_mode": padding,
                              "align_corners": align}, symbolic=symbolic,
                  id=f"ties {padding} {symbolic}")
             for padding in PADDINGS for symbolic in ("all", static_channels(k))]
    check_pattern(GridSample(), cases, opsets=[16], domain="custom.ops", oracle=onnx_oracle,
                  atol=0, rtol=0)


def test_pixel_centres_and_borders_are_exact():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(1, 2, 4, 8)).astype(np.float32)
    for align in (0, 1):
        xs = np.arange(8, dtype=np.float32)
        ys = np.arange(4, dtype=np.float32)
        # the normalized coordinates of the pixel centres (dyadic: exact)
        gx = xs / 7 * 2 - 1 if align else (xs * 2 + 1) / 8 - 1
        gy = ys / 3 * 2 - 1 if align else (ys * 2 + 1) / 4 - 1
        grid = np.stack(np.meshgrid(gx, gy), axis=-1)[None].astype(np.float32)
        for mode in MODES_2D:
            cases = [Case([x, grid], {"mode": mode, "padding_mode": padding,
                                      "align_corners": align}, symbolic="all")
                     for padding in PADDINGS]
            results = check_pattern(GridSample(), cases, opsets=[17], domain="custom.ops",
                                    oracle=onnx_oracle, atol=1e-6, rtol=0)
            for result in results:  # every mode gives the pixels back
                (got,) = run_onnxruntime(result.model, {"input0": x, "input1": grid})
                np.testing.assert_allclose(got, x, atol=1e-5, rtol=0)


def test_far_out_of_range_and_huge_coordinates_stay_in_bounds():
    """Coordinates far outside (up to 1e30) never index outside the input."""
    rng = np.random.default_rng(9)
    x = rng.normal(size=(2, 3, 5, 6)).astype(np.float32)
    grid = rng.choice([-1e30, -1e6, -7.5, 7.5, 1e6, 1e30, 0.3], size=(2, 4, 5, 2))
    grid = grid.astype(np.float32)
    cases = [Case([x, grid], {"mode": mode, "padding_mode": padding, "align_corners": align},
                  symbolic="all" if align else static_channels(2), id=f"{mode} {padding} {align}")
             for mode, padding, align in itertools.product(MODES_2D, ["zeros", "border"],
                                                           (0, 1))]
    check_pattern(GridSample(), cases, opsets=[13], domain="custom.ops", oracle=onnx_oracle,
                  atol=1e-5, rtol=1e-5)


# -- NaN and inf in the grid -------------------------------------------------------------------


def _decompose_single(case, opset, domain="custom.ops", pattern=None):
    from decomposer.testing import single_node_model

    pattern = pattern or GridSample()
    model = single_node_model(pattern.op_type, domain, case, opset)
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    return out


@pytest.mark.parametrize("k", [2, 3])
def test_nan_and_inf_in_the_grid_give_what_torch_gives(k):
    """Documented results (see the module docstring): 2-D zeros -> NaN (bilinear, bicubic)
    or 0 (nearest); 2-D border/reflection sample coordinate 0; 3-D zeros -> 0; 3-D
    border/reflection sample coordinate n-1; bicubic NaN. No crash, no out-of-range index."""
    rng = np.random.default_rng(13)
    x = rng.normal(size=(1, 2, *([4] * (k - 1)), 5)).astype(np.float32)
    special = [np.nan, np.inf, -np.inf, 0.25]
    points = np.array([p for p in itertools.product(special, repeat=k)], np.float32)
    grid = points.reshape(1, *([1] * (k - 1)), -1, k)
    for mode in MODES_2D if k == 2 else MODES_3D:
        for padding, align in itertools.product(PADDINGS, (0, 1)):
            attrs = {"mode": mode, "padding_mode": padding, "align_corners": align}
            symbolic = "all" if align else static_channels(k)  # masked or padded zeros
            out = _decompose_single(Case([x, grid], attrs, symbolic=symbolic),
                                    16 if k == 2 else 20)
            (got,) = run_onnxruntime(out, {"input0": x, "input1": grid})
            expected = onnx_oracle(x, grid, **attrs)
            np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5, equal_nan=True,
                                       err_msg=f"{k}-D {attrs}")
            np.testing.assert_allclose(GridSample().reference(x, grid, **attrs)[0], expected,
                                       atol=1e-5, rtol=1e-5, equal_nan=True)
            nan_grid = np.isnan(points).any(axis=1)
            if mode == "bicubic":
                assert np.isnan(got.reshape(-1, nan_grid.size)[:, nan_grid]).all()


# -- matching forms ----------------------------------------------------------------------------


def test_opset20_spellings_and_defaults():
    rng = np.random.default_rng(17)
    main, *more = sample_inputs(rng, 2, np.float32)
    cases = [Case(main, {"mode": "linear", "padding_mode": "border"}, symbolic="all",
                  more_inputs=more),
             Case(main, {"mode": "cubic", "align_corners": 1}, symbolic="all"),
             Case(main, {"mode": " Nearest ", "padding_mode": "REFLECTION"}, symbolic="all"),
             Case(main, {}, symbolic="all", id="all defaults: bilinear zeros align 0")]
    check_pattern(GridSample(), cases, opsets=[20], domain="ai.onnx.contrib",
                  oracle=onnx_oracle, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("opset", [11, 15])
def test_default_domain_below_opset_16(opset):
    rng = np.random.default_rng(opset)
    main, *more = sample_inputs(rng, 2, np.float32)
    cases = [Case(main, {"mode": "bicubic", "padding_mode": "reflection", "align_corners": 1},
                  symbolic="all", more_inputs=more),
             Case(sample_inputs(rng, 3, np.float32)[0], {"mode": "nearest"}, symbolic="all")]
    check_pattern(GridSample(), cases, opsets=[opset], domain="", oracle=onnx_oracle,
                  atol=2e-5, rtol=2e-5)


def test_default_domain_at_opset_16_is_standard_and_left_alone():
    rng = np.random.default_rng(1)
    x, grid = sample_inputs(rng, 2, np.float32)[0]
    node = helper.make_node("GridSample", ["x", "grid"], ["y"], name="native")
    model = make_model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                              list(x.shape)),
                                helper.make_tensor_value_info("grid", TensorProto.FLOAT,
                                                              list(grid.shape))],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 4)], 16)
    out, report = decomposer.decompose_with_report(model)
    assert report.counts == {}
    assert [n.op_type for n in out.graph.node] == ["GridSample"]


def test_mmcv_grid_sampler():
    rng = np.random.default_rng(19)
    cases = []
    for mode, padding, align in [(0, 0, 0), (1, 2, 1), (2, 1, 0), (2, 2, 1), (0, 1, 1)]:
        main, *more = sample_inputs(rng, 2, np.float32)
        cases.append(Case(main, {"interpolation_mode": mode, "padding_mode": padding,
                                 "align_corners": align}, symbolic="all", more_inputs=more))
    cases.append(Case(sample_inputs(rng, 3, np.float32)[0], {"interpolation_mode": 1},
                      symbolic="all", id="3-D nearest, other attributes defaulted"))
    check_pattern(GridSample(), cases, opsets=[11, 17], domain="mmcv", form="grid_sampler",
                  oracle=mmcv_oracle, atol=2e-5, rtol=2e-5)


def aten_model(form, mode, padding, align, *, x_shape=("N", 3, "H", "W"),
               grid_shape=("N", "h", "w", 2), opset=13, mode_input=None, align_type=None):
    """A model holding torch's grid_sampler fallback: ``fallthrough``
    (org.pytorch.aten::grid_sampler) or ``fallback`` (ATen(operator="grid_sampler")).
    The options are Constants, and one Constant feeds mode and padding when they are equal,
    as torch's exporter does."""
    nodes = []
    names = {}
    for label, value in (("mode", mode), ("padding", padding)):
        existing = [n for n in nodes if n.attribute[0].t.int64_data == [value]]
        if existing:
            names[label] = existing[0].output[0]
            continue
        names[label] = f"{label}_const"
        nodes.append(helper.make_node("Constant", [], [names[label]], name=f"{label}_node",
                                      value=helper.make_tensor("v", TensorProto.INT64, [],
                                                               [value])))
    nodes.append(helper.make_node("Constant", [], ["align_const"], name="align_node",
                                  value=helper.make_tensor("v", align_type or TensorProto.BOOL,
                                                           [], [align])))
    inputs = ["x", "grid", mode_input or names["mode"], names["padding"], "align_const"]
    if form == "fallthrough":
        node = helper.make_node("grid_sampler", inputs, ["y"], name="sampler",
                                domain="org.pytorch.aten")
    else:
        node = helper.make_node("ATen", inputs, ["y"], name="sampler", domain="org.pytorch.aten",
                                operator="grid_sampler", overload_name="")
    nodes.append(node)
    graph_inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape)),
                    helper.make_tensor_value_info("grid", TensorProto.FLOAT, list(grid_shape))]
    if mode_input:
        graph_inputs.append(helper.make_tensor_value_info(mode_input, TensorProto.INT64, []))
    return make_model(nodes, graph_inputs,
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 4)], opset,
                      extra_opsets=["org.pytorch.aten"])


@pytest.mark.parametrize("form", ["fallthrough", "fallback"])
def test_torch_aten_forms(form):
    rng = np.random.default_rng(23)
    for index, (mode, padding, align) in enumerate([("bilinear", "zeros", 0),
                                                   ("nearest", "reflection", 1),
                                                   ("bicubic", "border", 0),
                                                   ("bilinear", "reflection", 1)]):
        opset = [11, 13, 15, 14][index]
        model = aten_model(form, MODE_CODES[mode], PADDING_CODES[padding], align, opset=opset)
        out, report = decomposer.decompose_with_report(model)
        assert report.counts == {"GridSample": 1}
        assert {i.domain for i in out.opset_import} == {""}
        onnx.checker.check_model(out, full_check=True)
        # the option Constants fed only the replaced node: removed
        assert not [n for n in out.graph.node if n.name.endswith("_node")]
        for x, grid in sample_inputs(rng, 2, np.float32):
            (got,) = run_onnxruntime(out, {"x": x, "grid": grid})
            np.testing.assert_allclose(got, torch_grid_sample(x, grid, mode, padding, align),
                                       atol=2e-5, rtol=2e-5, err_msg=f"{mode} {padding}")


def test_registry_sends_each_form_to_its_pattern():
    registry = default_registry()
    aten = helper.make_node("grid_sampler", ["a", "b", "c", "d", "e"], ["y"],
                            domain="org.pytorch.aten")
    fallback = helper.make_node("ATen", ["a", "b", "c", "d", "e"], ["y"],
                                domain="org.pytorch.aten", operator="grid_sampler")
    mmcv = helper.make_node("grid_sampler", ["a", "b"], ["y"], domain="mmcv")
    custom = helper.make_node("GridSample", ["a", "b"], ["y"], domain="custom.ops")
    found = {label: registry.lookup(node) for label, node in
             [("aten", aten), ("fallback", fallback), ("mmcv", mmcv), ("custom", custom)]}
    assert {label: (type(p).__name__, form.aten or form.op_types[0])
            for label, (p, form) in found.items()} == {
        "aten": ("GridSample", "grid_sampler"), "fallback": ("GridSample", "grid_sampler"),
        "mmcv": ("GridSample", "grid_sampler"), "custom": ("GridSample", "GridSample")}
    assert found["aten"][1].aten and not found["mmcv"][1].aten


# -- rejections --------------------------------------------------------------------------------


def _custom_model(attrs, x_shape=("N", "C", "H", "W"), grid_shape=("N", "h", "w", 2),
                  x_type=TensorProto.FLOAT, op_type="GridSample", domain="custom.ops"):
    """One sampler node; a shape of None feeds that input from a Reshape to a run-time
    shape, so its rank is unknown."""
    node = helper.make_node(op_type, ["x", "grid"], ["y"], name="sampler", domain=domain,
                            **attrs)
    nodes, inputs = [], []
    for name, shape, elem_type in (("x", x_shape, x_type), ("grid", grid_shape,
                                                            TensorProto.FLOAT)):
        if shape is None:
            nodes.append(helper.make_node("Reshape", [f"{name}_flat", f"{name}_shape"], [name]))
            inputs += [helper.make_tensor_value_info(f"{name}_flat", elem_type, ["A"]),
                       helper.make_tensor_value_info(f"{name}_shape", TensorProto.INT64, ["R"])]
        else:
            inputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
    rank = len(x_shape) if x_shape is not None else 4
    return make_model([*nodes, node], inputs,
                      [helper.make_tensor_value_info("y", x_type, [None] * rank)], 16,
                      extra_opsets=[domain])


REJECTIONS = [
    ("unknown mode", _custom_model({"mode": "area"}),
     "attribute 'mode' = 'area' is not one of"),
    ("unknown padding", _custom_model({"padding_mode": "wrap"}),
     "attribute 'padding_mode' = 'wrap' is not one of"),
    ("align_corners 2", _custom_model({"align_corners": 2}),
     "attribute 'align_corners' = 2 is not one of"),
    ("mmcv unknown mode", _custom_model({"interpolation_mode": 3}, op_type="grid_sampler",
                                        domain="mmcv"),
     "attribute 'interpolation_mode': interpolation mode 3 is not one of"),
    ("aten unknown mode", aten_model("fallthrough", 3, 0, 0),
     "interpolation mode 3 is not one of 0 (bilinear), 1 (nearest), 2 (bicubic)"),
    ("aten unknown padding", aten_model("fallback", 0, 5, 0),
     "padding mode 5 is not one of 0 (zeros), 1 (border), 2 (reflection)"),
    ("aten mode not constant", aten_model("fallthrough", 0, 0, 0, mode_input="mode_fed"),
     "mode (input 3) must be a constant scalar"),
    ("aten align float", aten_model("fallthrough", 0, 0, 0, align_type=TensorProto.FLOAT),
     "align_corners (input 5) must be an integer or bool"),
    ("grid last dim 3 on a 4-D input", _custom_model({}, grid_shape=("N", "h", "w", 3)),
     "the grid does not match the input: input rank says 2-D, grid rank says 2-D, "
     "grid last dim says 3-D"),
    ("5-D grid on a 4-D input", _custom_model({}, grid_shape=("N", "d", "h", "w", 3)),
     "input rank says 2-D, grid rank says 3-D"),
    ("bicubic 3-D", _custom_model({"mode": "bicubic"}, x_shape=("N", "C", "D", "H", "W"),
                                  grid_shape=("N", "d", "h", "w", 3)),
     "bicubic needs a 4-D input"),
    ("unknown ranks", _custom_model({}, x_shape=None, grid_shape=None),
     "cannot tell 2-D from 3-D"),
    ("rank 3 input", _custom_model({}, x_shape=("N", "C", "W")), "must have rank 4"),
    ("integer input", _custom_model({}, x_type=TensorProto.INT32),
     "input must be float16, float32 or float64, got int32"),
    ("unknown attribute", _custom_model({"antialias": 1}),
     "unknown attribute(s) ['antialias']"),
]


@pytest.mark.parametrize("model, reason", [r[1:] for r in REJECTIONS],
                         ids=[r[0] for r in REJECTIONS])
def test_rejections_name_the_node_and_the_reason(model, reason):
    with pytest.raises(decomposer.UnsupportedNodeError) as info:
        decomposer.decompose(model)
    message = str(info.value)
    assert "node 'sampler'" in message
    assert reason in message


def test_rejection_exits_3_on_the_command_line(tmp_path):
    from decomposer.cli import main

    src = tmp_path / "bad.onnx"
    onnx.save(aten_model("fallthrough", 0, 0, 0, mode_input="mode_fed"), src)
    assert main([str(src), str(tmp_path / "out.onnx"), "-q"]) == 3
    assert not (tmp_path / "out.onnx").exists()


# -- the output's shape: portable constructs ---------------------------------------------------


def test_output_uses_only_portable_standard_ops():
    rng = np.random.default_rng(29)
    allowed = {"Constant", "Shape", "Slice", "Cast", "Concat", "Split", "Reshape", "Gather",
               "Add", "Sub", "Mul", "Floor", "Round", "Abs", "Min", "Max", "Clip", "Equal",
               "Where", "IsNaN", "And", "Div", "Expand", "GatherElements", "ReduceSum"}
    for k, modes in ((2, MODES_2D), (3, MODES_3D)):
        for mode, padding in itertools.product(modes, PADDINGS):
            x, grid = sample_inputs(rng, k, np.float32)[0]
            out = _decompose_single(Case([x, grid], {"mode": mode, "padding_mode": padding},
                                         symbolic="all"), 11)
            ops = {n.op_type for n in out.graph.node}
            assert ops <= allowed, ops - allowed
            assert all(n.domain in ("", "ai.onnx") for n in out.graph.node)
            constants = {n.output[0]: onnx.numpy_helper.to_array(n.attribute[0].t)
                         for n in out.graph.node if n.op_type == "Constant"}
            for node in out.graph.node:  # no step -1 flips (onnx2tf turns them into Identity)
                if node.op_type == "Slice" and len(node.input) > 4:
                    assert (constants[node.input[4]] > 0).all()


# -- torch-exported spatial transformers, end to end ------------------------------------------


def _export(model, args, opset, export_type, **kwargs):
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, buffer, dynamo=False, opset_version=opset,
                          operator_export_type=export_type, **kwargs)
    return onnx.load_from_string(buffer.getvalue())


EXPORT_TYPES = [OperatorExportTypes.ONNX_FALLTHROUGH, OperatorExportTypes.ONNX_ATEN_FALLBACK]


@pytest.mark.parametrize("export_type", EXPORT_TYPES, ids=["fallthrough", "aten_fallback"])
@pytest.mark.parametrize("opset", [11, 13, 15])
def test_seed_stn_exported_below_16_decomposes_and_matches_torch(opset, export_type):
    """The seed STN (Conv -> custom AffineGrid -> F.grid_sample), dynamic axes: GridSample
    falls back to torch's grid_sampler below opset 16; both nodes are rewritten, the result
    runs on stock ONNX Runtime at several sizes, and verification passes."""
    torch.manual_seed(0)
    model = SpatialTransformer().eval()
    args = (torch.randn(1, 3, 34, 40), torch.randn(1, 2, 3), torch.tensor([1, 64, 16, 24]))
    original = _export(model, args, opset, export_type,
                       input_names=["image", "theta", "size"], output_names=["output"],
                       dynamic_axes={"image": {0: "n", 2: "height", 3: "width"},
                                     "theta": {0: "n"}, "output": {0: "n", 2: "h", 3: "w"}})
    aten = [n for n in original.graph.node if n.domain == "org.pytorch.aten"]
    assert [n.op_type for n in aten] == ["grid_sampler" if export_type ==
                                         EXPORT_TYPES[0] else "ATen"]
    out, report = decomposer.decompose_with_report(original)
    assert report.counts == {"AffineGrid": 1, "GridSample": 1}
    onnx.checker.check_model(out, full_check=True)
    assert {i.domain for i in out.opset_import} == {""}
    rng = np.random.default_rng(opset)
    for image_hw, size in [((34, 40), (1, 64, 16, 24)), ((66, 66), (2, 64, 33, 7)),
                           ((10, 12), (1, 64, 1, 5))]:
        image = rng.normal(size=(size[0], 3, *image_hw)).astype(np.float32)
        theta = rng.uniform(-1, 1, (size[0], 2, 3)).astype(np.float32)
        size_arr = np.array(size, np.int64)
        (got,) = run_onnxruntime(out, {"image": image, "theta": theta, "size": size_arr})
        with torch.no_grad():
            expected = model(torch.from_numpy(image), torch.from_numpy(theta),
                             torch.from_numpy(size_arr)).numpy()
        np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4)
    feeds = {"image": rng.normal(size=(1, 3, 9, 8)).astype(np.float32),
             "theta": rng.uniform(-1, 1, (1, 2, 3)).astype(np.float32),
             "size": np.array([1, 64, 5, 4], np.int64)}
    verdict = decomposer.verify(original, out, feeds=feeds)
    assert verdict.passed, verdict.table()


@pytest.mark.parametrize("export_type", EXPORT_TYPES, ids=["fallthrough", "aten_fallback"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_classic_stn_at_opset_11(export_type, align_corners):
    """F.affine_grid(theta, x.size()) -> F.grid_sample(x, grid): both are ATen fallbacks."""
    torch.manual_seed(1)
    model = ClassicSTN(align_corners).eval()
    original = _export(model, (torch.randn(2, 3, 16, 20),), 11, export_type,
                       input_names=["x"], output_names=["y"],
                       dynamic_axes={"x": {0: "n", 2: "h", 3: "w"},
                                     "y": {0: "n", 2: "h", 3: "w"}})
    out, report = decomposer.decompose_with_report(original)
    assert report.counts == {"AffineGrid": 1, "GridSample": 1}
    rng = np.random.default_rng(2)
    for shape in [(2, 3, 16, 20), (1, 3, 7, 3), (3, 3, 1, 9)]:
        x = rng.normal(size=shape).astype(np.float32)
        (got,) = run_onnxruntime(out, {"x": x})
        with torch.no_grad():
            expected = model(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4)


# -- portability (the hook of scripts/portability_cases.py) ---------------------------------


def portability_cases():
    """GridSample nodes (custom.ops) with dynamic dims for every engine; oracle: torch."""
    from decomposer.testing import single_node_model

    rng = np.random.default_rng(2024)
    specs = [("GridSample 2-D bilinear zeros", "bilinear", "zeros", 0, 2,
              [((2, 3, 5, 7), (2, 4, 6)), ((1, 3, 4, 3), (1, 2, 5))]),
             ("GridSample 2-D nearest reflection", "nearest", "reflection", 1, 2,
              [((2, 2, 4, 6), (2, 3, 5)), ((1, 2, 6, 3), (1, 4, 2))]),
             ("GridSample 3-D bilinear border", "bilinear", "border", 0, 3,
              [((1, 2, 3, 4, 5), (1, 2, 3, 4)), ((2, 2, 2, 3, 2), (2, 3, 2, 2))]),
             # static C >= MIN_CHUNKED_CHANNELS: gathered in channel chunks (9 = 2+2+2+2+1)
             ("GridSample 2-D bilinear zeros, 9 channels", "bilinear", "zeros", 0, 2,
              [((2, 9, 5, 7), (2, 4, 6)), ((1, 9, 4, 3), (1, 2, 5))]),
             ("GridSample 2-D bicubic border, 16 channels", "bicubic", "border", 1, 2,
              [((1, 16, 6, 5), (1, 3, 4)), ((2, 16, 4, 4), (2, 5, 2))])]
    cases = []
    for label, mode, padding, align, k, shapes in specs:
        sets = []
        for x_shape, out_shape in shapes:
            x = rng.normal(size=x_shape).astype(np.float32)
            grid = make_grid(rng, (*out_shape, k), special=mode != "nearest")
            sets.append([x, grid.astype(np.float32)])
        attrs = {"mode": mode, "padding_mode": padding, "align_corners": align}
        model = single_node_model("GridSample", "custom.ops",
                                  Case(sets[0], attrs, symbolic=static_channels(k)), 17)
        cases.append({"id": label, "model": model,
                      "feeds": [{"input0": x, "input1": grid} for x, grid in sets],
                      "expected": [[torch_grid_sample(x, grid, mode, padding, align)]
                                   for x, grid in sets],
                      "atol": 2e-5})
    return cases
