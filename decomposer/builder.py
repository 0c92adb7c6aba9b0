"""Opset-aware construction of replacement subgraphs, written like the math.

In: the model's default-domain opset, the output target (``"portable"``, ``"ort"`` or
``"qdq"``), name
allocators, and the replaced node's name.
Out: a list of standard ONNX ``NodeProto`` s (``Builder.nodes``), appended in topological
order as a pattern calls the methods below.

A pattern works with :class:`Value` s: a ``Value`` *is* a tensor name (a ``str``) that also
knows its numpy dtype when it can, and its arithmetic operators emit nodes::

    n = b.Gather(size_f, 2, axis=0)                 # Python ints where a tensor is expected
    coords = b.Range(1 - n, n, 2) / n               #   become constants; numbers take the
                                                    #   other operand's dtype
    b.Where(mask, coords, 0.0, out=node.outputs[0]) # `out` writes an existing name

Every op the built-in patterns use has a method named like the ONNX op, and every op whose
signature changed between opsets (Unsqueeze, Squeeze, Reduce*, Split, Shape's start/end,
Softmax's axis, LessOrEqual/GreaterOrEqual, ArgMax's select_last_index) is spelled here and
only here, so patterns never branch on the opset for spelling. ``b.op("OpType", ...)`` emits
any op without a method. Constants are ``Constant`` nodes, not initializers, because the same
subgraph must be valid inside If/Loop/Scan bodies and model-local functions, where
initializers are not allowed or not visible.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypeAlias

import numpy as np
import onnx
from onnx import helper, numpy_helper

MIN_OPSET = 11
TARGETS = ("portable", "ort", "qdq")
INT64_MAX = 2**63 - 1


def numpy_dtype(onnx_type: int) -> np.dtype:
    """numpy dtype for an ONNX element type."""
    return np.dtype(helper.tensor_dtype_to_np_dtype(onnx_type))


def onnx_type(dtype: Any) -> int:
    """ONNX element type for a numpy dtype (or an ONNX element type, returned as is)."""
    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
        return int(dtype)
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


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


_ATTRIBUTE_CACHE: dict[tuple[str, str], onnx.AttributeProto] = {}
_SCALARS = (int, float, str, bytes)


def _attribute(key: str, value: Any) -> onnx.AttributeProto:
    """``helper.make_attribute(key, value)``, cached for the plain values patterns repeat
    (keyed by ``repr``, which tells 1 from 1.0 and [1] from (1,))."""
    plain = isinstance(value, _SCALARS) or (
        isinstance(value, (list, tuple)) and all(isinstance(v, _SCALARS) for v in value))
    if not plain:
        return helper.make_attribute(key, value)
    cache_key = (key, repr(value))
    attribute = _ATTRIBUTE_CACHE.get(cache_key)
    if attribute is None:
        attribute = helper.make_attribute(key, value)
        if len(_ATTRIBUTE_CACHE) < 4096:
            _ATTRIBUTE_CACHE[cache_key] = attribute
    return attribute


class NameAllocator:
    """Hands out names that collide with nothing already in the model, deterministically.

    ``fresh("a/b")`` returns ``"a/b"`` if free, else ``"a/b_1"``, ``"a/b_2"``, ...
    """

    def __init__(self, taken: Iterable[str] = ()) -> None:
        self._taken: set[str] = set(taken)
        self._next_suffix: dict[str, int] = {}

    def free(self, names: Iterable[str]) -> bool:
        """Whether none of ``names`` is taken."""
        return self._taken.isdisjoint(names)

    def take(self, names: Iterable[str]) -> None:
        """Mark ``names`` taken (free ones, distinct: what :meth:`fresh` would have returned
        for their bases in order)."""
        self._taken.update(names)

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


class Value(str):
    """A tensor in the graph being built: its name, plus its numpy dtype when known.

    Being a ``str``, a Value goes wherever a tensor name goes. ``+ - * / **`` and unary ``-``
    emit Add/Sub/Mul/Div/Pow/Neg through the builder that made it; a Python number on either
    side becomes a constant of this Value's dtype. (String concatenation and repetition are
    therefore not available on Values: use ``str(value)`` for that.)
    """

    builder: Builder
    dtype: np.dtype | None

    def __new__(cls, name: str, builder: Builder, dtype: Any = None) -> Value:
        value = super().__new__(cls, name)
        value.builder = builder
        value.dtype = dtype if dtype is None or isinstance(dtype, np.dtype) else np.dtype(dtype)
        return value

    def __add__(self, other: Any) -> Value:
        return self.builder.Add(self, other)

    def __radd__(self, other: Any) -> Value:
        return self.builder.Add(other, self)

    def __sub__(self, other: Any) -> Value:
        return self.builder.Sub(self, other)

    def __rsub__(self, other: Any) -> Value:
        return self.builder.Sub(other, self)

    def __mul__(self, other: Any) -> Value:
        return self.builder.Mul(self, other)

    def __rmul__(self, other: Any) -> Value:
        return self.builder.Mul(other, self)

    def __truediv__(self, other: Any) -> Value:
        return self.builder.Div(self, other)

    def __rtruediv__(self, other: Any) -> Value:
        return self.builder.Div(other, self)

    def __pow__(self, other: Any) -> Value:
        return self.builder.Pow(self, other)

    def __neg__(self) -> Value:
        return self.builder.Neg(self)

    def __mod__(self, other: Any) -> Value:
        raise TypeError("use b.Mod(x, y, fmod=...) : '%' is ambiguous between ONNX's two "
                        "modulo semantics")

    # str's __hash__/__eq__ stay: a Value compares and hashes as its name.
    __hash__ = str.__hash__


# Anything a method accepts where a tensor is expected: a Value or tensor name, or a number
# / array / list that becomes a constant.
Operand: TypeAlias = "Value | str | int | float | bool | np.ndarray | np.generic | Sequence[Any]"
IntsOrValue: TypeAlias = "Value | str | int | Sequence[int] | np.ndarray"


class Builder:
    """Emits standard ONNX nodes for one replaced node.

    ``prefix`` (the replaced node's name) starts every new node and tensor name, so a reader
    of the output can tell where each node came from. ``target`` is ``"portable"`` (every
    engine), ``"ort"`` (ONNX Runtime-tuned forms allowed, see docs/portability.md) or
    ``"qdq"`` (portable, except that quantized weights stay quantized behind a
    ``DequantizeLinear``, for engines with low-bit kernels).
    Constants are shared with earlier replacements in the same graph through
    ``constant_pool``, but only those of a replacement that succeeded: the engine calls
    :meth:`commit` when it keeps the nodes.
    """

    def __init__(
        self,
        opset: int,
        prefix: str,
        tensor_names: NameAllocator,
        node_names: NameAllocator,
        constant_pool: ConstantPool | None = None,
        target: str = "portable",
    ) -> None:
        if opset < MIN_OPSET:
            raise ValueError(f"opset {opset} is below the minimum {MIN_OPSET}")
        if target not in TARGETS:
            raise ValueError(f"target {target!r} is not one of {list(TARGETS)}")
        self.opset = opset
        self.target = target
        self.prefix = prefix
        self.nodes: list[onnx.NodeProto] = []
        # Per node in ``nodes``: the bases its name and new output names were made from
        # (None for a constant, None for an output name given by the caller), so that
        # decomposer.memo can replay the same naming for an identical node.
        self.bases: list[tuple[str, list[str | None]] | None] = []
        self._empty_constants: set[str] = set()  # names of size-0 constants (Concat skips)
        self.initializers: list[onnx.TensorProto] = []  # weights (see weight())
        self._tensor_names = tensor_names
        self._node_names = node_names
        # Constants emitted earlier in the same graph (same pass) are reused, so a model with
        # thousands of replaced nodes does not carry thousands of equal Constants. This
        # builder's own constants join the pool only on commit(): if the pattern rejects the
        # node halfway, its Constant nodes are dropped and nothing may refer to them.
        self._shared: ConstantPool = constant_pool if constant_pool is not None else {}
        self._own: ConstantPool = {}

    def pool_constants(self, names: set[str]) -> list[onnx.NodeProto]:
        """Constant nodes for the pooled constants (made by earlier replacements) among
        ``names``, for checking this replacement on its own."""
        found = []
        for key, name in self._shared.items():
            if name in names:
                node = onnx.NodeProto(op_type="Constant", output=[name])
                attr = node.attribute.add()
                attr.name, attr.type = "value", onnx.AttributeProto.TENSOR
                attr.t.CopyFrom(_tensor_for(key, np.frombuffer(
                    key[2], dtype=np.dtype(key[0])).reshape(key[1])))
                found.append(node)
        return found

    def commit(self) -> None:
        """Publish this replacement's constants to the shared pool (its nodes are kept),
        first dropping those no node of it reads (a Concat that left an empty one out)."""
        read = {name for node in self.nodes for name in node.input}
        unread = {name for name in self._own.values() if name not in read}
        if unread:
            kept = [(node, base) for node, base in zip(self.nodes, self.bases, strict=True)
                    if not (base is None and node.output[0] in unread)]
            self.nodes = [node for node, _ in kept]
            self.bases = [base for _, base in kept]
            self._own = {key: name for key, name in self._own.items() if name not in unread}
        self._shared.update(self._own)
        self._own = {}

    # -- values ---------------------------------------------------------------------------

    def input(self, name: str, dtype: Any = None) -> Value:
        """Wrap an existing tensor name (e.g. ``node.inputs[0]``) as a Value; ``dtype`` is a
        numpy dtype or an ONNX element type, or None if unknown."""
        if dtype is not None and not isinstance(dtype, np.dtype):
            dtype = numpy_dtype(int(dtype)) if isinstance(dtype, (int, np.integer)) else dtype
        return Value(name, self, dtype)

    def const(self, value: Any, dtype: Any = None, hint: str = "const") -> Value:
        """A ``Constant`` node holding ``value``; equal constants are emitted once per graph
        (per pass), the first time one is needed, so every later use follows it."""
        if dtype is not None and isinstance(dtype, (int, np.integer)) \
                and not isinstance(dtype, bool):
            dtype = numpy_dtype(int(dtype))
        array = np.asarray(value, dtype=dtype)
        key = (array.dtype.str, array.shape, array.tobytes())
        cached = self._shared.get(key) or self._own.get(key)
        if cached is not None:
            if array.size == 0:
                self._empty_constants.add(cached)
            return Value(cached, self, array.dtype)
        name = self._tensor_names.fresh(f"{self.prefix}/{hint}")
        node = onnx.NodeProto(op_type="Constant", name=self._node_names.fresh(name))
        node.output.append(name)
        attr = node.attribute.add()
        attr.name, attr.type = "value", onnx.AttributeProto.TENSOR
        attr.t.CopyFrom(_tensor_for(key, array))
        self.nodes.append(node)
        self.bases.append(None)
        self._own[key] = name
        if array.size == 0:
            self._empty_constants.add(name)
        return Value(name, self, array.dtype)

    def weight(self, tensor: onnx.TensorProto, hint: str = "weight") -> Value:
        """An initializer holding ``tensor`` as given (e.g. packed int4), for weights: unlike
        :meth:`const` it is neither pooled nor cached, so a large tensor is held once, and
        it goes where engines and writers expect weights (a function body, which cannot
        hold initializers, gets a ``Constant`` node instead: the engine moves it)."""
        named = onnx.TensorProto()
        named.CopyFrom(tensor)
        named.name = self._tensor_names.fresh(f"{self.prefix}/{hint}")
        self.initializers.append(named)
        return Value(named.name, self, None)

    def ints(self, values: Sequence[int] | int, hint: str = "ints") -> Value:
        """An int64 constant: a 1-D tensor from a sequence, a scalar from an int."""
        return self.const(np.asarray(values, dtype=np.int64), hint=hint)

    def _operand(self, x: Operand, like: np.dtype | None, hint: str) -> Value:
        """``x`` as a Value: names pass through, numbers and arrays become constants (numpy
        arrays keep their dtype; Python numbers take ``like``, the other operand's)."""
        if isinstance(x, Value):
            return x
        if isinstance(x, str):
            return Value(x, self, None)
        if isinstance(x, (np.ndarray, np.generic)):
            return self.const(x, hint=hint)
        if like is None:
            raise TypeError(f"cannot tell the dtype of constant {x!r}: give the other operand "
                            f"a dtype (b.input(name, dtype)) or pass a numpy value")
        return self.const(np.asarray(x, dtype=like), hint=hint)

    def _index(self, x: IntsOrValue, hint: str) -> Value:
        """An index/shape operand: Python ints and int lists become int64 constants."""
        if isinstance(x, str):
            return x if isinstance(x, Value) else Value(x, self, None)
        return self.ints(np.asarray(x, dtype=np.int64).tolist(), hint=hint)

    @staticmethod
    def _dtype_of(*xs: Any) -> np.dtype | None:
        for x in xs:
            if isinstance(x, Value) and x.dtype is not None:
                return x.dtype
            if isinstance(x, (np.ndarray, np.generic)):
                return x.dtype
        return None

    # -- generic --------------------------------------------------------------------------

    def op(self, op_type: str, *inputs: str, hint: str | None = None, out: str | None = None,
           dtype: Any = None, **attrs: Any) -> Value:
        """Append one single-output node of any standard op and return its output.

        ``out`` writes into an existing name (the replaced node's output); otherwise a new
        name is derived from ``prefix`` and ``hint``. ``dtype`` is the output's numpy dtype,
        if the caller knows it. An empty string input means "absent optional input".
        """
        return self.op_multi(op_type, list(inputs), 1, hint=hint,
                             outs=[out] if out else None, dtypes=[dtype], **attrs)[0]

    def op_multi(
        self,
        op_type: str,
        inputs: Sequence[str],
        num_outputs: int,
        *,
        hint: str | None = None,
        outs: Sequence[str] | None = None,
        dtypes: Sequence[Any] | None = None,
        **attrs: Any,
    ) -> list[Value]:
        """Append one node with ``num_outputs`` outputs and return them."""
        base = f"{self.prefix}/{hint or op_type}"
        node_name = self._node_names.fresh(base)
        out_bases: list[str | None] = [None] * num_outputs
        if outs is None:
            out_bases = [f"{base}_out{i}" if num_outputs > 1 else base
                         for i in range(num_outputs)]
            outs = [self._tensor_names.fresh(name) for name in out_bases if name]
        self.bases.append((base, out_bases))
        # Built in one constructor call with cached attributes: helper.make_node costs
        # several times more, and decomposing thousands of nodes makes tens of thousands.
        node = onnx.NodeProto(op_type=op_type, name=node_name, input=[str(i) for i in inputs],
                              output=[str(o) for o in outs],
                              attribute=[_attribute(key, attrs[key]) for key in sorted(attrs)])
        self.nodes.append(node)
        types = list(dtypes or []) + [None] * num_outputs
        return [Value(o, self, types[i]) for i, o in enumerate(outs)]

    def __getattr__(self, name: str) -> Any:
        # only reached for a name the class lacks: most often an op with no method here
        if name[:1].isupper():
            raise AttributeError(
                f"Builder has no method {name!r}: emit any standard op with "
                f"b.op({name!r}, *inputs, **attributes) (b.op_multi(...) for several "
                f"outputs); the methods are listed in docs/writing-a-pattern.md")
        raise AttributeError(f"'Builder' object has no attribute {name!r}")

    def fresh_name(self, hint: str) -> str:
        """A new tensor name ``<prefix>/<hint>`` that collides with nothing in the model
        (for names a copied subgraph defines)."""
        return self._tensor_names.fresh(f"{self.prefix}/{hint}")

    def fresh_node_name(self, hint: str) -> str:
        """A new node name ``<prefix>/<hint>`` (for nodes of a copied subgraph)."""
        return self._node_names.fresh(f"{self.prefix}/{hint}")

    def copy_node(self, proto: onnx.NodeProto, inputs: Sequence[str],
                  outs: Sequence[str | None], hint: str | None = None) -> list[str]:
        """Append a copy of ``proto`` (op, domain, attributes, doc string as they are) reading
        ``inputs``; each ``outs`` entry is an existing name to write, ``""`` for an absent
        output, or None for a new name made from the prefix and ``proto``'s own output name.
        Returns the output names. For emitting a body written elsewhere (an ONNX function)."""
        base = f"{self.prefix}/{hint or proto.name or proto.op_type}"
        out_bases: list[str | None] = []
        names: list[str] = []
        for given, original in zip(outs, proto.output, strict=True):
            if given is None:
                out_bases.append(f"{self.prefix}/{original}")
                names.append(self._tensor_names.fresh(f"{self.prefix}/{original}"))
            else:
                out_bases.append(None)
                names.append(given)
        node = onnx.NodeProto()
        node.CopyFrom(proto)
        node.name = self._node_names.fresh(base)
        del node.input[:]
        node.input.extend(inputs)
        del node.output[:]
        node.output.extend(names)
        self.nodes.append(node)
        self.bases.append((base, out_bases))
        return names

    def _binary(self, op_type: str, a: Operand, c: Operand, hint: str | None,
                out: str | None, result: Any = "same") -> Value:
        like = self._dtype_of(a, c)
        left = self._operand(a, like, f"{hint or op_type}_a")
        right = self._operand(c, like, f"{hint or op_type}_b")
        dtype = (left.dtype or right.dtype) if result == "same" else result
        return self.op(op_type, left, right, hint=hint, out=out, dtype=dtype)

    def _unary(self, op_type: str, x: Operand, hint: str | None, out: str | None,
               result: Any = "same", **attrs: Any) -> Value:
        value = self._operand(x, None, f"{hint or op_type}_in")
        dtype = value.dtype if result == "same" else result
        return self.op(op_type, value, hint=hint, out=out, dtype=dtype, **attrs)

    # -- elementwise arithmetic -------------------------------------------------------------

    def Add(self, a: Operand, c: Operand, *, hint: str | None = None,
            out: str | None = None) -> Value:
        return self._binary("Add", a, c, hint, out)

    def Sub(self, a: Operand, c: Operand, *, hint: str | None = None,
            out: str | None = None) -> Value:
        return self._binary("Sub", a, c, hint, out)

    def Mul(self, a: Operand, c: Operand, *, hint: str | None = None,
            out: str | None = None) -> Value:
        return self._binary("Mul", a, c, hint, out)

    def Div(self, a: Operand, c: Operand, *, hint: str | None = None,
            out: str | None = None) -> Value:
        """Integer Div truncates toward zero (C semantics), unlike Python's ``//``."""
        return self._binary("Div", a, c, hint, out)

    def Pow(self, a: Operand, c: Operand, *, hint: str | None = None,
            out: str | None = None) -> Value:
        return self._binary("Pow", a, c, hint, out)

    def Mod(self, a: Operand, c: Operand, *, fmod: bool = False, hint: str | None = None,
            out: str | None = None) -> Value:
        """``fmod=False``: the sign of the divisor (Python's ``%``, integers only);
        ``fmod=True``: the sign of the dividend (C's fmod; required for floats)."""
        like = self._dtype_of(a, c)
        left = self._operand(a, like, "mod_a")
        right = self._operand(c, like, "mod_b")
        return self.op("Mod", left, right, fmod=int(fmod), hint=hint, out=out,
                       dtype=left.dtype or right.dtype)

    def Max(self, *xs: Operand, hint: str | None = None, out: str | None = None) -> Value:
        """Elementwise maximum. ONNX's Max takes integers only from opset 12: below that,
        integer operands are spelled Where(Greater(a, c), a, c), pairwise."""
        return self._extremum("Max", xs, hint, out)

    def Min(self, *xs: Operand, hint: str | None = None, out: str | None = None) -> Value:
        """Elementwise minimum. ONNX's Min takes integers only from opset 12: below that,
        integer operands are spelled Where(Less(a, c), a, c), pairwise."""
        return self._extremum("Min", xs, hint, out)

    def _extremum(self, op_type: str, xs: tuple[Operand, ...], hint: str | None,
                  out: str | None) -> Value:
        like = self._dtype_of(*xs)
        values = [self._operand(x, like, f"{op_type.lower()}_in") for x in xs]
        if self.opset >= 12 or like is None or like.kind not in "iu" or len(values) < 2:
            return self.op(op_type, *values, hint=hint, out=out, dtype=like)
        pick_first = self.Greater if op_type == "Max" else self.Less
        result = values[0]
        for position, value in enumerate(values[1:], start=2):
            last = position == len(values)
            result = self.Where(pick_first(result, value), result, value,
                                hint=hint, out=out if last else None)
        return result

    def Neg(self, x: Operand, *, hint: str | None = None, out: str | None = None) -> Value:
        return self._unary("Neg", x, hint, out)

    def Abs(self, x: Operand, *, hint: str | None = None, out: str | None = None) -> Value:
        return self._unary("Abs", x, hint, out)

    def Floor(self, x: Operand, *, hint: str | None = None, out: str | None = None) -> Value:
        return self._unary("Floor", x, hint, out)

    def Ceil(self, x: Operand, *, hint: str | None = None, out: str | None = None) -> Value:
        return self._unary("Ceil", x, hint, out)

    def Round(self, x: Operand, *, hint: str | None = None, out: str | None = None) -> Value:
        """Round half to even (like numpy and torch.round)."""
        return self._unary("Round", x, hint, out)

    def Sqrt(self, x: Operand, *, hint: str | None = None, out: str | None = None) -> Value:
        return self._unary("Sqrt", x, hint, out)

    def Exp(self, x: Operand, *, hint: str | None = None, out: str | None = None) -> Value:
        return self._unary("Exp", x, hint, out)

    def Log(self, x: Operand, *, hint: str | None = None, out: str | None = None) -> Value:
        return self._unary("Log", x, hint, out)

    def Reciprocal(self, x: Operand, *, hint: str | None = None,
                   out: str | None = None) -> Value:
        return self._unary("Reciprocal", x, hint, out)

    def Relu(self, x: Operand, *, hint: str | None = None, out: str | None = None) -> Value:
        return self._unary("Relu", x, hint, out)

    def Sigmoid(self, x: Operand, *, hint: str | None = None, out: str | None = None) -> Value:
        return self._unary("Sigmoid", x, hint, out)

    def Tanh(self, x: Operand, *, hint: str | None = None, out: str | None = None) -> Value:
        return self._unary("Tanh", x, hint, out)

    def Sign(self, x: Operand, *, hint: str | None = None, out: str | None = None) -> Value:
        return self._unary("Sign", x, hint, out)

    def Erf(self, x: Operand, *, hint: str | None = None, out: str | None = None) -> Value:
        return self._unary("Erf", x, hint, out)

    def Identity(self, x: Operand, *, hint: str | None = None,
                 out: str | None = None) -> Value:
        return self._unary("Identity", x, hint, out)

    def Clip(self, x: Operand, min: Operand | None = None, max: Operand | None = None, *,
             hint: str | None = None, out: str | None = None) -> Value:
        """Clip with optional bounds (inputs since opset 11; below 12, anything but float32 is
        spelled Max/Min, which ONNX Runtime implements for every float type there)."""
        value = self._operand(x, None, "clip_in")
        if self.opset < 12 and value.dtype != np.float32:
            # Clip-11 has float16/float64 in the standard, but ONNX Runtime implements it
            # for float32 only; Max/Min are the same function there.
            bounded = value if min is None else self.Max(value, min, hint=f"{hint or 'clip'}_low")
            if max is None:
                return self.Identity(bounded, hint=hint, out=out) if out else bounded
            return self.Min(bounded, max, hint=hint, out=out)
        low = self._operand(min, value.dtype, "clip_min") if min is not None else ""
        high = self._operand(max, value.dtype, "clip_max") if max is not None else ""
        inputs = [value, low, high] if high else ([value, low] if low else [value])
        return self.op("Clip", *inputs, hint=hint, out=out, dtype=value.dtype)

    def Where(self, condition: Operand, a: Operand, c: Operand, *, hint: str | None = None,
              out: str | None = None) -> Value:
        cond = self._operand(condition, np.dtype(bool), "where_cond")
        like = self._dtype_of(a, c)
        left = self._operand(a, like, "where_a")
        right = self._operand(c, like, "where_b")
        return self.op("Where", cond, left, right, hint=hint, out=out, dtype=like)

    # -- comparisons and logic (results are bool) --------------------------------------------

    def Equal(self, a: Operand, c: Operand, *, hint: str | None = None,
              out: str | None = None) -> Value:
        return self._binary("Equal", a, c, hint, out, result=np.dtype(bool))

    def Less(self, a: Operand, c: Operand, *, hint: str | None = None,
             out: str | None = None) -> Value:
        return self._binary("Less", a, c, hint, out, result=np.dtype(bool))

    def Greater(self, a: Operand, c: Operand, *, hint: str | None = None,
                out: str | None = None) -> Value:
        return self._binary("Greater", a, c, hint, out, result=np.dtype(bool))

    def LessOrEqual(self, a: Operand, c: Operand, *, hint: str | None = None,
                    out: str | None = None) -> Value:
        """``a <= c``. The native op exists from opset 12, but onnx2torch converts only its
        opset-12 version, so from opset 16 (where it was revised) portable output spells it
        too: Not(Greater) for integers, else Or(Less, Equal), which keeps NaN -> False."""
        return self._or_equal("LessOrEqual", self.Less, self.Greater, a, c, hint, out)

    def GreaterOrEqual(self, a: Operand, c: Operand, *, hint: str | None = None,
                       out: str | None = None) -> Value:
        """``a >= c``; spelled as :meth:`LessOrEqual` is, with the comparisons mirrored."""
        return self._or_equal("GreaterOrEqual", self.Greater, self.Less, a, c, hint, out)

    def _or_equal(self, op_type: str, strict: Any, opposite: Any, a: Operand, c: Operand,
                  hint: str | None, out: str | None) -> Value:
        native = 12 <= self.opset < 16 or (self.opset >= 16 and self.target == "ort")
        if native:
            return self._binary(op_type, a, c, hint, out, result=np.dtype(bool))
        like = self._dtype_of(a, c)
        if like is not None and like.kind in "iub":  # no NaN: one comparison, negated
            return self.Not(opposite(a, c), hint=hint, out=out)
        return self.Or(strict(a, c), self.Equal(a, c), hint=hint, out=out)

    def And(self, a: Operand, c: Operand, *, hint: str | None = None,
            out: str | None = None) -> Value:
        return self._binary("And", a, c, hint, out, result=np.dtype(bool))

    def Or(self, a: Operand, c: Operand, *, hint: str | None = None,
           out: str | None = None) -> Value:
        return self._binary("Or", a, c, hint, out, result=np.dtype(bool))

    def Xor(self, a: Operand, c: Operand, *, hint: str | None = None,
            out: str | None = None) -> Value:
        return self._binary("Xor", a, c, hint, out, result=np.dtype(bool))

    def Not(self, x: Operand, *, hint: str | None = None, out: str | None = None) -> Value:
        return self._unary("Not", x, hint, out, result=np.dtype(bool))

    def IsNaN(self, x: Operand, *, hint: str | None = None, out: str | None = None) -> Value:
        return self._unary("IsNaN", x, hint, out, result=np.dtype(bool))

    def IsInf(self, x: Operand, *, hint: str | None = None, out: str | None = None) -> Value:
        return self._unary("IsInf", x, hint, out, result=np.dtype(bool))

    # -- types and shapes -------------------------------------------------------------------

    def Cast(self, x: Operand, to: Any, *, hint: str | None = None,
             out: str | None = None) -> Value:
        """``to`` is a numpy dtype or an ONNX element type."""
        target = onnx_type(to)
        return self._unary("Cast", x, hint, out, result=numpy_dtype(target), to=target)

    def Shape(self, x: Operand, start: int | None = None, end: int | None = None, *,
              hint: str | None = None, out: str | None = None) -> Value:
        """The shape as int64, optionally ``[start:end]`` (attributes since 15; a Slice
        before)."""
        value = self._operand(x, None, "shape_in")
        if start is None and end is None:
            return self.op("Shape", value, hint=hint, out=out, dtype=np.int64)
        if start is not None and start == end and out is None:
            return self.ints([], hint=hint or "shape")  # statically empty
        if self.opset >= 15:
            attrs = {"start": start} if start is not None else {}
            if end is not None:
                attrs["end"] = end
            return self.op("Shape", value, hint=hint, out=out, dtype=np.int64, **attrs)
        full = self.op("Shape", value, hint=f"{hint or 'shape'}_full", dtype=np.int64)
        return self.Slice(full, [start or 0], [INT64_MAX if end is None else end], [0],
                          hint=hint, out=out)

    def Size(self, x: Operand, *, hint: str | None = None, out: str | None = None) -> Value:
        return self._unary("Size", x, hint, out, result=np.dtype(np.int64))

    def Reshape(self, x: Operand, shape: IntsOrValue, *, hint: str | None = None,
                out: str | None = None, to_caller: bool = False) -> Value:
        """``0`` in ``shape`` copies the input's dim (allowzero is never set).

        ``to_caller=True`` says ``out`` is a main-graph output (``ctx.is_model_output``).
        ONNX Runtime copies a Reshape into the caller's buffer on one thread; a float32 or
        float64 result is then written by ``Sub(view, 0)`` instead, exact for every value
        (-0 and NaN included), which it runs in parallel (docs/performance.md). Other
        types keep the plain Reshape."""
        value = self._operand(x, None, "reshape_in")
        target = self._index(shape, "shape")
        if to_caller and value.dtype in (np.dtype(np.float32), np.dtype(np.float64)):
            view = self.op("Reshape", value, target, hint=f"{hint or 'reshape'}_view",
                           dtype=value.dtype)
            return self.Sub(view, 0, hint=hint, out=out)
        return self.op("Reshape", value, target, hint=hint, out=out, dtype=value.dtype)

    def ReshapeBatchFirst(self, flat: Operand, shape: Value,
                          batch_dims: Sequence[int | str | None], *, hint: str | None = None,
                          out: str | None = None) -> Value:
        """``flat``, (B, K) or (B,) with B the product of the batch dims, reshaped to the
        run-time ``shape`` whose leading dims are the batch dims (their static entries:
        ``batch_dims``), with any of them possibly 0.

        Reshape's 0 copies the input's dim at the same index (allowzero, a literal 0, is
        refused by onnx2torch), so an empty batch such as (2, 0) or (0, 0) must reach the
        Reshape as an input whose dims are 0 wherever the target's may be: with at most one
        batch dim, or batch dims that are static and nonzero after the first, the target's
        only possible 0 is at index 0, where it copies B (0 too); otherwise the input is
        first viewed as (B, m, ..., m[, K]) with m = min(B, 1): (B, 1, ..., 1, K) sliced to
        B along each 1 (a Slice end past a dim stops at the dim, so 1 stays 1 and 0 gives
        0; no Min of a shape, which TVM's importer cannot take). The Slice copies, so it is
        only emitted for dynamic batches of rank >= 2."""
        value = self._operand(flat, None, "reshape_in")
        if all(isinstance(dim, int) and dim > 0 for dim in batch_dims[1:]):
            return self.Reshape(value, shape, hint=hint, out=out)
        base = hint or "reshape"
        middle = list(range(1, len(batch_dims)))
        widened = self.Unsqueeze(value, middle, hint=f"{base}_widened")  # (B, 1, .., 1[, K])
        count = self.Shape(value, 0, 1, hint=f"{base}_count")  # [B]
        ends = (self.Concat(*[count] * len(middle), axis=0, hint=f"{base}_ends")
                if len(middle) > 1 else count)
        view = self.Slice(widened, [0] * len(middle), ends, middle, hint=f"{base}_view")
        return self.Reshape(view, shape, hint=hint, out=out)

    def Flatten(self, x: Operand, axis: int = 1, *, hint: str | None = None,
                out: str | None = None) -> Value:
        """ONNX ``Flatten``: (d0 .. d{axis-1}) x (the rest), 2-D, exact for 0 dims."""
        return self._unary("Flatten", x, hint, out, axis=int(axis))

    def Expand(self, x: Operand, shape: IntsOrValue, *, hint: str | None = None,
               out: str | None = None) -> Value:
        value = self._operand(x, None, "expand_in")
        return self.op("Expand", value, self._index(shape, "expand_shape"), hint=hint,
                       out=out, dtype=value.dtype)

    def Tile(self, x: Operand, repeats: IntsOrValue, *, hint: str | None = None,
             out: str | None = None) -> Value:
        value = self._operand(x, None, "tile_in")
        return self.op("Tile", value, self._index(repeats, "repeats"), hint=hint, out=out,
                       dtype=value.dtype)

    def Transpose(self, x: Operand, perm: Sequence[int], *, hint: str | None = None,
                  out: str | None = None) -> Value:
        return self._unary("Transpose", x, hint, out, perm=[int(p) for p in perm])

    def Unsqueeze(self, x: Operand, axes: Sequence[int], *, hint: str | None = None,
                  out: str | None = None) -> Value:
        # Unsqueeze-13 moved `axes` from an attribute to an input.
        value = self._operand(x, None, "unsqueeze_in")
        if self.opset >= 13:
            return self.op("Unsqueeze", value, self.ints(list(axes), "axes"), hint=hint,
                           out=out, dtype=value.dtype)
        return self.op("Unsqueeze", value, axes=list(axes), hint=hint, out=out,
                       dtype=value.dtype)

    def Squeeze(self, x: Operand, axes: Sequence[int], *, hint: str | None = None,
                out: str | None = None) -> Value:
        # Squeeze-13 moved `axes` from an attribute to an input.
        value = self._operand(x, None, "squeeze_in")
        if self.opset >= 13:
            return self.op("Squeeze", value, self.ints(list(axes), "axes"), hint=hint,
                           out=out, dtype=value.dtype)
        return self.op("Squeeze", value, axes=list(axes), hint=hint, out=out,
                       dtype=value.dtype)

    def Concat(self, *xs: Operand, axis: int, hint: str | None = None,
               out: str | None = None) -> Value:
        """Operands known to be empty (constants of size 0, such as an empty batch-dim
        ``Shape`` slice) are left out: an empty constant in a Concat keeps engines from
        folding it (a portability rule). One operand left is returned as it is."""
        like = self._dtype_of(*xs)
        values = [self._operand(x, like, "concat_in") for x in xs]
        kept = [value for value in values if value not in self._empty_constants]
        if not kept:
            kept = values[:1]
        if len(kept) == 1 and out is None:
            return kept[0]
        if len(kept) == 1:
            return self.Identity(kept[0], hint=hint, out=out)
        return self.op("Concat", *kept, axis=axis, hint=hint, out=out, dtype=like)

    def Split(self, x: Operand, sizes: Sequence[int] | int, axis: int, *,
              hint: str | None = None) -> list[Value]:
        """Split into pieces of the given static sizes along ``axis``; an int ``sizes`` splits
        into that many equal pieces, with no sizes in the node (for a dynamic axis: every
        piece's size is then the same expression to shape inference)."""
        value = self._operand(x, None, "split_in")
        if isinstance(sizes, int):
            pieces = self.op_multi("Split", [value], sizes, axis=axis, hint=hint or "split",
                                   dtypes=[value.dtype] * sizes)
            if self.opset >= 18:  # Split-18 needs num_outputs when no sizes are given
                self.nodes[-1].attribute.append(helper.make_attribute("num_outputs", sizes))
            return pieces
        dtypes = [value.dtype] * len(sizes)
        # Split-13 moved `split` from an attribute to an input.
        if self.opset >= 13:
            return self.op_multi("Split", [value, self.ints(list(sizes), "split")], len(sizes),
                                 axis=axis, hint=hint or "split", dtypes=dtypes)
        return self.op_multi("Split", [value], len(sizes), axis=axis, split=list(sizes),
                             hint=hint or "split", dtypes=dtypes)

    def Slice(self, x: Operand, starts: IntsOrValue, ends: IntsOrValue,
              axes: IntsOrValue | None = None, steps: IntsOrValue | None = None, *,
              hint: str | None = None, out: str | None = None) -> Value:
        """Slice with static (int lists) or run-time (Values) bounds. Portable output
        avoids negative ``steps``: onnx2tf turns some step -1 Slices into Identity."""
        value = self._operand(x, None, "slice_in")
        inputs: list[str] = [value, self._index(starts, "starts"), self._index(ends, "ends")]
        if axes is not None or steps is not None:
            inputs.append(self._index(axes, "slice_axes") if axes is not None else "")
        if steps is not None:
            inputs.append(self._index(steps, "steps"))
        return self.op("Slice", *inputs, hint=hint, out=out, dtype=value.dtype)

    def Pad(self, x: Operand, pads: IntsOrValue, value: Any = 0, *, mode: str = "constant",
            hint: str | None = None, out: str | None = None) -> Value:
        """``pads`` is [x1_begin, x2_begin, ..., x1_end, x2_end, ...]; inputs since 11."""
        data = self._operand(x, None, "pad_in")
        inputs = [data, self._index(pads, "pads")]
        if mode == "constant":
            inputs.append(self._operand(value, data.dtype, "pad_value"))
        return self.op("Pad", *inputs, mode=mode, hint=hint, out=out, dtype=data.dtype)

    def ConstantOfShape(self, shape: IntsOrValue, value: Any, dtype: Any = None, *,
                        hint: str | None = None, out: str | None = None) -> Value:
        """A tensor of ``shape`` filled with ``value`` (of ``dtype``, default float32)."""
        fill = np.asarray([value], dtype=dtype if dtype is not None else np.float32)
        return self.op("ConstantOfShape", self._index(shape, "fill_shape"), hint=hint,
                       out=out, dtype=fill.dtype, value=numpy_helper.from_array(fill))

    def Range(self, start: Operand, limit: Operand, delta: Operand, *,
              hint: str | None = None, out: str | None = None) -> Value:
        """``start, start + delta, ...`` below ``limit``; all three are scalars of one type."""
        like = self._dtype_of(start, limit, delta)
        values = [self._operand(v, like, "range_arg") for v in (start, limit, delta)]
        return self.op("Range", *values, hint=hint, out=out, dtype=like)

    # -- indexing -----------------------------------------------------------------------------

    def Gather(self, data: Operand, indices: IntsOrValue, axis: int = 0, *,
               hint: str | None = None, out: str | None = None) -> Value:
        value = self._operand(data, None, "gather_in")
        return self.op("Gather", value, self._index(indices, "indices"), axis=axis,
                       hint=hint, out=out, dtype=value.dtype)

    def GatherElements(self, data: Operand, indices: Operand, axis: int, *,
                       hint: str | None = None, out: str | None = None) -> Value:
        value = self._operand(data, None, "gather_in")
        return self.op("GatherElements", value, self._operand(indices, np.dtype(np.int64),
                                                              "indices"),
                       axis=axis, hint=hint, out=out, dtype=value.dtype)

    def GatherND(self, data: Operand, indices: Operand, batch_dims: int = 0, *,
                 hint: str | None = None, out: str | None = None) -> Value:
        value = self._operand(data, None, "gather_in")
        attrs = {"batch_dims": batch_dims} if batch_dims else {}
        if batch_dims and self.opset < 12:
            raise ValueError("GatherND batch_dims needs opset 12")
        return self.op("GatherND", value, self._operand(indices, np.dtype(np.int64),
                                                        "indices"),
                       hint=hint, out=out, dtype=value.dtype, **attrs)

    def ScatterElements(self, data: Operand, indices: Operand, updates: Operand, axis: int,
                        *, hint: str | None = None, out: str | None = None) -> Value:
        value = self._operand(data, None, "scatter_in")
        return self.op("ScatterElements", value,
                       self._operand(indices, np.dtype(np.int64), "indices"),
                       self._operand(updates, value.dtype, "updates"), axis=axis,
                       hint=hint, out=out, dtype=value.dtype)

    def ScatterND(self, data: Operand, indices: Operand, updates: Operand, *,
                  hint: str | None = None, out: str | None = None) -> Value:
        """``data`` with ``updates`` written at the (..., rank-of-data-prefix) ``indices``
        (int64); no reduction, so indices must be unique."""
        value = self._operand(data, None, "scatter_in")
        return self.op("ScatterND", value, self._operand(indices, np.dtype(np.int64), "indices"),
                       self._operand(updates, value.dtype, "updates"), hint=hint, out=out,
                       dtype=value.dtype)

    def NonMaxSuppression(self, boxes: Operand, scores: Operand, max_per_class: int,
                          iou_threshold: float, score_threshold: float | None = None, *,
                          center_point_box: bool = False, hint: str | None = None) -> Value:
        """ONNX NonMaxSuppression on float32 ``boxes`` (B, N, 4) and ``scores`` (B, C, N):
        (K, 3) int64 rows (batch, class, box). Keeps a score strictly above
        ``score_threshold`` (None: every score) and suppresses an IoU strictly above
        ``iou_threshold``; the thresholds are float32 constants."""
        inputs = [self._operand(boxes, None, "nms_boxes"), self._operand(scores, None,
                                                                         "nms_scores"),
                  self.ints([max_per_class], "max_per_class"),
                  self.const(np.array([iou_threshold], np.float32), hint="iou_threshold")]
        if score_threshold is not None:
            inputs.append(self.const(np.array([score_threshold], np.float32),
                                     hint="score_threshold"))
        if center_point_box:
            return self.op("NonMaxSuppression", *inputs, hint=hint or "NonMaxSuppression",
                           dtype=np.int64, center_point_box=1)
        return self.op("NonMaxSuppression", *inputs, hint=hint or "NonMaxSuppression",
                       dtype=np.int64)

    def TopK(self, x: Operand, k: IntsOrValue, axis: int = -1, *, largest: bool = True,
             sorted: bool = True, hint: str | None = None) -> tuple[Value, Value]:
        """(values, int64 indices) of the k largest (or smallest) along ``axis``."""
        value = self._operand(x, None, "topk_in")
        kk = self._index([k] if isinstance(k, int) else k, "k")
        values, indices = self.op_multi("TopK", [value, kk], 2, axis=axis,
                                        largest=int(largest), sorted=int(sorted),
                                        hint=hint or "TopK",
                                        dtypes=[value.dtype, np.int64])
        return values, indices

    # -- reductions and products ------------------------------------------------------------

    def _reduce(self, op_type: str, x: Operand, axes: Sequence[int], keepdims: bool,
                hint: str | None, out: str | None) -> Value:
        """ReduceSum took `axes` as an input at 13, the other reductions at 18."""
        value = self._operand(x, None, "reduce_in")
        if self.opset >= (13 if op_type == "ReduceSum" else 18):
            return self.op(op_type, value, self.ints(list(axes), "axes"),
                           keepdims=int(keepdims), hint=hint or op_type, out=out,
                           dtype=value.dtype)
        return self.op(op_type, value, axes=list(axes), keepdims=int(keepdims),
                       hint=hint or op_type, out=out, dtype=value.dtype)

    def ReduceSum(self, x: Operand, axes: Sequence[int], keepdims: bool = True, *,
                  hint: str | None = None, out: str | None = None) -> Value:
        return self._reduce("ReduceSum", x, axes, keepdims, hint, out)

    def ReduceMax(self, x: Operand, axes: Sequence[int], keepdims: bool = True, *,
                  hint: str | None = None, out: str | None = None) -> Value:
        return self._reduce("ReduceMax", x, axes, keepdims, hint, out)

    def ReduceMin(self, x: Operand, axes: Sequence[int], keepdims: bool = True, *,
                  hint: str | None = None, out: str | None = None) -> Value:
        return self._reduce("ReduceMin", x, axes, keepdims, hint, out)

    def ReduceMean(self, x: Operand, axes: Sequence[int], keepdims: bool = True, *,
                   hint: str | None = None, out: str | None = None) -> Value:
        return self._reduce("ReduceMean", x, axes, keepdims, hint, out)

    def ReduceProd(self, x: Operand, axes: Sequence[int], keepdims: bool = True, *,
                   hint: str | None = None, out: str | None = None) -> Value:
        return self._reduce("ReduceProd", x, axes, keepdims, hint, out)

    def ArgMax(self, x: Operand, axis: int, keepdims: bool = True, *,
               select_last_index: bool = False, hint: str | None = None,
               out: str | None = None) -> Value:
        return self._arg("ArgMax", x, axis, keepdims, select_last_index, hint, out)

    def ArgMin(self, x: Operand, axis: int, keepdims: bool = True, *,
               select_last_index: bool = False, hint: str | None = None,
               out: str | None = None) -> Value:
        return self._arg("ArgMin", x, axis, keepdims, select_last_index, hint, out)

    def Transpose2D(self, x: Operand, rows: int | None, columns: int | None, *,
                    shape: Value | None = None,
                    batch_dims: Sequence[int | str | None] = (), hint: str | None = None,
                    out: str | None = None) -> Value:
        """x read as a (rows, columns) matrix (one of the two may be None: -1), transposed
        to (columns, rows), then reshaped to ``shape`` if given (by :meth:`ReshapeBatchFirst`;
        the leading dims of ``shape`` are the batch, whose static entries are
        ``batch_dims``).

        The swap is a Transpose (0, 1, 3, 2) of a (1, 1, rows, columns) view, not a 2-D
        Transpose (1, 0): onnx2tf's tf_converter ignores the perm of a Transpose whose
        perm[0] is not 0 and matches output dims to input dims by size, so a square swap
        came out untouched; with perm[0] = 0 it keeps the perm. The view goes back to 2-D
        before any reshape to ``shape``, whose 0 dims (an empty batch) would otherwise copy
        the view's 1s. Reshapes are free on ONNX Runtime."""
        label = hint or "transposed"
        value = self._operand(x, None, f"{label}_in")
        quad = self.Reshape(value, [1, 1, -1 if rows is None else rows,
                                    -1 if columns is None else columns], hint=f"{label}_4d")
        swapped = self.Transpose(quad, [0, 1, 3, 2], hint=f"{label}_4d_t")
        flat = self.Reshape(swapped, [-1 if columns is None else columns,
                                      -1 if rows is None else rows],
                            hint=hint if shape is None else f"{label}_2d",
                            out=out if shape is None else None)
        if shape is None:
            return flat
        return self.ReshapeBatchFirst(flat, shape, batch_dims, hint=hint, out=out)

    def Reverse(self, x: Operand, axis: int, *, hint: str | None = None,
                out: str | None = None) -> Value:
        """x reversed along ``axis``: a Gather of (n - 1) - Range(0, n, 1), whole slices at
        once. Not a Slice with step -1 (onnx2tf turns some into Identity), and not a Gather
        of Range(n - 1, -1, -1): ONNX Runtime 1.32 rewrites that into an empty Slice."""
        value = self._operand(x, None, "reverse_in")
        label = hint or "reversed"
        n = self.Gather(self.Shape(value, hint=f"{label}_shape"), axis, hint=f"{label}_n")
        positions = (n - 1) - self.Range(0, n, 1, hint=f"{label}_positions")
        return self.Gather(value, positions, axis=axis, hint=hint, out=out)

    def _arg(self, op_type: str, x: Operand, axis: int, keepdims: bool, last: bool,
             hint: str | None, out: str | None) -> Value:
        """ArgMax/ArgMin as int64; ``select_last_index`` exists from opset 12, and below it
        is spelled as the first index of the reversed axis, mapped back: n - 1 - i."""
        value = self._operand(x, None, "arg_in")
        if not last or self.opset >= 12:
            attrs = {"select_last_index": 1} if last else {}
            return self.op(op_type, value, axis=axis, keepdims=int(keepdims), hint=hint,
                           out=out, dtype=np.int64, **attrs)
        n = self.Gather(self.Shape(value), axis, hint="arg_n")
        first = self.op(op_type, self.Reverse(value, axis, hint="arg_reversed"),
                        axis=axis, keepdims=int(keepdims), dtype=np.int64)
        return self.Sub(n - 1, first, hint=hint, out=out)

    def CumSum(self, x: Operand, axis: int, *, exclusive: bool = False,
               reverse: bool = False, hint: str | None = None,
               out: str | None = None) -> Value:
        value = self._operand(x, None, "cumsum_in")
        return self.op("CumSum", value, self.ints(axis, "cumsum_axis"),
                       exclusive=int(exclusive), reverse=int(reverse), hint=hint, out=out,
                       dtype=value.dtype)

    def MatMul(self, a: Operand, c: Operand, *, hint: str | None = None,
               out: str | None = None) -> Value:
        return self._binary("MatMul", a, c, hint, out)

    def Einsum(self, equation: str, *xs: Operand, hint: str | None = None,
               out: str | None = None) -> Value:
        if self.opset < 12:
            raise ValueError("Einsum needs opset 12; use MatMul/ReduceSum below it")
        like = self._dtype_of(*xs)
        values = [self._operand(x, like, "einsum_in") for x in xs]
        return self.op("Einsum", *values, equation=equation, hint=hint, out=out, dtype=like)

    def Softmax(self, x: Operand, axis: int = -1, *, hint: str | None = None,
                out: str | None = None) -> Value:
        """Softmax along one axis. Before opset 13 Softmax flattened everything from
        ``axis`` on, which equals a one-axis softmax only for the last axis; any other axis
        is spelled exp(x - max) / sum there."""
        value = self._operand(x, None, "softmax_in")
        if self.opset >= 13 or axis == -1:
            return self.op("Softmax", value, axis=axis, hint=hint, out=out, dtype=value.dtype)
        shifted = self.Exp(value - self.ReduceMax(value, [axis]))
        return self.Div(shifted, self.ReduceSum(shifted, [axis]), hint=hint, out=out)

    def GridSample(self, x: Operand, grid: Operand, *, mode: str = "linear",
                   padding_mode: str = "zeros", align_corners: bool = False,
                   hint: str | None = None, out: str | None = None) -> Value:
        """GridSample, from opset 16 (a caller below it needs its own sampler). ``mode`` in
        opset 20's words (``linear``, ``nearest``, ``cubic``); 16-19 spell them
        ``bilinear`` and ``bicubic`` (4-D only there)."""
        if self.opset < 16:
            raise ValueError(f"GridSample needs opset 16, this build is at {self.opset}")
        if self.opset < 20:
            mode = {"linear": "bilinear", "cubic": "bicubic"}.get(mode, mode)
        value = self._operand(x, None, "grid_sample_in")
        return self.op("GridSample", value, self._operand(grid, value.dtype, "grid"),
                       mode=mode, padding_mode=padding_mode,
                       align_corners=int(align_corners), hint=hint, out=out, dtype=value.dtype)

    # -- the first API's lower-case spellings, kept for existing user patterns ---------------

    def cast(self, x: str, to: int, hint: str = "cast", out: str | None = None) -> Value:
        return self.Cast(x, to, hint=hint, out=out)

    def unsqueeze(self, x: str, axes: Sequence[int], hint: str = "unsqueeze") -> Value:
        return self.Unsqueeze(x, axes, hint=hint)

    def squeeze(self, x: str, axes: Sequence[int], hint: str = "squeeze") -> Value:
        return self.Squeeze(x, axes, hint=hint)

    def reduce(self, op_type: str, x: str, axes: Sequence[int], keepdims: bool = True,
               hint: str | None = None) -> Value:
        return self._reduce(op_type, x, axes, keepdims, hint, None)

    def slice(self, x: str, starts: Sequence[int], ends: Sequence[int], axes: Sequence[int],
              steps: Sequence[int] | None = None, hint: str = "slice",
              out: str | None = None) -> Value:
        return self.Slice(x, starts, ends, axes, steps, hint=hint, out=out)

    def split(self, x: str, sizes: Sequence[int], axis: int, hint: str = "split"
              ) -> list[Value]:
        return self.Split(x, sizes, axis, hint=hint)

    def pad(self, x: str, pads: Sequence[int], value: Any, dtype: Any,
            hint: str = "pad") -> Value:
        return self.Pad(x, pads, np.asarray(value, dtype=dtype), hint=hint)

    def identity(self, x: str, out: str, hint: str = "identity") -> Value:
        return self.Identity(x, hint=hint, out=out)
