"""What ``check`` asks of a node's tensors, said once: known types and ranks, with reasons.

In: a :class:`decomposer.pattern.MatchContext`, a tensor name, how the message calls it, and
what is accepted. Out: the element type or shape, or :class:`decomposer.forms.Reject` with a
message that names the tensor and says how to fix the model (a typed graph input or
value_info), the same words in every pattern.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

from onnx import TensorProto

from decomposer.forms import Reject, UnknownTypes

FLOAT_TYPES = (TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE)
_TYPE_FIX = "give it a typed graph input or value_info"

Shape = tuple[int | str | None, ...]

# The most elements a pattern builds into one constant (index tables, per-value maps,
# interpolation matrices) from a node's attributes and static shapes: 2**26 (256 MiB of
# float32). A model whose sizes ask for more is refused before anything is allocated.
MAX_CONSTANT_ELEMENTS = 2 ** 26


class _Context(Protocol):
    def shape(self, name: str) -> Shape | None: ...

    def elem_type(self, name: str) -> int | None: ...


_NUMPY_NAMES: dict[int, str] = {int(TensorProto.FLOAT): "float32",
                                int(TensorProto.DOUBLE): "float64"}


def type_name(elem_type: int | None) -> str:
    """numpy-style name of an ONNX element type (``float32``, ``int64``); ``unknown`` for
    None."""
    if elem_type is None:
        return "unknown"
    return _NUMPY_NAMES.get(int(elem_type)) or str(TensorProto.DataType.Name(elem_type)).lower()


def _listed(types: Collection[int]) -> str:
    names = [type_name(t) for t in types]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def require_size(elements: int, label: str) -> int:
    """``elements`` if a constant that large may be built, else Reject naming ``label`` (what
    the constant would hold) and the limit."""
    if elements > MAX_CONSTANT_ELEMENTS:
        raise Reject(f"{label} would need {elements:,} values in a constant; the limit is "
                     f"{MAX_CONSTANT_ELEMENTS:,} (the node's sizes are implausible)")
    return elements


def require_type(ctx: _Context, name: str, label: str, allowed: Collection[int],
                 why: str = "") -> int:
    """The element type of tensor ``name``, which must be known and one of ``allowed``.
    ``why`` ends the message when the type is unknown (what it is needed for)."""
    elem_type = ctx.elem_type(name)
    if elem_type is None:
        reason = f", {why}" if why else ""
        raise UnknownTypes(f"the element type of {label} '{name}' is unknown{reason}; "
                           f"{_TYPE_FIX}")
    if elem_type not in allowed:
        raise Reject(f"{label} must be {_listed(allowed)}, got {type_name(elem_type)}")
    return elem_type


def require_shape(ctx: _Context, name: str, label: str, why: str = "",
                  min_rank: int = 0, max_rank: int | None = None) -> Shape:
    """The static shape (dims may be symbolic) of tensor ``name``, whose rank must be known
    and within [``min_rank``, ``max_rank``]; ``why`` says what the rank is needed for."""
    shape = ctx.shape(name)
    if shape is None:
        reason = f" ({why})" if why else ""
        raise UnknownTypes(f"the rank of {label} '{name}' is unknown{reason}; {_TYPE_FIX}")
    if len(shape) < min_rank:
        raise Reject(f"{label} '{name}' has rank {len(shape)}; rank >= {min_rank} is needed")
    if max_rank is not None and len(shape) > max_rank:
        raise Reject(f"{label} '{name}' has rank {len(shape)}; ranks above {max_rank} are "
                     f"refused")
    return shape


def require_broadcastable(ctx: _Context, name: str, label: str, target: Shape,
                          target_label: str) -> Shape | None:
    """The shape of tensor ``name`` (None if unknown), which must broadcast into ``target``
    (numpy rules, right-aligned, without growing it): at most ``target``'s rank, and each
    static dim equal to the target's or 1 where both are static."""
    shape = ctx.shape(name)
    if shape is None:
        return None
    if len(shape) > len(target):
        raise Reject(f"{label} '{name}' has rank {len(shape)}, more than {target_label} "
                     f"({len(target)})")
    for dim, into in zip(reversed(shape), reversed(target), strict=False):  # right-aligned
        if isinstance(dim, int) and isinstance(into, int) and dim not in (1, into):
            raise Reject(f"{label} '{name}' of shape {list(shape)} does not broadcast to "
                         f"{target_label} {list(target)}")
    return shape
