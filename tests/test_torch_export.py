"""decomposer.torch: one-call export with torch's dynamo exporter (and the legacy one).

Every number is checked against the torch model in eager mode (an oracle independent of
decomposer); the exported files run on stock ONNX Runtime at sizes other than the
example's, which is what torch's own export silently gets wrong.
"""

from __future__ import annotations

import functools
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.export import Dim

import decomposer
import decomposer.torch as dtorch
import decomposer.torch.inputs as dinputs
import decomposer.torch.probe

from seed_models import ClassicSTN, CustomAffineGrid, CustomRotateScale, SpatialTransformer

STANDARD_DOMAINS = {"", "ai.onnx"}


def run_file(path, feeds):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def eager(model, *args):
    with torch.no_grad():
        return model(*args).numpy()


def domains(model: onnx.ModelProto) -> set[str]:
    return {node.domain for node in model.graph.node}


def dim_params(value: onnx.ValueInfoProto) -> list[str | int]:
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


def test_import_decomposer_does_not_import_torch():
    code = ("import sys, decomposer; "
            "assert 'torch' not in sys.modules, 'torch imported'; "
            "assert 'decomposer.torch' not in sys.modules, 'decomposer.torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


# -- the plain STN (F.affine_grid + F.grid_sample), dynamic batch, H and W ------------------


@pytest.mark.parametrize("opset", [16, 18, 20, 11])
def test_stn_dynamo_stays_dynamic_and_matches_eager(tmp_path, opset):
    torch.manual_seed(opset)
    model = ClassicSTN(align_corners=opset == 11).eval()
    path = tmp_path / "stn.onnx"
    report = dtorch.export(model, (torch.randn(2, 3, 16, 20),), path, opset_version=opset,
                           dynamic_shapes={"x": {0: Dim.DYNAMIC, 2: Dim.DYNAMIC,
                                                 3: Dim.DYNAMIC}},
                           external_data=opset == 20)
    # One file, or with external_data its weights beside it; no scratch folder is left.
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written[0] == "stn.onnx" and len(written) == (2 if opset == 20 else 1)
    assert opset != 20 or (written[1].startswith("stn.onnx.") and written[1].endswith(".data"))
    # The opaque AffineGrid was rewritten; below 16 GridSample is not an ONNX op, and
    # align_corners=1 is off ONNX Runtime's fast path: then it is rewritten too.
    assert report.counts == ({"AffineGrid": 1, "GridSample": 1} if opset == 11
                             else {"AffineGrid": 1})
    assert report.verification.passed and report.verification.runs == 2
    out = onnx.load(path)
    onnx.checker.check_model(out, full_check=True)
    assert domains(out) <= STANDARD_DOMAINS
    assert [(i.domain, i.version) for i in out.opset_import if i.domain in STANDARD_DOMAINS] \
        == [("", opset)]
    assert [isinstance(d, str) for d in dim_params(out.graph.input[0])] == \
        [True, False, True, True]
    rng = np.random.default_rng(opset)
    for shape in [(2, 3, 16, 20), (1, 3, 7, 33), (3, 3, 40, 9)]:
        x = rng.normal(size=shape).astype(np.float32)
        (got,) = run_file(path, {out.graph.input[0].name: x})
        expected = eager(model, torch.from_numpy(x))
        assert got.shape == expected.shape == shape
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-4)


class AffineGridOfInput(nn.Module):
    """The STN's first half: a grid the size of the input (what torch's export freezes)."""

    def forward(self, x, theta):
        return F.affine_grid(theta, x.size(), align_corners=False)


