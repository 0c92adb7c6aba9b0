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


@pytest.mark.parametrize("onesided", [1, 0])
@pytest.mark.parametrize("windowed", [True, False])
def test_stft_against_torch(onesided, windowed):
    """Windowed through the kit; without a window (frame_length given, the window input
    left out) as a hand-made opset-17 model taken down."""
    from decomposer.patterns.dft import STFT

    rng = np.random.default_rng(9)
    frame, step = 16, 5
    window = np.hanning(frame).astype(np.float32)

    def oracle(signal, frame_step, window=None, frame_length=None, onesided=1):
        size = frame if window is None else len(window)
        spectrum = torch.stft(torch.from_numpy(signal[..., 0].astype(np.float64)), n_fft=size,
                              hop_length=int(frame_step), win_length=size,
                              window=torch.ones(size, dtype=torch.float64) if window is None
                              else torch.from_numpy(window.astype(np.float64)),
                              center=False, onesided=bool(onesided), return_complex=True)
        out = torch.stack([spectrum.real, spectrum.imag], -1).transpose(1, 2)
        return out.numpy().astype(np.float32)

    signal = rng.standard_normal((2, 64, 1)).astype(np.float32)
    if windowed:
        cases = [Case([signal, np.array(step, np.int64), window], {"onesided": onesided},
                      constant_inputs=[1], symbolic={0: (0,)}, output_rank=4)]
        check_pattern(STFT(), cases, opsets=[11, 13, 16], domain="", oracle=oracle,
                      atol=2e-5, rtol=1e-4)
        return
    graph = helper.make_graph(
        [helper.make_node("STFT", ["x", "step", "", "frame"], ["y"], name="stft",
                          onesided=onesided)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 64, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "f", "k", 2])],
        [helper.make_tensor("step", TensorProto.INT64, [], [step]),
         helper.make_tensor("frame", TensorProto.INT64, [], [frame])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    out = decomposer.decompose(model, target_opset=13)
    onnx.checker.check_model(out, full_check=True)
    (got,) = run_onnxruntime(out, {"x": signal})
    np.testing.assert_allclose(got, oracle(signal, step, None, frame, onesided), atol=2e-5,
                               rtol=1e-4)


def portability_cases():
    """DFT (one-sided) and STFT (windowed) at 13, torch.fft / torch.stft as the oracles."""
    rng = np.random.default_rng(13)
    signal = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 32, 1])
    dft = helper.make_model(helper.make_graph(
        [helper.make_node("DFT", ["x"], ["y"], axis=1, onesided=1)], "dft", [signal],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 17, 2])]),
        opset_imports=[helper.make_opsetid("", 13)])
    window = np.hanning(16).astype(np.float32)
    stft = helper.make_model(helper.make_graph(
        [helper.make_node("STFT", ["x", "step", "w"], ["y"])], "stft", [signal],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 5, 9, 2])],
        [helper.make_tensor("step", TensorProto.INT64, [], [4]),
         onnx.numpy_helper.from_array(window, "w")]),
        opset_imports=[helper.make_opsetid("", 13)])
    inputs = [rng.standard_normal((rows, 32, 1)).astype(np.float32) for rows in (2, 1)]

    def spectrogram(x):
        spectrum = torch.stft(torch.from_numpy(x[..., 0].astype(np.float64)), n_fft=16,
                              hop_length=4, win_length=16,
                              window=torch.from_numpy(window.astype(np.float64)),
                              center=False, onesided=True, return_complex=True)
        return torch.stack([spectrum.real, spectrum.imag], -1).transpose(1, 2).numpy()

    return [{"id": "DFT below 17", "model": dft, "feeds": [{"x": a} for a in inputs],
             "expected": [[torch_dft(a, axis=1, onesided=1)] for a in inputs], "atol": 1e-4},
            {"id": "STFT below 17", "model": stft, "feeds": [{"x": a} for a in inputs],
             "expected": [[spectrogram(a).astype(np.float32)] for a in inputs],
             "atol": 1e-4}]


def test_a_non_integer_frame_step_is_refused_not_a_crash():
    """A fuzz finding: a string frame_step crashed the check (int('bilinear'))."""
    graph = helper.make_graph(
        [helper.make_node("STFT", ["x", "step"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 32, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("step", TensorProto.STRING, [], [b"bilinear"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(decomposer.UnsupportedNodeError, match="frame_step"):
        decomposer.decompose(model, target_opset=13, check=False)
