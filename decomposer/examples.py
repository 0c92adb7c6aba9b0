"""Examples: small valid uses of a pattern, declared next to its spellings.

In: a pattern's ``examples`` (:class:`Example`). Out: :func:`example_models`, one small
model per spelling an example can write (each native domain it lists, torch's
``org.pytorch.aten::<op>`` and ``ATen(operator=<op>)`` fallbacks), labelled by form. The
fuzz harness seeds its mutants from them (``scripts/fuzz.py``) and a test checks that
every spelling of every built-in pattern is held by one and decomposes cleanly, so a new
pattern declares its examples in its own module and nothing else changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

ATEN_DOMAIN = "org.pytorch.aten"
# Element types, for writing examples briefly.
F, D, I32, I64, B = (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT32,
                     TensorProto.INT64, TensorProto.BOOL)
TRUE, FALSE = np.array(True), np.array(False)


def i64(value: Any) -> np.ndarray:
    return np.array(value, np.int64)


def f64(value: Any) -> np.ndarray:
    return np.array(value, np.float64)


@dataclass(frozen=True)
class Example:
    """One small valid use of a pattern.

    - ``inputs``: typed graph inputs (name, element type, dims; a str dim is symbolic), all
      fed to the native node unless ``args`` says otherwise;
    - ``outputs``: (element type, rank) of each node output; None for one output typed like
      the first input;
    - ``attrs``: the native node's attributes;
    - ``domains``: the (domain, default-domain opset) pairs the native node is written in
      (empty: no native example);
    - ``op_type``: the native node's op type (None: the pattern's first native one);
    - ``args``: the native node's inputs, when some are constants: a graph input's name,
      "" for an absent input, or a numpy value (written as a Constant node);
    - ``aten``: the argument list of torch's ``org.pytorch.aten::<op>`` and
      ``ATen(operator=<op>)`` forms as its exporter writes it, like ``args`` (None: no
      ATen example); ``aten_opset``: the default-domain opset of those models.
    """

    inputs: tuple[tuple[str, int, tuple[int | str, ...]], ...]
    outputs: tuple[tuple[int, int], ...] | None = None
    attrs: dict[str, Any] = field(default_factory=dict)
    domains: tuple[tuple[str, int], ...] = (("custom.ops", 17),)
    op_type: str | None = None
    args: tuple[Any, ...] | None = None
    aten: tuple[Any, ...] | None = None
    aten_opset: int = 13


def example_models(pattern: Any, example: Example) -> list[tuple[str, onnx.ModelProto]]:
    """(form label, model) for every spelling of ``pattern`` that ``example`` can write."""
    outs = [f"y{i}" for i in range(len(example.outputs or [None]))]
    found = []
    spellings = pattern.spellings()
    native = [form for form in spellings if form.op_types]
    if native:
        op_type = example.op_type or native[0].op_types[0]
        names = [name for name, _, _ in example.inputs]
        constants: list[onnx.NodeProto] = []
        if example.args is not None:
            constants, names = _argument_nodes(example.args)
        for domain, opset in example.domains:
            node = helper.make_node(op_type, names, outs, name="op", domain=domain,
                                    **example.attrs)
            found.append((f"{domain or '<default>'}::{op_type}@{opset}",
                          _model([*constants, node], example, opset, domain)))
    aten_form = next((form for form in spellings if form.aten), None)
    if aten_form is not None and example.aten is not None:
        nodes, names = _argument_nodes(example.aten)
        op = aten_form.aten
        for label, node in [
                (f"{ATEN_DOMAIN}::{op}",
                 helper.make_node(op, names, outs, name="op", domain=ATEN_DOMAIN)),
                (f"ATen(operator={op})", helper.make_node(
                    "ATen", names, outs, name="op", domain=ATEN_DOMAIN, operator=op,
                    overload_name=""))]:
            found.append((f"{label}@{example.aten_opset}",
                          _model([*nodes, node], example, example.aten_opset, ATEN_DOMAIN)))
    return found


def _model(nodes: list[onnx.NodeProto], example: Example, opset: int, domain: str
           ) -> onnx.ModelProto:
    _, elem, dims = example.inputs[0]
    outputs = example.outputs or ((elem, len(dims)),)
    graph = helper.make_graph(
        nodes, "example",
        [helper.make_tensor_value_info(n, e, list(d)) for n, e, d in example.inputs],
        [helper.make_tensor_value_info(f"y{i}", e, [None] * rank)
         for i, (e, rank) in enumerate(outputs)])
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)]
                                                  if domain else [])
    return helper.make_model(graph, opset_imports=imports, ir_version=8)


def _argument_nodes(args: tuple[Any, ...]) -> tuple[list[onnx.NodeProto], list[str]]:
    """(Constant nodes, input names) for an argument list: a graph input's name, "" for an
    absent argument, or a numpy value written as a Constant node."""
    nodes, names = [], []
    for index, arg in enumerate(args):
        if isinstance(arg, str):
            names.append(arg)
            continue
        names.append(f"arg{index}")
        nodes.append(helper.make_node("Constant", [], [names[-1]], name=f"const{index}",
                                      value=onnx.numpy_helper.from_array(arg, "v")))
    return nodes, names
