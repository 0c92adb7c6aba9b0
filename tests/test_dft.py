"""DFT below opset 17 against torch.fft (fft, ifft, rfft-style one-sided bins), real and
complex input, cut and zero-padded lengths, through the kit and through ``--target-opset``."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import decomposer
from decomposer.patterns.dft import DFT
from decomposer.testing import Case, check_pattern, run_onnxruntime


def torch_dft(x, dft_length=None, axis=1, inverse=0, onesided=0):
    signal = torch.from_numpy(x.astype(np.float64))
    signal = torch.complex(signal[..., 0], signal[..., 1]) if x.shape[-1] == 2 else \
        signal[..., 0]
    n = None if dft_length is None else int(np.asarray(dft_length).reshape(()))
    axis %= x.ndim  # counted with the complex dim, which the torch signal lacks
    result = (torch.fft.ifft if inverse else torch.fft.fft)(signal, n=n, dim=axis)
    if onesided:
        result = result.narrow(axis, 0, result.shape[axis] // 2 + 1)
    return torch.stack([result.real, result.imag], -1).numpy().astype(x.dtype)


@pytest.mark.parametrize("complex_input", [False, True])
@pytest.mark.parametrize("inverse, onesided", [(0, 0), (1, 0), (0, 1)])
def test_against_torch_fft(complex_input, inverse, onesided):
    rng = np.random.default_rng(5)
    last = 2 if complex_input else 1
    cases = []
    for axis, shape in ((1, (3, 16, last)), (2, (2, 4, 10, last)), (-2, (2, 12, last))):
        cases.append(Case([rng.standard_normal(shape).astype(np.float32)],
                          {"axis": axis, "inverse": inverse, "onesided": onesided},
                          symbolic={0: (0,)}, id=f"axis={axis}"))
    for length in (8, 20):  # cut, zero-padded
        cases.append(Case([rng.standard_normal((2, 12, last)).astype(np.float32),
                           np.array(length, np.int64)],
                          {"axis": 1, "inverse": inverse, "onesided": onesided},
                          constant_inputs=[1], id=f"dft_length={length}"))
    check_pattern(DFT(), cases, opsets=[11, 13, 16], domain="", oracle=torch_dft,
                  atol=2e-5, rtol=1e-4)


def test_dft_20_goes_down_with_its_axis_input():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 3, 32, 1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 3, 17, 2])
    graph = helper.make_graph(
        [helper.make_node("DFT", ["x", "", "axis"], ["y"], name="spectrum", onesided=1)],
        "g", [x], [y], [helper.make_tensor("axis", TensorProto.INT64, [], [-2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    for target in (17, 13):
        out, report = decomposer.decompose_with_report(model, target_opset=target)
        onnx.checker.check_model(out, full_check=True)
        data = np.random.default_rng(1).standard_normal((2, 3, 32, 1)).astype(np.float32)
        (got,) = run_onnxruntime(out, {"x": data})
        want = torch_dft(data, axis=2, onesided=1)
        np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4)
        assert ("DFT" in {n.op_type for n in out.graph.node}) == (target == 17)


def test_one_sided_inverse_is_refused_with_the_reason():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 5, 2])
    graph = helper.make_graph([helper.make_node("DFT", ["x"], ["y"], name="irfft", inverse=1,
                                                onesided=1)], "g", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                             ["a", "b", "c"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(decomposer.UnsupportedNodeError, match="irfft"):
        decomposer.decompose(model, target_opset=13)


def test_run_time_signal_length_is_refused():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "n", 1])
    graph = helper.make_graph([helper.make_node("DFT", ["x"], ["y"], name="spectrum")], "g",
                              [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                  ["b", "n", 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(decomposer.UnsupportedNodeError, match="must be static"):
        decomposer.decompose(model, target_opset=13)
