"""Opset-aware construction of replacement subgraphs.

In: the model's default-domain opset, a name allocator, and the replaced node's name.
Out: a list of standard ONNX ``NodeProto`` s, appended in topological order as a pattern
calls the methods below.

Every op whose signature changed between opsets (Unsqueeze, Squeeze, Reduce*, Split,
Slice, Clip, Pad) is spelled here and only here, so patterns never branch on the opset for
spelling. Constants are emitted as ``Constant`` nodes, not initializers, because the same
subgraph must be valid inside If/Loop/Scan bodies and model-local functions, where
initializers are not allowed or not visible.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

MIN_OPSET = 11

def numpy_dtype(onnx_type: int) -> np.dtype:
    """numpy dtype for an ONNX element type."""
    return np.dtype(helper.tensor_dtype_to_np_dtype(onnx_type))


ConstantKey = tuple[str, tuple[int, ...], bytes]
ConstantPool = dict[ConstantKey, str]  # constant value -> name of the tensor holding it

_TENSOR_CACHE: dict[ConstantKey, onnx.TensorProto] = {}


def _tensor_for(key: ConstantKey, array: np.ndarray) -> onnx.TensorProto:
    """An unnamed TensorProto for a small constant, converted once per process."""
    tensor = _TENSOR_CACHE.get(key)
    if tensor is None:
        tensor = numpy_helper.from_array(array)
        if len(_TENSOR_CACHE) < 4096:
            _TENSOR_CACHE[key] = tensor
    return tensor


class NameAllocator:
    """Hands out names that collide with nothing already in the model, deterministically.

    ``fresh("a/b")`` returns ``"a/b"`` if free, else ``"a/b_1"``, ``"a/b_2"``, ...
    """

    def __init__(self, taken: Iterable[str] = ()) -> None:
        self._taken: set[str] = set(taken)
        self._next_suffix: dict[str, int] = {}

    def fresh(self, base: str) -> str:
        if base not in self._taken:
            self._taken.add(base)
            return base
        suffix = self._next_suffix.get(base, 1)
        while f"{base}_{suffix}" in self._taken:
            suffix += 1
        name = f"{base}_{suffix}"
        self._next_suffix[base] = suffix + 1
        self._taken.add(name)
        return name


class Builder:
    """Emits standard ONNX nodes for one replaced node.

    ``prefix`` (the replaced node's name) starts every new node and tensor name, so a
    reader of the output can tell where each node came from.
    """

    def __init__(
        self,
        opset: int,
        prefix: str,
        tensor_names: NameAllocator,
        node_names: NameAllocator,
        constant_pool: ConstantPool | None = None,
    ) -> None:
        if opset < MIN_OPSET:
            raise ValueError(f"opset {opset} is below the minimum {MIN_OPSET}")
        self.opset = opset
        self.prefix = prefix
        self.nodes: list[onnx.NodeProto] = []
        self._tensor_names = tensor_names
        self._node_names = node_names
        # Constants already emitted earlier in the same graph (same pass) are reused, so a
        # model with thousands of replaced nodes does not carry thousands of equal Constants.
        self._constants: ConstantPool = constant_pool if constant_pool is not None else {}

    # -- generic -------------------------------------------------------------------------

    def op(
        self,
        op_type: str,
        *inputs: str,
        hint: str | None = None,
        out: str | None = None,
        **attrs: Any,
    ) -> str:
        """Append one single-output node and return its output name.

        ``out`` writes into an existing name (the replaced node's output); otherwise a new
        name is derived from ``prefix`` and ``hint``.
        """
        return self.op_multi(op_type, list(inputs), 1, hint=hint, outs=[out] if out else None,
                             **attrs)[0]

    def op_multi(
        self,
        op_type: str,
        inputs: Sequence[str],
        num_outputs: int,
        *,
        hint: str | None = None,
        outs: Sequence[str] | None = None,
        **attrs: Any,
    ) -> list[str]:
        """Append one node with ``num_outputs`` outputs and return their names."""
        base = f"{self.prefix}/{hint or op_type}"
        node_name = self._node_names.fresh(base)
        if outs is None:
            outs = [self._tensor_names.fresh(f"{base}_out{i}" if num_outputs > 1 else base)
                    for i in range(num_outputs)]
        # Built field by field: helper.make_node costs several times more, and decomposing
        # thousands of nodes makes tens of thousands of these.
        node = onnx.NodeProto(op_type=op_type, name=node_name)
        node.input.extend(inputs)
        node.output.extend(outs)
        if attrs:
            node.attribute.extend(helper.make_attribute(key, value)
                                  for key, value in sorted(attrs.items()))
        self.nodes.append(node)
        return list(outs)

    def const(self, value: Any, dtype: Any = None, hint: str = "const") -> str:
        """A ``Constant`` node holding ``value``; equal constants are emitted once per graph
        (per pass), the first time one is needed, so every later use follows it."""
        array = np.asarray(value, dtype=dtype)
        key = (array.dtype.str, array.shape, array.tobytes())
        cached = self._constants.get(key)
        if cached is not None:
            return cached
        name = self._tensor_names.fresh(f"{self.prefix}/{hint}")
        node = onnx.NodeProto(op_type="Constant", name=self._node_names.fresh(name))
        node.output.append(name)
        value = node.attribute.add()
        value.name, value.type = "value", onnx.AttributeProto.TENSOR
        value.t.CopyFrom(_tensor_for(key, array))
        self.nodes.append(node)
        self._constants[key] = name
        return name

    def ints(self, values: Sequence[int] | int, hint: str = "ints") -> str:
        """An int64 constant: a 1-D tensor from a sequence, a scalar from an int."""
        return self.const(np.asarray(values, dtype=np.int64), hint=hint)

    # -- ops whose spelling depends on the opset --------------------------------------------

    def cast(self, x: str, to: int, hint: str = "cast", out: str | None = None) -> str:
        return self.op("Cast", x, to=to, hint=hint, out=out)

    def unsqueeze(self, x: str, axes: Sequence[int], hint: str = "unsqueeze") -> str:
        # Unsqueeze-13 moved `axes` from an attribute to an input.
        if self.opset >= 13:
            return self.op("Unsqueeze", x, self.ints(list(axes), "axes"), hint=hint)
        return self.op("Unsqueeze", x, axes=list(axes), hint=hint)

    def squeeze(self, x: str, axes: Sequence[int], hint: str = "squeeze") -> str:
        # Squeeze-13 moved `axes` from an attribute to an input.
        if self.opset >= 13:
            return self.op("Squeeze", x, self.ints(list(axes), "axes"), hint=hint)
        return self.op("Squeeze", x, axes=list(axes), hint=hint)

    def reduce(
        self, op_type: str, x: str, axes: Sequence[int], keepdims: bool = True,
        hint: str | None = None,
    ) -> str:
        """ReduceSum/ReduceMax/...: ReduceSum took `axes` as an input at 13, the rest at 18."""
        axes_as_input = self.opset >= (13 if op_type == "ReduceSum" else 18)
        if axes_as_input:
            return self.op(op_type, x, self.ints(list(axes), "axes"), keepdims=int(keepdims),
                           hint=hint or op_type)
        return self.op(op_type, x, axes=list(axes), keepdims=int(keepdims),
                       hint=hint or op_type)

    def slice(
        self,
        x: str,
        starts: Sequence[int],
        ends: Sequence[int],
        axes: Sequence[int],
        steps: Sequence[int] | None = None,
        hint: str = "slice",
        out: str | None = None,
    ) -> str:
        # From opset 10 on, Slice takes starts/ends/axes/steps as inputs.
        inputs = [x, self.ints(list(starts), "starts"), self.ints(list(ends), "ends"),
                  self.ints(list(axes), "slice_axes")]
        if steps is not None:
            inputs.append(self.ints(list(steps), "steps"))
        return self.op("Slice", *inputs, hint=hint, out=out)

    def split(self, x: str, sizes: Sequence[int], axis: int, hint: str = "split") -> list[str]:
        # Split-13 moved `split` from an attribute to an input.
        if self.opset >= 13:
            return self.op_multi("Split", [x, self.ints(list(sizes), "split")], len(sizes),
                                 axis=axis, hint=hint)
        return self.op_multi("Split", [x], len(sizes), axis=axis, split=list(sizes), hint=hint)

    def pad(self, x: str, pads: Sequence[int], value: Any, dtype: Any,
            hint: str = "pad") -> str:
        """Constant padding; ``pads`` is [x1_begin, x2_begin, ..., x1_end, x2_end, ...].

        Pad-11 takes pads and the value as inputs (the builder's minimum opset is 11).
        """
        return self.op("Pad", x, self.ints(list(pads), "pads"),
                       self.const(value, dtype, hint="pad_value"), mode="constant", hint=hint)

    def identity(self, x: str, out: str, hint: str = "identity") -> str:
        return self.op("Identity", x, hint=hint, out=out)
