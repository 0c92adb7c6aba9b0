"""``--lower ConvInteger`` (for TensorRT and TVM, which lack the op) against ONNX Runtime's
own ConvInteger kernel: uint8/int8 data and weights, zero points at the ends of their
ranges, constant and run-time weights, channel counts that need several exact chunks,
strides, dilations, groups, auto_pad, 1-D and 3-D windows, dynamic batch and spatial dims
at two sizes, opsets 11, 13 and 17; per-channel weight zero points (ONNX Runtime's kernel
refuses them) against ONNX's reference; and quantize_dynamic's CNN lowered whole, on ONNX
Runtime and TVM."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx.reference import ReferenceEvaluator

import decomposer
from decomposer import engines
from decomposer.errors import UnsupportedNodeError

from _helpers import integer_product_model, random_integers


def _session(model):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def _model(x_dtype, w, x_zero, w_zero, attrs, spatial, constant_weights=True, opset=17):
    dims = ["n", w.shape[1] * attrs.get("group", 1), *[f"s{i}" for i in range(len(spatial))]]
    return integer_product_model("ConvInteger", x_dtype, dims, w, x_zero, w_zero,
                                 constant_weights, len(spatial) + 2, opset, **attrs)


_random = random_integers


CASES = [
    # (x dtype, w dtype, channels, kernel, attrs, x zero, w zero, constant weights)
    (np.uint8, np.int8, 3, (3, 3), {"pads": [1, 1, 1, 1]}, 128, 0, True),
    (np.uint8, np.uint8, 64, (3, 3), {"strides": [2, 2]}, 0, 255, True),  # chunked
    (np.int8, np.int8, 48, (3, 3), {"dilations": [2, 2], "pads": [2, 2, 2, 2]}, -128, 127,
     True),
    (np.int8, np.uint8, 8, (1, 1), {}, None, None, True),
    (np.uint8, np.int8, 40, (3, 3), {"auto_pad": "SAME_UPPER"}, 255, -128, False),  # chunked
    (np.uint8, np.int8, 4, (3, 3), {"group": 2, "pads": [0, 1, 1, 0]}, 3, 5, True),
    (np.uint8, np.int8, 6, (3,), {"pads": [1, 1]}, 200, -7, True),  # 1-D window
    (np.int8, np.int8, 5, (2, 2, 2), {}, 0, 0, False),  # 3-D window
]


@pytest.mark.parametrize("opset", [11, 13, 17])
@pytest.mark.parametrize("x_dtype, w_dtype, channels, kernel, attrs, x_zero, w_zero, constant",
                         CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_equals_the_kernel(opset, x_dtype, w_dtype, channels, kernel, attrs, x_zero, w_zero,
                           constant):
    rng = np.random.default_rng(len(kernel) * 100 + channels)
    group = attrs.get("group", 1)
    w = _random(rng, w_dtype, (6, channels // group, *kernel))
    model = _model(x_dtype, w, None if x_zero is None else np.array(x_zero, x_dtype),
                   None if w_zero is None else np.array(w_zero, w_dtype), attrs, kernel,
                   constant, opset)
    assert decomposer.decompose(model).graph.node[0].op_type == "ConvInteger"
    out = decomposer.decompose(model, lower=["ConvInteger"])
    onnx.checker.check_model(out, full_check=True)
    assert "ConvInteger" not in {n.op_type for n in out.graph.node}
    kernel_session, lowered = _session(model), _session(out)
    for batch, size in ((2, 9), (1, 6)):
        feeds = {"x": _random(rng, x_dtype, (batch, channels, *[size] * len(kernel)))}
        if not constant:
            feeds["w"] = w
        want = kernel_session.run(None, feeds)[0]
        got = lowered.run(None, feeds)[0]
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, want)


def test_chunks_are_what_exactness_needs():
    """64 uint8 channels against weights of magnitude 255 everywhere (0 with a zero point of
    255) need three chunks: each holds at most 2**24 / (255 * 255 * 9) = 28 channels; 3
    channels need one Conv."""
    rng = np.random.default_rng(0)
    wide = _model(np.uint8, np.zeros((6, 64, 3, 3), np.uint8), np.array(0, np.uint8),
                  np.array(255, np.uint8), {}, (3, 3))
    narrow = _model(np.uint8, _random(rng, np.int8, (6, 3, 3, 3)), np.array(128, np.uint8),
                    np.array(0, np.int8), {}, (3, 3))
    assert [n.op_type for n in decomposer.decompose(wide, lower=["ConvInteger"]).graph.node
            ].count("Conv") == 3
    assert [n.op_type for n in decomposer.decompose(narrow, lower=["ConvInteger"]).graph.node
            ].count("Conv") == 1


def test_sums_beyond_float32s_exact_integers():
    """Data near 255 with zero point 0 against weights near 0 with zero point 255: every
    term is about -53,000 and a window of 64 channels sums to about -30 million, beyond the
    2**24 float32 holds exactly; the chunks keep it bit for bit the kernel's (one Conv
    gives other numbers: checked by hand with the bound lifted)."""
    rng = np.random.default_rng(12)
    w = rng.integers(0, 41, (6, 64, 3, 3)).astype(np.uint8)
    model = _model(np.uint8, w, np.array(0, np.uint8), np.array(255, np.uint8), {}, (3, 3))
    out = decomposer.decompose(model, lower=["ConvInteger"])
    for batch in (2, 1):
        x = rng.integers(200, 256, (batch, 64, 7, 7)).astype(np.uint8)
        want = _session(model).run(None, {"x": x})[0]
        assert np.abs(want).max() > 2 ** 24
        np.testing.assert_array_equal(_session(out).run(None, {"x": x})[0], want)


def test_per_channel_weight_zero_points_against_the_reference():
    """ONNX Runtime's kernel refuses a zero point per output channel ("Non per-tensor
    quantization is not supported now", measured); ONNX's reference computes it."""
    rng = np.random.default_rng(3)
    w = _random(rng, np.int8, (4, 3, 3, 3))
    model = _model(np.uint8, w, np.array(9, np.uint8), np.array([-128, 0, 5, 127], np.int8),
                   {"pads": [1, 1, 1, 1]}, (3, 3))
    out = decomposer.decompose(model, lower=["ConvInteger"])
    onnx.checker.check_model(out, full_check=True)
    reference = ReferenceEvaluator(model)
    for batch in (2, 1):
        x = _random(rng, np.uint8, (batch, 3, 7, 5))
        np.testing.assert_array_equal(_session(out).run(None, {"x": x})[0],
                                      reference.run(None, {"x": x})[0])


