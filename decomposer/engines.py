"""Run an ONNX model on an inference engine: ONNX Runtime, OpenVINO or Apache TVM (Relax).

In: an engine name (a key of :data:`ENGINES`), an ``onnx.ModelProto`` and feeds (graph input
name -> numpy array). Out: the model's outputs as numpy arrays, in graph-output order.

- ``"ort"``: ONNX Runtime, CPU execution provider only (no custom-op libraries), with
  ``session.qdq_matmulnbits_accuracy_level`` 0: a block-quantized DequantizeLinear + MatMul
  it fuses keeps float32 activations (by default it would quantize them to int8).
- ``"openvino"``: OpenVINO on CPU, compiled with ``INFERENCE_PRECISION_HINT=f32`` (it would
  otherwise compute in bf16 on CPUs that have it) and ``DYNAMIC_QUANTIZATION_GROUP_SIZE``
  0 (no int8 activations for compressed weights). Dynamic shapes by default; with
  ``static_shapes=True`` the model is first reshaped to the feeds' shapes.
- ``"tvm"``: ``tvm.relax.frontend.onnx`` compiled for ``llvm`` and run on the Relax VM. With
  ``static_shapes=True`` every input dim is fixed to the feeds'; otherwise the model's own
  dims are kept (symbolic names become TVM shape variables, where TVM can take them).

Every failure of an engine to load, compile or run a model raises
:class:`decomposer.errors.EngineRunError` (``.engine`` names the engine) whose message is the
engine's first informative error line (source-location and traceback lines are skipped); an
engine that is not installed raises :class:`decomposer.errors.EngineUnavailableError` naming
the pip package to install. Engines are imported lazily, on first use: importing
``decomposer`` never imports openvino, tvm or torch. This module knows no ONNX op by name.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from decomposer.errors import EngineRunError, EngineUnavailableError


@dataclass(frozen=True)
class EngineSpec:
    """How to find one engine: the module to import, the pip package that provides it, and
    the name people know it by."""

    module: str
    package: str
    human_name: str


ENGINES: dict[str, EngineSpec] = {
    "ort": EngineSpec("onnxruntime", "onnxruntime", "ONNX Runtime (CPU)"),
    "openvino": EngineSpec("openvino", "openvino", "OpenVINO (CPU, f32)"),
    "tvm": EngineSpec("tvm", "apache-tvm", "Apache TVM (Relax, llvm)"),
}

OPENVINO_CONFIG = {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"}
# ONNX Runtime session entries: the definition's arithmetic, not a faster approximation.
ORT_CONFIG = {"session.qdq_matmulnbits_accuracy_level": "0"}
TVM_TARGET = "llvm"

_IMPORTED: dict[str, Any] = {}  # engine name -> its imported module, or the import error


def _spec(name: str) -> EngineSpec:
    spec = ENGINES.get(name)
    if spec is None:
        raise EngineUnavailableError(
            f"unknown engine {name!r}; accepted: {', '.join(ENGINES)}")
    return spec


def _import(name: str) -> Any:
    """The engine's module, imported once; an ImportError (or anything a broken install
    raises while importing) is remembered and returned instead of raised."""
    if name not in _IMPORTED:
        try:
            _IMPORTED[name] = importlib.import_module(_spec(name).module)
        except Exception as error:  # a half-installed engine can fail in many ways
            _IMPORTED[name] = error
    return _IMPORTED[name]


def available(name: str) -> bool:
    """Whether engine ``name`` is installed and importable (False for unknown names)."""
    return name in ENGINES and not isinstance(_import(name), BaseException)


def require(name: str) -> None:
    """Raise EngineUnavailableError unless engine ``name`` can be used; the message names
    the pip package (or lists the accepted engines for an unknown name)."""
    spec = _spec(name)
    module = _import(name)
    if isinstance(module, BaseException):
        raise EngineUnavailableError(
            f"engine {name!r} ({spec.human_name}) is not available: "
            f"{first_error_line(str(module)) or type(module).__name__}; "
            f"install it with `pip install {spec.package}`")


def engine_version(name: str) -> str:
    """The installed version of engine ``name`` (raises EngineUnavailableError if absent)."""
    require(name)
    try:  # the package's release number ("2026.4.1"), shorter than some __version__s
        return importlib.metadata.version(_spec(name).package)
    except importlib.metadata.PackageNotFoundError:
        return str(getattr(_import(name), "__version__", "unknown"))


def run_model(engine: str, model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], *,
              static_shapes: bool = False) -> list[np.ndarray]:
    """Run ``model`` on ``engine`` with ``feeds``; the outputs in graph-output order.

    Raises EngineUnavailableError if the engine is not installed, EngineRunError (with the
    engine's first error line) if it cannot load, compile or run the model. The last few
    compiled models are kept, so running the same model again (with feeds of the same
    shapes when ``static_shapes``) does not compile it again.
    """
    require(engine)
    arrays = {name: np.asarray(value) for name, value in feeds.items()}
    try:
        compiled = _compiled(engine, model, arrays, static_shapes)
        outputs = compiled(arrays)
    except EngineRunError:
        raise
    except Exception as error:  # engines raise their own types (RuntimeError, TVMError, ...)
        message = first_error_line(str(error)) or type(error).__name__
        raise EngineRunError(message, engine=engine) from error
    return [np.asarray(output) for output in outputs]


Compiled = Callable[[Mapping[str, np.ndarray]], list[np.ndarray]]
_CACHE: OrderedDict[tuple[str, bytes, tuple[Any, ...]], Compiled] = OrderedDict()
_CACHE_SIZE = 8


def _compiled(engine: str, model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
              static_shapes: bool) -> Compiled:
    """The engine's compiled form of ``model`` (for the feeds' shapes if static), cached by
    the model's bytes; a failed compile is not cached."""
    data = model.SerializeToString(deterministic=True)
    shapes: tuple[Any, ...] = tuple(sorted(
        (name, value.shape if static_shapes else value.ndim, value.dtype.str)
        for name, value in feeds.items()))
    key = (engine, hashlib.sha256(data).digest(), (static_shapes, shapes))
    compiled = _CACHE.get(key)
    if compiled is None:
        compiled = _PREPARE[engine](model, data, feeds, static_shapes)
        _CACHE[key] = compiled
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    else:
        _CACHE.move_to_end(key)
    return compiled


