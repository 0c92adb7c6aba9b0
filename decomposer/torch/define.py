"""From a pure-torch function to an ONNX function that defines a custom op.

In: a Python function of torch tensors (a custom op's reference: mmcv's
``multi_scale_deform_attn_pytorch``, an ``autograd.Function``'s ``forward`` body), example
tensors, the dims that are dynamic, the op's domain and name, and its attributes with their
defaults. Out: :func:`define` gives an ``onnx.FunctionProto`` of the op, exported with
torch's dynamo exporter; :func:`write_library` writes definitions into a ``.onnx`` file
that ``--patterns FILE.onnx`` reads (:mod:`decomposer.functions`).

Attributes: each name in ``attributes`` is a parameter of the function that the op takes
as an ONNX attribute. During the export it reaches the function as a tensor holding its
default (a float: a float32 scalar; an int: an int64 scalar; a list of ints or floats: a
1-D tensor), and in the definition it becomes ``Constant(value_float=@name)`` (``value_int``,
``value_ints``, ``value_floats``), so a node's own value flows where the example's did. A
function that turns an attribute into a Python number (``int(k)``, ``range(k)``) or reads
a tensor's values into its shapes (``.tolist()``, ``.item()``) has data-dependent shapes:
the export fails and :class:`decomposer.ExportError` carries the exporter's reason. String
attributes cannot be traced (write one definition per value).

``verify`` (default on) runs the definition, inlined, on ONNX Runtime against the function
in eager mode on the example inputs, with the shared tolerances of
:mod:`decomposer.tolerances`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnx import helper

from decomposer.errors import ExportError, InvalidModelError, VerificationError
from decomposer.functions import is_custom_function
from decomposer.tolerances import DEFAULT_ATOL, DEFAULT_RTOL

__all__ = ["define", "write_library"]

# attribute default type -> (Constant attribute, ONNX attribute type, tensor maker)
_KINDS: dict[str, tuple[str, int, Callable[[Any], Any]]] = {
    "float": ("value_float", onnx.AttributeProto.FLOAT,
              lambda v: torch.tensor(float(v), dtype=torch.float32)),
    "int": ("value_int", onnx.AttributeProto.INT,
            lambda v: torch.tensor(int(v), dtype=torch.int64)),
    "floats": ("value_floats", onnx.AttributeProto.FLOATS,
               lambda v: torch.tensor([float(x) for x in v], dtype=torch.float32)),
    "ints": ("value_ints", onnx.AttributeProto.INTS,
             lambda v: torch.tensor([int(x) for x in v], dtype=torch.int64)),
}
EXPORT_OPSET = 18  # what the dynamo exporter writes; a model's own opset is reached by
# decomposer.functions when it inlines the definition


def _kind(name: str, value: Any) -> str:
    if isinstance(value, int):  # a bool too: an int attribute of 0 or 1
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, (list, tuple)) and value:
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return "ints"
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            return "floats"
    raise InvalidModelError(
        f"define(): attribute {name!r}={value!r}: give a default that is a float, an int, or "
        f"a non-empty list of them (string attributes cannot be traced: write one "
        f"definition per value)")


class _Call(torch.nn.Module):
    """``fn`` as a module: tensors positionally, then the attributes as tensors."""

    def __init__(self, fn: Callable[..., Any], names: Sequence[str]) -> None:
        super().__init__()
        self.fn = fn
        self.names = list(names)

    def forward(self, *values: Any) -> Any:
        count = len(values) - len(self.names)
        return self.fn(*values[:count], **dict(zip(self.names, values[count:], strict=True)))


def define(fn: Callable[..., Any], example_args: Sequence[Any], *, domain: str,
           name: str | None = None, attributes: Mapping[str, Any] | None = None,
           dynamic_shapes: Any = None, verify: bool = True, doc: str | None = None
           ) -> onnx.FunctionProto:
    """The ONNX function ``domain::name`` computing ``fn`` (see the module docstring).

    ``example_args`` are the tensor arguments, in order; ``attributes`` maps parameter
    names of ``fn`` to their defaults; ``dynamic_shapes`` is what ``torch.export`` takes for
    the tensor arguments (a tuple in their order, or a dict by parameter name), each dim
    declared dynamic must stay symbolic. ``name`` defaults to ``fn.__name__``. Raises
    :class:`ExportError` when torch cannot export it (data-dependent shapes, say) or froze a
    dynamic dim, :class:`VerificationError` when ``verify`` finds other numbers.
    """
    if not domain or domain in ("ai.onnx", "ai.onnx.ml"):
        raise InvalidModelError(f"define(): domain {domain!r}: give the custom op's own "
                                f"domain (for example 'mylab')")
    op_name = str(name or getattr(fn, "__name__", ""))
    if not op_name.isidentifier():
        raise InvalidModelError(f"define(): name {op_name!r} is not an op name; pass name=")
    tensors = list(example_args)
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        raise InvalidModelError("define(): example_args must be tensors (non-tensor arguments "
                                "are attributes: pass them in attributes=)")
    attrs = dict(attributes or {})
    kinds = {key: _kind(key, value) for key, value in attrs.items()}
    attribute_tensors = [_KINDS[kinds[key]][2](value) for key, value in attrs.items()]
    module = _Call(fn, list(attrs)).eval()
    shapes = _positional_shapes(fn, dynamic_shapes, len(tensors), len(attrs))
    from decomposer.torch.exporting import _torch_error

    try:
        # Captured here, not by torch.onnx.export: its fallback strategies (a draft export)
        # would specialize a branch on tensor values instead of refusing it.
        captured = torch.export.export(module, tuple(tensors + attribute_tensors),
                                       dynamic_shapes=shapes, strict=False)
    except Exception as exc:
        reason = str(_torch_error(exc)).replace("torch.onnx.export", "torch.export.export", 1)
        raise ExportError(f"define({op_name}): {reason}") from exc
    try:
        program = torch.onnx.export(captured, dynamo=True, opset_version=EXPORT_OPSET,
                                    external_data=False, verbose=False)
    except Exception as exc:
        raise ExportError(f"define({op_name}): {_torch_error(exc)}") from exc
    from onnx import inliner

    if program is None:
        raise ExportError(f"define({op_name}): torch.onnx.export returned no program")
    model = inliner.inline_local_functions(program.model_proto)
    _require_dynamic(model, shapes, len(tensors), op_name)
    function = _as_function(model, len(tensors), attrs, kinds, domain, op_name)
    if doc:
        function.doc_string = doc
    if verify:
        _verify(function, fn, tensors, attrs)
    return function


def write_library(functions: Sequence[onnx.FunctionProto], path: str | Path) -> Path:
    """Write ``functions`` into an ONNX file with an empty graph (``--patterns FILE.onnx``)."""
    for function in functions:
        if not is_custom_function(function):
            raise InvalidModelError(f"write_library(): {function.domain}::{function.name} "
                                    f"is not of a custom domain")
    imports: dict[str, int] = {}
    for function in functions:
        imports.setdefault(function.domain, 1)
        for entry in function.opset_import:
            imports[entry.domain] = max(imports.get(entry.domain, 0), entry.version)
    holder = helper.make_model(
        helper.make_graph([], "function_library", [], []),
        opset_imports=[helper.make_opsetid(d, v) for d, v in sorted(imports.items())],
        functions=list(functions), producer_name="decomposer.torch.define")
    destination = Path(path)
    onnx.checker.check_model(holder)
    onnx.save(holder, destination)
    return destination


def _positional_shapes(fn: Callable[..., Any], dynamic_shapes: Any, n_tensors: int,
                       n_attrs: int) -> Any:
    if dynamic_shapes is None:
        return None
    if isinstance(dynamic_shapes, Mapping):
        params = [p for p in inspect.signature(fn).parameters][:n_tensors]
        unknown = sorted(set(dynamic_shapes) - set(params))
        if unknown:
            raise InvalidModelError(f"define(): dynamic_shapes names {unknown}, which are not "
                                    f"tensor parameters of the function ({params})")
        ordered = [dynamic_shapes.get(p) for p in params]
    else:
        ordered = list(dynamic_shapes)
        if len(ordered) != n_tensors:
            raise InvalidModelError(f"define(): dynamic_shapes has {len(ordered)} entries "
                                    f"for {n_tensors} tensor arguments")
    return (tuple(ordered) + (None,) * n_attrs,)


def _require_dynamic(model: onnx.ModelProto, shapes: Any, n_tensors: int, op_name: str) -> None:
    if shapes is None:
        return
    for index, spec in enumerate(shapes[0][:n_tensors]):
        dims = spec if isinstance(spec, Mapping) else dict(enumerate(spec or ()))
        value = model.graph.input[index]
        for dim in (d for d, s in dims.items() if s is not None):
            actual = value.type.tensor_type.shape.dim[dim]
            if not actual.dim_param:
                raise ExportError(f"define({op_name}): dim {dim} of input '{value.name}' was "
                                  f"declared dynamic and torch exported it as "
                                  f"{actual.dim_value}")


def _as_function(model: onnx.ModelProto, n_tensors: int, attrs: Mapping[str, Any],
                 kinds: Mapping[str, str], domain: str, op_name: str) -> onnx.FunctionProto:
    graph = model.graph
    inputs = [value.name for value in graph.input]
    if len(inputs) != n_tensors + len(attrs):
        raise ExportError(f"define({op_name}): the export has {len(inputs)} inputs for "
                          f"{n_tensors} tensors and {len(attrs)} attributes (an unused "
                          f"argument is dropped by torch: remove it)")
    nodes = [helper.make_node("Constant", [], [init.name], value=init)
             for init in graph.initializer]
    for input_name, key in zip(inputs[n_tensors:], attrs, strict=True):
        field, kind, _ = _KINDS[kinds[key]]
        constant = helper.make_node("Constant", [], [input_name])
        reference = constant.attribute.add()
        reference.name, reference.ref_attr_name, reference.type = field, key, kind
        nodes.append(constant)
    nodes.extend(graph.node)
    function = helper.make_function(domain, op_name, inputs[:n_tensors],
                                    [value.name for value in graph.output], nodes,
                                    list(model.opset_import))
    function.attribute_proto.extend(helper.make_attribute(key, list(value)
                                                          if isinstance(value, tuple)
                                                          else value)
                                    for key, value in attrs.items())
    return function


def _verify(function: onnx.FunctionProto, fn: Callable[..., Any], tensors: Sequence[Any],
            attrs: Mapping[str, Any]) -> None:
    import onnxruntime as ort

    import decomposer
    from decomposer.testing import compare

    names = [f"x{i}" for i in range(len(tensors))]
    outs = [f"y{i}" for i in range(len(function.output))]
    graph = helper.make_graph(
        [helper.make_node(function.name, names, outs, domain=function.domain)], "check",
        [helper.make_tensor_value_info(n, _onnx_type(t), list(t.shape))
         for n, t in zip(names, tensors, strict=True)],
        [onnx.ValueInfoProto(name=n) for n in outs])
    caller = helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", EXPORT_OPSET), helper.make_opsetid(function.domain, 1)],
        functions=[function])
    inlined = decomposer.decompose(caller, check=False)
    session = ort.InferenceSession(inlined.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    got = session.run(None, {n: t.detach().numpy() for n, t in zip(names, tensors,
                                                                      strict=True)})
    with torch.no_grad():
        want = fn(*tensors, **{k: (list(v) if isinstance(v, tuple) else v)
                               for k, v in attrs.items()})
    wanted = [want] if isinstance(want, torch.Tensor) else list(want)
    for index, (g, w) in enumerate(zip(got, wanted, strict=True)):
        try:
            compare(np.asarray(g), w.detach().numpy(), f"output {index}",
                    atol=DEFAULT_ATOL, rtol=DEFAULT_RTOL)
        except AssertionError as exc:
            raise VerificationError(f"define({function.name}): output {index} of the "
                                    f"definition differs from the function in eager mode: "
                                    f"{str(exc).splitlines()[0]}") from exc


def _onnx_type(tensor: Any) -> int:
    from decomposer.torch.probe import onnx_type

    found = onnx_type(tensor.dtype)
    if found is None:
        raise InvalidModelError(f"define(): example tensor of dtype {tensor.dtype} has no "
                                f"ONNX type")
    return found