def test_a_grouped_convolution_that_needs_chunks_is_refused():
    rng = np.random.default_rng(4)
    model = _model(np.uint8, _random(rng, np.uint8, (4, 64, 3, 3)), np.array(0, np.uint8),
                   np.array(255, np.uint8), {"group": 2}, (3, 3))
    with pytest.raises(UnsupportedNodeError, match="grouped ConvInteger"):
        decomposer.decompose(model, lower=["ConvInteger"])


@pytest.fixture(scope="module")
def dynamic_cnn(tmp_path_factory):
    """quantize_dynamic's CNN saved at ORT_ENABLE_ALL (ConvInteger and DynamicQuantizeMatMul,
    as tests/test_ort_quantized_models.py writes it)."""
    import torch
    from onnxruntime.quantization import quantize_dynamic

    folder = tmp_path_factory.mktemp("conv_integer")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Conv2d(16, 32, 3, stride=2), torch.nn.ReLU(),
                              torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                              torch.nn.Linear(32, 5)).eval()
    source, quantized = folder / "cnn.onnx", folder / "cnn_dynamic.onnx"
    torch.onnx.export(net, (torch.randn(1, 3, 16, 16),), str(source), opset_version=17,
                      dynamo=False, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "n"}, "y": {0: "n"}})
    quantize_dynamic(str(source), str(quantized))
    model = onnx.load(str(quantized))
    assert "ConvInteger" in {n.op_type for n in model.graph.node}
    return model


def _cnn_feeds(seed, batch):
    return {"x": np.random.default_rng(seed).standard_normal((batch, 3, 16, 16))
            .astype(np.float32)}


def test_quantize_dynamic_cnn_lowered_whole(dynamic_cnn):
    out = decomposer.decompose(dynamic_cnn, lower=["ConvInteger", "DynamicQuantizeLinear"])
    onnx.checker.check_model(out, full_check=True)
    assert not {"ConvInteger", "DynamicQuantizeLinear"} & {n.op_type for n in out.graph.node}
    for seed, batch in ((1, 2), (2, 1)):
        feeds = _cnn_feeds(seed, batch)
        np.testing.assert_array_equal(_session(out).run(None, feeds)[0],
                                      _session(dynamic_cnn).run(None, feeds)[0])


@pytest.mark.skipif(not engines.available("tvm"), reason="TVM is not installed")
def test_tvm_target_lowers_it(dynamic_cnn):
    """TVM 0.27 refuses the model ("not supported for frontend ONNX: ConvInteger"); its
    target lowers the op, and the result is ONNX Runtime's on the original."""
    out = decomposer.decompose(dynamic_cnn, target="tvm")
    assert "ConvInteger" not in {n.op_type for n in out.graph.node}
    feeds = _cnn_feeds(3, 2)
    (got,) = engines.run_model("tvm", out, feeds)
    np.testing.assert_allclose(got, _session(dynamic_cnn).run(None, feeds)[0], rtol=0,
                               atol=1e-6)


def portability_cases():
    """The lowering on every engine, ONNX Runtime's kernel the oracle (exact: int32)."""
    rng = np.random.default_rng(9)
    model = _model(np.uint8, _random(rng, np.int8, (6, 40, 3, 3)), np.array(131, np.uint8),
                   np.array(-3, np.int8), {"pads": [1, 1, 1, 1]}, (3, 3))
    feeds = [{"x": _random(rng, np.uint8, (b, 40, s, s))} for b, s in ((2, 8), (1, 5))]
    expected = [_session(model).run(None, f) for f in feeds]
    return [{"id": "ConvInteger lowered", "model": model, "feeds": feeds,
             "expected": expected, "atol": 0, "lower": ("ConvInteger",)}]