# -- error messages ----------------------------------------------------------------------

# Lines that say where an error was raised, not what it is: OpenVINO's
# "Exception from src/...cpp:117:", "Check 'x' failed at src/...:", "Details:",
# "Not Implemented:", and Python/TVM traceback lines.
_NOISE_LINE = re.compile(
    r"""^(exception\s+from\s+\S+:\d+:?
        |check\s+'.*'\s+failed\s+at\s+\S+:?
        |details:?
        |not\s+implemented:?
        |traceback\s+\(most\s+recent\s+call\s+last\):?
        |file\s+".*",\s+line\s+\d+.*
        |\[\s*\d+:\d+:\d+\s*\]\s+\S+:\d+:\s+warning:.*
        )$""",
    re.IGNORECASE | re.VERBOSE)


def first_error_line(text: str) -> str:
    """The first line of an engine's error text that says what went wrong.

    Source locations, traceback frames and section headers are skipped; an OpenVINO-style
    "Details:" section's first real line is appended after " -- " since it carries the
    reason (e.g. "Unsupported operation ... -- Doesn't support dynamic weights shape").
    """
    lines = [line.strip() for line in text.splitlines()]
    informative = [(index, line) for index, line in enumerate(lines)
                   if line and not _NOISE_LINE.match(line) and not line.startswith("^")]
    if not informative:
        return ""
    first_index, first = informative[0]
    details = next((index for index, line in enumerate(lines)
                    if index > first_index and line.lower().rstrip(":") == "details"), None)
    if details is not None:
        reason = next((line for index, line in informative if index > details), None)
        if reason and reason != first:
            return f"{first} -- {reason}"
    return first


# -- runners -------------------------------------------------------------------------------

def _output_names(model: onnx.ModelProto) -> list[str]:
    return [output.name for output in model.graph.output]


def _runtime_inputs(model: onnx.ModelProto) -> list[str]:
    """Graph inputs the caller must feed (initializers with the same name excluded)."""
    initialized = {tensor.name for tensor in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in initialized]


