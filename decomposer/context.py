"""What a pattern may ask about the graph around a node: constants, types and shapes.

In: the model being rewritten, and the scope (graph, enclosing graphs, name space) a node
lives in. Out: :class:`NodeContext`, the :class:`decomposer.pattern.MatchContext` handed to
``Pattern.check``.

Name spaces: the main graph and its If/Loop/Scan bodies share one (a body may read outer
names); each model-local function has its own, so a function's tensor ``t`` never takes the
type of an unrelated main-graph tensor also called ``t``. Types come from the model's own
annotations plus ONNX shape inference, which runs lazily, once, and only if a pattern asks.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from decomposer.graphs import all_graphs, externals_as_inputs, norm_domain
from decomposer.modelio import read_external

log = logging.getLogger("decomposer")

MAIN_NAMESPACE = "main graph"


class Scope:
    """One graph being rewritten, with its enclosing scopes for outer-name lookups.

    ``namespace`` names the name space it belongs to (:data:`MAIN_NAMESPACE` or a function's
    label); ``is_function`` says whether that is a function body, whose "inputs" are its call
    sites' arguments, not the model's inputs.
    """

    def __init__(self, graph: onnx.GraphProto, label: str, parent: Scope | None,
                 namespace: str = MAIN_NAMESPACE, is_function: bool = False) -> None:
        self.graph = graph
        self.label = label
        self.parent = parent
        self.namespace: str = parent.namespace if parent is not None else namespace
        self.is_function: bool = parent.is_function if parent is not None else is_function
        self._constants: dict[str, onnx.TensorProto | onnx.NodeProto] | None = None
        self._fed: frozenset[str] | None = None
        self._outputs: frozenset[str] | None = None

    def fed_names(self) -> frozenset[str]:
        """Graph inputs with no initializer of the same name (read once: a lookup per node
        scanning the inputs made large models quadratic)."""
        if self._fed is None:
            initialized = {init.name for init in self.graph.initializer}
            self._fed = frozenset(value.name for value in self.graph.input
                                  if value.name not in initialized)
        return self._fed

    def output_names(self) -> frozenset[str]:
        if self._outputs is None:
            self._outputs = frozenset(value.name for value in self.graph.output)
        return self._outputs

    def child(self, graph: onnx.GraphProto, label: str) -> Scope:
        return Scope(graph, label, self)

    def constant_source(self, name: str) -> onnx.TensorProto | onnx.NodeProto | None:
        scope: Scope | None = self
        while scope is not None:
            found = scope._own_constants().get(name)
            if found is not None:
                return found
            scope = scope.parent
        return None

    def index_constants(self) -> None:
        """Read this graph's constants now: the engine calls it before it rebuilds the
        node list in place, so lookups keep seeing the graph as the pass found it."""
        self._own_constants()

    def _own_constants(self) -> dict[str, onnx.TensorProto | onnx.NodeProto]:
        if self._constants is None:
            constants: dict[str, onnx.TensorProto | onnx.NodeProto] = {}
            for init in self.graph.initializer:
                constants[init.name] = init
            for node in self.graph.node:
                if node.op_type == "Constant" and norm_domain(node.domain) == "":
                    for out in node.output:
                        constants[out] = node
            # A graph input with the initializer's name may be overridden at run time:
            # such an initializer is a default, not a constant.
            for value in self.graph.input:
                constants.pop(value.name, None)
            self._derive_constants(constants)
            self._constants = constants
        return self._constants

    def _derive_constants(self, constants: dict[str, onnx.TensorProto | onnx.NodeProto]
                          ) -> None:
        """Add what standard nodes compute from constants alone and patterns read as
        constants: an ``Identity`` of one (torch's exporter writes one for each tied
        weight), and a uint8/int8 ``QuantizeLinear`` of one (``quantize_static``'s
        quantized biases), computed as ONNX Runtime's kernel does (divide, round half to
        even, add the zero point, saturate)."""
        def lookup(name: str) -> onnx.TensorProto | onnx.NodeProto | None:
            found = constants.get(name)
            if found is None and self.parent is not None:
                found = self.parent.constant_source(name)
            return found

        for node in self.graph.node:
            if norm_domain(node.domain) != "" or len(node.output) != 1 or not node.input:
                continue
            if node.op_type == "Identity":
                source = lookup(node.input[0])
                if source is not None:
                    constants[node.output[0]] = source
            elif node.op_type == "QuantizeLinear":
                folded = _quantized_constant(node, lookup)
                if folded is not None:
                    constants[node.output[0]] = folded


class TypeTables:
    """Static types of tensors, one table per name space, filled lazily."""

    def __init__(self, model: onnx.ModelProto,
                 hints: dict[str, onnx.TypeProto] | None = None) -> None:
        # hints: main-graph types known otherwise (the model before --target-opset took it
        # down: an older opset's inference can know less, e.g. a Reshape to a Shape before
        # 13); what inference finds wins, unless it found no shape
        self._model = model
        self._hints = hints
        self._tables: dict[str, dict[str, onnx.TypeProto]] | None = None
        self._recorded: dict[tuple[Any, ...], onnx.TypeProto] = {}
        self._asked_runtime = False
        self._light: onnx.ModelProto | None = None

    def load(self) -> None:
        """Infer now (else on the first question): the engine calls it before it rebuilds a
        node list in place, so inference sees the model as the pass found it."""
        self._load()

    def _load(self) -> dict[str, dict[str, onnx.TypeProto]]:
        if self._tables is not None:
            return self._tables
        main: dict[str, onnx.TypeProto] = {}
        inferred = self._model
        try:
            # kept for add_runtime_inference: the engine rebuilds node lists in place later
            self._light = light_copy(self._model)
            inferred = _inferred(self._light)
        except Exception as exc:  # inference is a best effort; declared types still count
            log.debug("shape inference failed, using declared types only: %s", exc)
        for graph in all_graphs(inferred.graph):
            for value in [*graph.input, *graph.output, *graph.value_info]:
                if value.type.WhichOneof("value") is not None:  # tensors, and the others
                    main.setdefault(value.name, value.type)      # so they can be told apart
            for init in graph.initializer:
                main.setdefault(init.name, onnx.helper.make_tensor_type_proto(
                    init.data_type, list(init.dims)))
        for name, type_proto in (self._hints or {}).items():
            known = main.get(name)
            if known is None or (known.HasField("tensor_type") and
                                 not known.tensor_type.HasField("shape")):
                main[name] = type_proto
        tables = {MAIN_NAMESPACE: main}
        for function in self._model.functions:
            table: dict[str, onnx.TypeProto] = {}
            for value in getattr(function, "value_info", []):
                if value.type.HasField("tensor_type"):
                    table.setdefault(value.name, value.type)
            tables[function_label(function)] = table
        self._tables = tables
        return tables

    def add_runtime_inference(self) -> bool:
        """Once per table set: the main-graph types ONNX Runtime's symbolic shape inference
        finds where ONNX's own inference found none (it knows the contrib ops: a tensor made
        by a contrib node no pattern rewrites is untyped otherwise). Its guesses for ops no
        runtime knows (a user's own domain) are not taken: a tensor computed from such an
        op, however indirectly, stays unknown. Whether any type was added; the engine asks
        only when a pattern refused for a missing type (it costs sympy's import, ~2 s)."""
        if self._asked_runtime:
            return False
        self._asked_runtime = True
        main = self._table(MAIN_NAMESPACE)
        found = _runtime_inferred(self._light) if self._light is not None else {}
        added = False
        for name, type_proto in found.items():
            known = main.get(name)
            if known is None or (known.HasField("tensor_type") and (
                    not known.tensor_type.elem_type or
                    not known.tensor_type.HasField("shape"))):
                main[name] = type_proto
                added = True
        return added

    def _table(self, namespace: str) -> dict[str, onnx.TypeProto]:
        return self._load().setdefault(namespace, {})

    def record(self, namespace: str, name: str, elem_type: int | None,
               shape: Sequence[int | str | None] | None) -> None:
        """Remember a rewritten node's output type, unless inference already knows it."""
        table = self._table(namespace)
        if name not in table:
            # a dim name that is not text (undecodable bytes in a damaged model) is unknown
            dims = None if shape is None else \
                tuple(d if isinstance(d, (int, str)) else None for d in shape)
            # Replayed nodes record the same types over and over: share one (read-only) proto.
            known = self._recorded.get((elem_type, dims))
            if known is None:
                known = onnx.helper.make_tensor_type_proto(elem_type or 0, dims)
                self._recorded[elem_type, dims] = known
            table[name] = known

    def is_non_tensor(self, namespace: str, name: str) -> bool:
        """Whether ``name`` is declared (or inferred) as a sequence, map or optional value."""
        tp = self._table(namespace).get(name)
        return tp is not None and tp.WhichOneof("value") not in (None, "tensor_type")

    def tensor_type(self, namespace: str, name: str) -> onnx.TypeProto.Tensor | None:
        tp = self._table(namespace).get(name)
        return tp.tensor_type if tp is not None and tp.HasField("tensor_type") else None


def _runtime_inferred(light: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Main-graph tensor types of ``light`` (a :func:`light_copy`) from ONNX Runtime's
    ``symbolic_shape_infer`` (shipped with onnxruntime; needs sympy), leaving out every
    tensor downstream of a node whose (domain, op) ONNX Runtime registers no schema for or
    (outside the default domain) the tool has no handler for: it guesses those. Empty when
    the tool is missing or fails."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as runtime
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    except ImportError as exc:
        log.debug("ONNX Runtime's symbolic shape inference is unavailable: %s", exc)
        return {}
    known_ops = {(norm_domain(schema.domain), schema.name)
                 for schema in runtime.get_all_operator_schema()}
    quiet = logging.getLogger("onnxruntime.tools.symbolic_shape_infer")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        # SymbolicShapeInference.infer_shapes's own loop, minus its last step: when some
        # shape stays unknown it saves the model as sym_shape_infer_temp.onnx (and external
        # data) into the working directory, the user's, and raises; what it did find is
        # kept here instead
        tool = SymbolicShapeInference(2 ** 31 - 1, True, True, 0)
        tool._preprocess(light)
        while tool.run_:
            tool._infer_impl()
        tool._update_output_from_vi()
        inferred = tool.out_mp_
    except Exception as exc:  # best effort, as ONNX's own inference
        log.debug("ONNX Runtime's symbolic shape inference failed: %s", exc)
        return {}
    finally:
        quiet.setLevel(level)
    if inferred is None:
        return {}
    # the contrib ops the tool has a handler for; for any other non-standard op it copies
    # the first input's type and rank (guess_output_rank), which is often wrong
    # (a quantized embedding's float output typed int32, a quantized attention's uint8:
    # measured on a quantize_dynamic BERT)
    handled = set(tool.dispatcher_)
    guessed: set[str] = set()
    for node in light.graph.node:
        domain = norm_domain(node.domain)
        if (domain, node.op_type) not in known_ops or \
                (domain and node.op_type not in handled) or \
                any(name in guessed for name in node.input):
            guessed.update(node.output)
    found: dict[str, onnx.TypeProto] = {}
    for value in [*inferred.graph.value_info, *inferred.graph.output]:
        if value.name not in guessed and value.type.HasField("tensor_type") and \
                value.type.tensor_type.elem_type:
            found[value.name] = value.type
    return found


def _inferred(light: onnx.ModelProto) -> onnx.ModelProto:
    """ONNX shape inference with data propagation, so that a Reshape to dims computed from
    Shape (what torch's legacy exporter writes for ``x.view(n, s, m, d)``) keeps its static
    dims. Reshape-13's inference ignores propagated data; below opset 14 inference runs a
    second time with the default opset read as 14 (Reshape-14 is Reshape-13 plus
    ``allowzero``, off by default), filling only what the first pass left unknown."""
    inferred = onnx.shape_inference.infer_shapes(light, data_prop=True)
    opset = next((entry.version for entry in light.opset_import
                  if entry.domain in ("", "ai.onnx")), 0)
    if not 0 < opset < 14:
        return inferred
    probe = onnx.ModelProto()
    probe.CopyFrom(light)
    for entry in probe.opset_import:
        if entry.domain in ("", "ai.onnx"):
            entry.version = 14
    try:
        bumped = onnx.shape_inference.infer_shapes(probe, data_prop=True)
    except Exception as exc:  # best effort: keep what the model's own opset gave
        log.debug("opset-14 shape inference failed: %s", exc)
        return inferred
    known = {value.name: value for value in inferred.graph.value_info}
    for value in bumped.graph.value_info:
        mine = known.get(value.name)
        if mine is None or _unknown_dims(mine) > _unknown_dims(value):
            if mine is not None:
                mine.CopyFrom(value)
            else:
                inferred.graph.value_info.append(value)
    return inferred


def _unknown_dims(value: onnx.ValueInfoProto) -> int:
    """How much of a value's type is unknown (no shape: more than any rank)."""
    tensor = value.type.tensor_type
    if not tensor.HasField("shape"):
        return 1 << 20
    return sum(1 for dim in tensor.shape.dim if not dim.HasField("dim_value"))


def function_label(function: onnx.FunctionProto) -> str:
    """How reports name a local function; also the key of its name space."""
    overload = getattr(function, "overload", "")
    suffix = f" (overload '{overload}')" if overload else ""
    return f"function '{function.domain}::{function.name}'{suffix}"


def light_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy for shape inference in which large initializers become typed graph inputs,
    so inference never copies weight bytes (shape tensors are small and stay)."""
    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    graph = light.graph
    source = model.graph
    graph.name = source.name
    graph.node.extend(source.node)
    graph.input.extend(source.input)
    graph.output.extend(source.output)
    graph.value_info.extend(source.value_info)
    externals_as_inputs(source, graph, keep=lambda init: (
        init.data_location != onnx.TensorProto.EXTERNAL and init.ByteSize() <= 4096))
    return light


class NodeContext:
    """The :class:`decomposer.pattern.MatchContext` handed to ``Pattern.check``."""

    def __init__(self, scope: Scope, types: TypeTables, opset: int,
                 target: str = "portable", base_dir: str | None = None,
                 avoid: frozenset[str] = frozenset(), engines: tuple[str, ...] = ()) -> None:
        self._scope = scope
        self._types = types
        self.opset = opset
        self.target = target
        self.avoid = avoid
        self.engines = engines
        self._base_dir = base_dir  # the model file's folder, for external weights
        self._weights: dict[str, np.ndarray | None] = {}  # read once per node

    def constant(self, name: str) -> np.ndarray | None:
        if not name:
            return None
        source = self._scope.constant_source(name)
        if source is None:
            return None
        try:
            if isinstance(source, onnx.TensorProto):
                if source.data_location == onnx.TensorProto.EXTERNAL:
                    return None
                return numpy_helper.to_array(source)
            return constant_node_value(source)
        except Exception:  # a malformed constant is simply not a usable constant
            return None

    def weight(self, name: str) -> np.ndarray | None:
        if name not in self._weights:
            self._weights[name] = self._read_weight(name)
        return self._weights[name]

    def _read_weight(self, name: str) -> np.ndarray | None:
        source = self._scope.constant_source(name) if name else None
        if not isinstance(source, onnx.TensorProto) \
                or source.data_location != onnx.TensorProto.EXTERNAL:
            return self.constant(name)
        if self._base_dir is None:
            return None
        try:
            return numpy_helper.to_array(read_external(source, self._base_dir))
        except Exception:  # unreadable here: the pattern falls back as for a non-constant
            return None

    def shape(self, name: str) -> tuple[int | str | None, ...] | None:
        tensor = self._types.tensor_type(self._scope.namespace, name) if name else None
        if tensor is None or not tensor.HasField("shape"):
            const = self.constant(name)
            return tuple(const.shape) if const is not None else None
        dims: list[int | str | None] = []
        for dim in tensor.shape.dim:
            if dim.HasField("dim_value"):
                dims.append(dim.dim_value)
            elif dim.HasField("dim_param"):
                dims.append(dim.dim_param)
            else:
                dims.append(None)
        return tuple(dims)

    def is_model_input(self, name: str) -> bool:
        scope = self._scope
        while scope.parent is not None:
            scope = scope.parent
        if scope.is_function:  # its inputs are call-site arguments, possibly constants
            return False
        return name in scope.fed_names()

    def is_model_output(self, name: str) -> bool:
        scope = self._scope
        if scope.parent is not None or scope.is_function:  # a subgraph's or body's own output
            return False
        return name in scope.output_names()

    def elem_type(self, name: str) -> int | None:
        tensor = self._types.tensor_type(self._scope.namespace, name) if name else None
        if tensor is not None and tensor.elem_type:
            return tensor.elem_type
        source = self._scope.constant_source(name) if name else None
        if isinstance(source, onnx.TensorProto):
            return source.data_type
        const = self.constant(name)
        if const is not None:
            return onnx.helper.np_dtype_to_tensor_dtype(const.dtype)
        return None


_QUANTIZED = {onnx.TensorProto.UINT8: (np.uint8, 0, 255),
              onnx.TensorProto.INT8: (np.int8, -128, 127)}


def _quantized_constant(node: onnx.NodeProto, lookup: Any) -> onnx.TensorProto | None:
    """``QuantizeLinear(x, scale[, zero_point])`` of in-memory float32 constants, per tensor
    or per axis (no blocks, no ``output_dtype`` other than the zero point's), as a tensor;
    None for any other form or above 2**20 elements."""
    def value(name: str) -> np.ndarray | None:
        source = lookup(name) if name else None
        if isinstance(source, onnx.TensorProto):
            if source.data_location == onnx.TensorProto.EXTERNAL:
                return None
            return numpy_helper.to_array(source)
        return constant_node_value(source) if source is not None else None

    attributes = {a.name: a for a in node.attribute}
    if (attributes.get("block_size") and attributes["block_size"].i) or \
            "output_dtype" in attributes or (
                "saturate" in attributes and attributes["saturate"].i != 1):
        return None
    x, scale = value(node.input[0]), value(node.input[1]) if len(node.input) > 1 else None
    zero = value(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if len(node.input) > 2 and node.input[2] and zero is None:
        return None
    if x is None or scale is None or x.dtype != np.float32 or scale.dtype != np.float32 \
            or x.size > (1 << 20) or not np.all(np.isfinite(x)) \
            or not np.all(np.isfinite(scale)) or np.any(scale == 0):
        return None
    element = onnx.TensorProto.UINT8 if zero is None else \
        onnx.helper.np_dtype_to_tensor_dtype(zero.dtype)
    if element not in _QUANTIZED:
        return None
    dtype, low, high = _QUANTIZED[element]
    if scale.ndim == 1 and scale.size > 1:  # per axis
        axis = attributes["axis"].i if "axis" in attributes else 1
        if not -x.ndim <= axis < x.ndim or x.shape[axis] != scale.size:
            return None
        shape = [1] * x.ndim
        shape[axis] = scale.size
        scale = scale.reshape(shape)
        zero = zero.reshape(shape) if zero is not None else None
    elif scale.size != 1:
        return None
    offset = zero.astype(np.float32) if zero is not None else np.float32(0)
    with np.errstate(all="ignore"):
        levels = np.rint(x / scale) + offset
    quantized = np.clip(levels, low, high).astype(dtype)
    return numpy_helper.from_array(quantized, node.output[0])


def constant_node_value(node: onnx.NodeProto) -> np.ndarray | None:
    """The value of a ``Constant`` node, whichever attribute holds it."""
    for attr in node.attribute:
        if attr.name == "value":
            return numpy_helper.to_array(attr.t)
        if attr.name == "value_int":
            return np.array(attr.i, dtype=np.int64)
        if attr.name == "value_ints":
            return np.array(list(attr.ints), dtype=np.int64)
        if attr.name == "value_float":
            return np.array(attr.f, dtype=np.float32)
        if attr.name == "value_floats":
            return np.array(list(attr.floats), dtype=np.float32)
    return None