def test_plain_torch_export_freezes_what_decomposer_keeps_dynamic(tmp_path, monkeypatch):
    # The finding, kept as a test: with Dim.AUTO torch silently bakes H and W into
    # the graph (the ONNX input still says they are dynamic); ONNX Runtime refuses other
    # sizes.
    args = (torch.randn(2, 3, 16, 20), torch.randn(2, 2, 3))
    shapes = {"x": {0: Dim.AUTO, 2: Dim.AUTO, 3: Dim.AUTO}, "theta": {0: Dim.AUTO}}
    program = torch.onnx.export(AffineGridOfInput().eval(), args, dynamo=True, verbose=False,
                                opset_version=18, dynamic_shapes=shapes)
    assert [isinstance(d, str) for d in dim_params(program.model_proto.graph.input[0])] == \
        [True, False, True, True]
    session = ort.InferenceSession(program.model_proto.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    feeds = {"x": np.zeros((1, 3, 9, 7), np.float32), "theta": np.zeros((1, 2, 3), np.float32)}
    with pytest.raises(Exception, match="Reshape|reshape|broadcast"):
        session.run(None, feeds)
    # decomposer.torch routes affine_grid and keeps H and W dynamic ...
    path = tmp_path / "grid.onnx"
    report = dtorch.export(AffineGridOfInput().eval(), args, path, opset_version=18,
                           dynamic_shapes=shapes)
    assert report.counts == {"AffineGrid": 1} and report.verification.runs == 2
    (got,) = run_file(path, feeds)
    assert got.shape == (1, 9, 7, 2)
    # ... and, given torch's own export (no pattern to route to), refuses it before
    # anything is written.
    monkeypatch.setattr(dtorch.probe, "pattern_rewrites",
                        functools.lru_cache(lambda *args, **kwargs: False))
    with pytest.raises(dtorch.ExportError, match=r"input 'x' dim 2 .*fixed it to 16"):
        dtorch.export(AffineGridOfInput().eval(), args, tmp_path / "frozen.onnx", opset_version=18,
                      dynamic_shapes=shapes)
    assert not (tmp_path / "frozen.onnx").exists()


# -- refusals -------------------------------------------------------------------------------


class Linspace(nn.Module):
    """torch.export traces torch.linspace through a decomposition that fixes its length."""

    def forward(self, x):
        return x * torch.linspace(-1, 1, x.shape[-1])


def test_frozen_dim_is_an_error_naming_the_dim(tmp_path):
    path = tmp_path / "linspace.onnx"
    with pytest.raises(dtorch.ExportError,
                       match=r"input 'x' dim 1 is declared dynamic but torch.export fixed "
                             r"it to 20") as caught:
        dtorch.export(Linspace().eval(), (torch.randn(3, 20),), path, opset_version=18,
                      dynamic_shapes={"x": {0: Dim.AUTO, 1: Dim.AUTO}})
    assert isinstance(caught.value, decomposer.InvalidModelError)
    assert "dim 0" not in str(caught.value)  # the batch stayed dynamic
    assert not path.exists()


class ArangeFromInt(nn.Module):
    """int() of a size: the legacy tracer records the example's value as a constant."""

    def forward(self, x):
        return x * torch.arange(int(x.shape[1]))


def test_dim_frozen_inside_the_graph_fails_verification(tmp_path):
    path = tmp_path / "arange.onnx"
    with pytest.raises(decomposer.VerificationError,
                       match=r"x\[1\]: 20 -> 24\).*frozen inside the graph"):
        dtorch.export(ArangeFromInt().eval(), (torch.randn(3, 20),), path, dynamo=False,
                      dynamic_shapes={"x": {0: "n", 1: "w"}})


class LayerNorm(nn.Module):
    def forward(self, x):
        return F.layer_norm(x, (4,))


def test_opset_below_an_op_the_export_writes_lowers_it(tmp_path):
    # torch writes LayerNormalization (opset 17) whatever opset is asked for; at
    # opset_version=16 decomposer takes the model down (--target-opset's machinery), the
    # LayerNormalization pattern lowering it, and checks the result against eager.
    path = tmp_path / "ln.onnx"
    report = dtorch.export(LayerNorm().eval(), (torch.randn(3, 4),), path, opset_version=16)
    assert report.counts == {"LayerNormalization": 1}
    assert report.verification.passed
    out = onnx.load(path)
    assert [o.version for o in out.opset_import if o.domain in ("", "ai.onnx")] == [16]
    assert "LayerNormalization" not in {n.op_type for n in out.graph.node}
    x = torch.randn(3, 4)
    got = ort.InferenceSession(str(path)).run(None, {out.graph.input[0].name: x.numpy()})[0]
    np.testing.assert_allclose(got, F.layer_norm(x, (4,)).numpy(), rtol=1e-5, atol=1e-5)


# -- the legacy exporter --------------------------------------------------------------------


def test_legacy_exporter_routes_and_stays_dynamic(tmp_path):
    torch.manual_seed(1)
    model = ClassicSTN().eval()
    path = tmp_path / "legacy.onnx"
    report = dtorch.export(model, (torch.randn(2, 3, 16, 20),), path, dynamo=False,
                           opset_version=16, dynamic_shapes={"x": {0: "n", 2: "h", 3: "w"}})
    assert report.counts == {"AffineGrid": 1}
    assert report.verification.passed and report.verification.runs == 2
    out = onnx.load(path)
    assert domains(out) <= STANDARD_DOMAINS
    x = np.random.default_rng(2).normal(size=(3, 3, 11, 5)).astype(np.float32)
    (got,) = run_file(path, {out.graph.input[0].name: x})
    np.testing.assert_allclose(got, eager(model, torch.from_numpy(x)), atol=1e-5, rtol=1e-4)


# -- the seeds' classes through opaque_function ---------------------------------------------


def grid_shape(theta, size):
    # theta (N, 2, 3); H and W are values of the size tensor, unknown while tracing
    return theta.new_empty((theta.shape[0], dtorch.data_dependent_size(),
                            dtorch.data_dependent_size(), 2))


AffineGridFunction = dtorch.opaque_function(CustomAffineGrid._Function, fake=grid_shape)
RotateScaleFunction = dtorch.opaque_function(CustomRotateScale._Function)


def opaque_nodes(model: onnx.ModelProto) -> list[tuple[str, str, list[onnx.AttributeProto]]]:
    custom = [n for n in model.graph.node if n.op_type in ("AffineGrid", "CustomRotScale")]
    return [(n.domain, n.op_type, sorted(n.attribute, key=lambda a: a.name)) for n in custom]


def legacy_nodes(model, args, tmp_path):
    path = tmp_path / "legacy_seed.onnx"
    torch.onnx.export(model, args, str(path), dynamo=False, opset_version=18,
                      custom_opsets={"custom.ops": 1},
                      operator_export_type=torch.onnx.OperatorExportTypes.ONNX_FALLTHROUGH)
    return opaque_nodes(onnx.load(path))


def test_seed_spatial_transformer_through_opaque_function(tmp_path):
    torch.manual_seed(0)
    model = SpatialTransformer().eval()
    args = (torch.randn(1, 3, 20, 24), torch.randn(1, 2, 3), torch.tensor([1, 64, 9, 11]))
    expected_node = legacy_nodes(model, args, tmp_path)  # the seed's symbolic(), as written
    model.affine._Function = AffineGridFunction  # the one-line conversion
    program = torch.onnx.export(model, args, dynamo=True, verbose=False,
                                custom_translation_table=dtorch.translation_table(20))
    assert opaque_nodes(program.model_proto) == expected_node == [
        ("custom.ops", "AffineGrid", [onnx.helper.make_attribute("align_corners", 0)])]

    path = tmp_path / "seed_stn.onnx"
    other_size = (torch.randn(1, 3, 12, 30), torch.randn(1, 2, 3), torch.tensor([1, 64, 5, 17]))
    report = dtorch.export(model, args, path, dynamic_shapes=({2: "h", 3: "w"}, None, None),
                           verify={"inputs": [other_size]})
    assert report.counts == {"AffineGrid": 1}
    assert report.verification.passed and report.verification.runs == 3
    out = onnx.load(path)
    feeds = dict(zip([i.name for i in out.graph.input], [a.numpy() for a in other_size],
                     strict=True))
    (got,) = run_file(path, feeds)
    np.testing.assert_allclose(got, eager(model, *other_size), atol=1e-5, rtol=1e-4)
    assert got.shape == (1, 64, 5, 17)


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "legacy"])
def test_seed_rotate_scale_through_opaque_function(tmp_path, dynamo):
    model = CustomRotateScale().eval()
    x = torch.randn(1, 3, 6, 5)
    expected_node = legacy_nodes(model, (x,), tmp_path)
    model._Function = RotateScaleFunction
    if dynamo:
        program = torch.onnx.export(model, (x,), dynamo=True, verbose=False,
                                    custom_translation_table=dtorch.translation_table(20))
        assert opaque_nodes(program.model_proto) == expected_node
    assert [(d, op, [(a.name, a.type) for a in attrs]) for d, op, attrs in expected_node] == [
        ("", "CustomRotScale", [("dims", onnx.AttributeProto.STRING),
                                ("rotations", onnx.AttributeProto.INT),
                                ("scale_factor", onnx.AttributeProto.FLOAT)])]
    path = tmp_path / "rotate.onnx"
    report = dtorch.export(model, (x,), path, dynamo=dynamo,
                           dynamic_shapes=({0: "n", 2: "h", 3: "w"},))
    assert report.counts == {"CustomRotScale": 1}
    out = onnx.load(path)
    assert domains(out) <= STANDARD_DOMAINS
    y = np.random.default_rng(3).normal(size=(2, 3, 4, 7)).astype(np.float32)
    (got,) = run_file(path, {out.graph.input[0].name: y})
    np.testing.assert_allclose(got, eager(model, torch.from_numpy(y)), atol=1e-6)