def _check_feeds(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[str]:
    names = _runtime_inputs(model)
    missing = [name for name in names if name not in feeds]
    if missing:
        raise ValueError(f"missing feeds for input(s) {missing}")
    return names


def _prepare_ort(model: onnx.ModelProto, data: bytes, feeds: Mapping[str, np.ndarray],
                 static_shapes: bool) -> Compiled:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    for key, value in ORT_CONFIG.items():
        options.add_session_config_entry(key, value)
    if static_shapes:
        data = with_static_inputs(model, feeds).SerializeToString()
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}

    def run(arrays: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        return list(session.run(None, {k: v for k, v in arrays.items() if k in wanted}))
    return run


def _prepare_openvino(model: onnx.ModelProto, data: bytes, feeds: Mapping[str, np.ndarray],
                      static_shapes: bool) -> Compiled:
    import openvino as ov

    names = _check_feeds(model, feeds)
    core = ov.Core()
    ov_model = core.read_model(data)
    # Ports are found by any of their names: where OpenVINO drops a no-op right after an
    # input (a Slice of all of it, with static shapes), the input port takes that op's
    # output name as its "any" name, and an input looked up by get_any_name() was left
    # unfed (garbage results, no error).
    if static_shapes:
        ov_model.reshape({port: ov.PartialShape(list(feeds[name].shape))
                          for port in ov_model.inputs
                          for name in port.get_names() & set(feeds)})
    compiled = core.compile_model(ov_model, "CPU", OPENVINO_CONFIG)
    by_name = {name: port for port in compiled.inputs for name in port.get_names()}
    # OpenVINO may reorder outputs; find each graph output by name (index as a fallback).
    ports = [next((p for p in compiled.outputs if name in p.get_names()), compiled.outputs[i])
             for i, name in enumerate(_output_names(model))]

    def run(arrays: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        request = compiled.create_infer_request()
        results = request.infer({by_name[name]: arrays[name] for name in names
                                 if name in by_name})
        return [np.array(results[port]) for port in ports]
    return run


def _prepare_tvm(model: onnx.ModelProto, data: bytes, feeds: Mapping[str, np.ndarray],
                 static_shapes: bool) -> Compiled:
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    names = _check_feeds(model, feeds)
    shape_dict = {name: list(feeds[name].shape) for name in names} if static_shapes else None
    dtype_dict = {name: str(feeds[name].dtype) for name in names}
    module = from_onnx(model, shape_dict=shape_dict, dtype_dict=dtype_dict,
                       keep_params_in_input=False)
    module = relax.transform.DecomposeOpsForInference()(module)
    module = relax.transform.LegalizeOps()(module)
    executable = tvm.compile(module, target=TVM_TARGET)
    device = tvm.cpu()
    vm = relax.VirtualMachine(executable, device)

    def run(arrays: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        # The Relax main function takes the runtime inputs in graph-input order. (Not
        # np.ascontiguousarray: it turns a 0-d array, such as an If condition, into 1-d.)
        args = [tvm.runtime.tensor(np.array(arrays[name], order="C"), device)
                for name in names]
        return _tvm_flatten(vm["main"](*args))
    return run


def _tvm_flatten(value: Any) -> list[np.ndarray]:
    """A Relax result (one tensor, or a possibly nested tuple of them) as numpy arrays."""
    if hasattr(value, "numpy"):
        return [value.numpy()]
    flat: list[np.ndarray] = []
    for item in value:
        flat.extend(_tvm_flatten(item))
    return flat


_PREPARE: dict[str, Callable[[onnx.ModelProto, bytes, Mapping[str, np.ndarray], bool],
                             Compiled]] = {
    "ort": _prepare_ort,
    "openvino": _prepare_openvino,
    "tvm": _prepare_tvm,
}


def with_static_inputs(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]
                       ) -> onnx.ModelProto:
    """A copy of ``model`` whose fed graph inputs declare the feeds' exact shapes."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for graph_input in fixed.graph.input:
        if graph_input.name not in feeds or not graph_input.type.HasField("tensor_type"):
            continue
        shape = graph_input.type.tensor_type.shape
        shape.Clear()
        for size in np.asarray(feeds[graph_input.name]).shape:
            shape.dim.add().dim_value = int(size)
    return fixed