class WrongSymbolic(torch.autograd.Function):
    """forward turns once, symbolic() claims twice: verification must catch it."""

    @staticmethod
    def forward(ctx, x):
        return torch.rot90(x, 1, [2, 3])

    @staticmethod
    def symbolic(g, x):
        return g.op("CustomRotScale", x, rotations_i=2, scale_factor_f=1.0,
                    dims_s="height,width")


class UsesWrongSymbolic(nn.Module):
    def forward(self, x):
        return WrongSymbolicOp.apply(x)


WrongSymbolicOp = dtorch.opaque_function(WrongSymbolic)


def test_verification_catches_a_wrong_symbolic(tmp_path):
    path = tmp_path / "wrong.onnx"
    with pytest.raises(decomposer.VerificationError, match="VERIFICATION FAILED") as caught:
        dtorch.export(UsesWrongSymbolic().eval(), (torch.randn(1, 2, 4, 4),), path)
    assert caught.value.report.counts == {"CustomRotScale": 1}
    assert path.exists()  # kept for inspection, as decompose_file does


def test_opaque_function_needs_a_symbolic():
    class NoSymbolic(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x

    with pytest.raises(dtorch.ExportError, match="no symbolic"):
        dtorch.opaque_function(NoSymbolic)


# -- declared dynamic dims and the second input set (no export) ----------------------------


class TwoInputs(nn.Module):
    def forward(self, image, theta, flags=None):
        return image


def test_declared_dims_from_every_spelling():
    args = (torch.zeros(2, 3, 16, 20), torch.zeros(2, 2, 3))
    leaves = dinputs.input_leaves(TwoInputs(), args, {})
    batch = Dim("batch", min=2, max=64)
    spellings = [
        {"image": {0: batch, 2: "h", 3: Dim.AUTO}, "theta": {0: batch}},
        ({0: batch, 2: "h", 3: Dim.DYNAMIC}, [batch, None, None]),
    ]
    for spec in spellings:
        dims = dinputs.declared_dynamic(leaves, spec, None, None)
        assert [(d.label, d.dim) for d in dims] == [("image", 0), ("image", 2), ("image", 3),
                                                    ("theta", 0)]
        assert dims[0].group == dims[3].group == "batch" and dims[0].high == 64
    legacy = dinputs.declared_dynamic(leaves, None, {"img": {2: "h"}, "th": [0]},
                                      ["img", "th"])
    assert [(d.label, d.dim, d.group) for d in legacy] == [("image", 2, "h"),
                                                           ("theta", 0, "th_dim0")]
    assert dinputs.declared_dynamic(leaves, {"image": {1: Dim.STATIC}}, None, None) == []


def test_second_input_set_changes_every_declared_dim_consistently():
    args = (torch.randn(2, 3, 16, 20), torch.randn(2, 2, 3))
    leaves = dinputs.input_leaves(TwoInputs(), args, {})
    dims = dinputs.declared_dynamic(leaves, {"image": {0: "n", 2: "h", 3: "w"},
                                             "theta": {0: "n"}}, None, None)
    values, changes = dinputs.second_inputs(leaves, dims, seed=0)
    assert [tuple(v.shape) for v in values] == [(4, 3, 32, 24), (4, 2, 3)]
    assert changes == ["image[0]: 2 -> 4", "image[2]: 16 -> 32", "image[3]: 20 -> 24",
                       "theta[0]: 2 -> 4"]
    assert dinputs.second_size(7, 2, None) == 8
    assert dinputs.second_size(64, 2, 64) == 48  # respects Dim max
    assert dinputs.second_size(2, 2, 2) is None


class LinalgSearchScan(nn.Module):
    """Every op torch's dynamo exporter has no ONNX function for (aten.linalg_inv_ex,
    linalg_solve_ex, searchsorted, cummax, cummin), each spelling once."""

    def forward(self, a, b, sequence, values, x):
        inverse, info = torch.linalg.inv_ex(a)
        return (torch.linalg.inv(a), (2 * a).inverse(), inverse, info,
                torch.linalg.solve(a, b), torch.linalg.solve(a, b.transpose(-1, -2), left=False),
                torch.searchsorted(sequence, values, right=True),
                torch.searchsorted(sequence, values, side="left", out_int32=True),
                *torch.cummax(x, 1), *x.cummin(dim=0))


def linalg_search_scan_inputs(rng, batch, rows, length):
    a = rng.normal(size=(batch, 3, 3)) + 4 * np.eye(3)
    sequence = np.sort(rng.normal(size=(rows, length)), axis=-1)
    arrays = [a, rng.normal(size=(batch, 3, 2)), sequence,
              np.concatenate([sequence[:, :2], rng.normal(size=(rows, 4))], axis=1),  # ties
              rng.normal(size=(rows, 7))]
    return [torch.from_numpy(x.astype(np.float32)) for x in arrays]


@pytest.mark.parametrize("opset", [11, 18, 20])
def test_dynamo_routes_linear_algebra_searchsorted_and_cummax(tmp_path, opset):
    """torch 2.13's dynamo exporter fails on all of them ("No ONNX function found");
    export routes each through an opaque node that a pattern rewrites. Sizes stay dynamic
    (Dim without bounds too), and the file matches eager at other sizes, with sorted
    sequences (export's own verification keeps a sorted example sorted)."""
    model = LinalgSearchScan().eval()
    rng = np.random.default_rng(opset)
    batch, rows, length = Dim("batch"), Dim("rows"), Dim("length")
    path = tmp_path / "model.onnx"
    report = dtorch.export(model, tuple(linalg_search_scan_inputs(rng, 5, 4, 10)), path,
                           opset_version=opset,
                           dynamic_shapes=({0: batch}, {0: batch}, {0: rows, 1: length},
                                           {0: rows}, {0: rows}))
    assert report.counts == {"Inverse": 2, "linalg_inv_ex": 1, "Solve": 2,
                             "SearchSorted": 2, "CumMax": 1, "CumMin": 1}
    out = onnx.load(path)
    assert domains(out) <= STANDARD_DOMAINS
    assert [dim_params(i)[:2] for i in out.graph.input] == \
        [["batch", 3], ["batch", 3], ["rows", "length"], ["rows", 6], ["rows", 7]]
    inputs = linalg_search_scan_inputs(rng, 2, 6, 33)
    got = run_file(path, {i.name: x.numpy() for i, x in zip(out.graph.input, inputs,
                                                            strict=True)})
    with torch.no_grad():
        want = [w.numpy() for w in model(*inputs)]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-5)


def test_inv_ex_with_check_errors_is_left_to_torch(tmp_path):
    """check_errors=True raises in eager mode on a singular matrix, which no graph can:
    it is not routed, and torch's own export failure comes back as ExportError."""

    class Checked(nn.Module):
        def forward(self, a):
            return torch.linalg.inv_ex(a, check_errors=True)[0]

    a = torch.eye(3).expand(2, 3, 3).contiguous()
    with pytest.raises(decomposer.ExportError):
        dtorch.export(Checked().eval(), (a,), tmp_path / "checked.onnx")
    assert not (tmp_path / "checked.onnx").exists()
