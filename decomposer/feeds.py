"""Feeds for verification: parse the CLI's input flags, read ``.npz`` files, and build one
feed dict per run, refusing anything that does not fit the model's inputs.

In: ``--input-shape NAME:1x3x224x224`` / ``--input-value NAME=1,64,32,32`` specs, ``.npz``
paths, and the model whose graph inputs the feeds are for.
Out: ``{input name: numpy array}`` dicts. Every problem the user can fix (a name that is not
an input, a wrong rank or fixed dimension, a float64 array for a float32 input, a file that
is not an ``.npz``, an integer input with no value) raises :class:`InvalidModelError`
(exit 2) with one line naming the input and the fix, before anything runs or is written.

Generated values: float inputs get seeded uniform values in [-1, 1], booleans seeded coin
flips; symbolic dims get small sizes that change with the run number (so dynamic sizes are
exercised) and agree across inputs sharing a dim name. Integer inputs need a value: random
sizes or indices mean nothing.
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from decomposer.errors import InvalidModelError

DEFAULT_SYMBOLIC_DIM = 3

_NPY_MAGIC = b"\x93NUMPY"


def parse_input_shapes(specs: Sequence[str]) -> dict[str, list[int]]:
    """``NAME:1x3x224x224`` -> {NAME: [1, 3, 224, 224]}; ``NAME:`` is a scalar."""
    shapes: dict[str, list[int]] = {}
    for spec in specs:
        name, sep, dims = spec.rpartition(":")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = [int(d) for d in dims.lower().split("x")] if dims else []
            if any(d < 0 for d in shapes[name]):
                raise ValueError
        except ValueError:
            raise InvalidModelError(f"--input-shape {spec!r}: expected NAME:1x3x224x224 "
                                    f"(non-negative sizes)") from None
    return shapes


def parse_input_values(specs: Sequence[str]) -> dict[str, list[float]]:
    """``NAME=1,64,32,32`` -> {NAME: [1, 64, 32, 32]}."""
    values: dict[str, list[float]] = {}
    for spec in specs:
        name, sep, text = spec.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            values[name] = [float(v) for v in text.split(",")] if text else []
        except ValueError:
            raise InvalidModelError(f"--input-value {spec!r}: expected NAME=1,64,32,32") from None
    return values


def load_npz(path: str | Path, flag: str = "--inputs") -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file (``np.savez``), with one clear error for anything else."""
    source = Path(path)
    try:
        with open(source, "rb") as handle:
            head = handle.read(len(_NPY_MAGIC))
    except OSError as exc:
        raise InvalidModelError(f"{flag} {source}: cannot read: {exc.strerror or exc}") from exc
    if head == _NPY_MAGIC:
        raise InvalidModelError(f"{flag} {source}: is a single-array .npy file; save named "
                                f"arrays with np.savez(path, input_name=array, ...)")
    if not zipfile.is_zipfile(source):
        raise InvalidModelError(f"{flag} {source}: not an .npz file (write it with "
                                f"np.savez(path, input_name=array, ...))")
    try:
        with np.load(source, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InvalidModelError(f"{flag} {source}: cannot read as .npz: {detail}") from exc


def _declared_dims(value: onnx.ValueInfoProto) -> list[int | str | None] | None:
    """The declared shape of a graph input: ints, symbolic names, or None per dim; None if
    the rank itself is unknown."""
    tensor_type = value.type.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    dims: list[int | str | None] = []
    for dim in tensor_type.shape.dim:
        if dim.HasField("dim_value"):
            dims.append(dim.dim_value)
        else:
            dims.append(dim.dim_param or None)
    return dims


def _dtype_of(value: onnx.ValueInfoProto) -> np.dtype:
    elem_type = value.type.tensor_type.elem_type
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)) if elem_type \
        else np.dtype(np.float32)


def _show(dims: Sequence[int | str | None]) -> str:
    return " x ".join("?" if d is None else str(d) for d in dims) or "a scalar"


def _check_shape(name: str, got: Sequence[int], value: onnx.ValueInfoProto, source: str
                 ) -> None:
    declared = _declared_dims(value)
    if declared is None:
        return
    if len(got) != len(declared):
        raise InvalidModelError(f"{source}: input '{name}' has rank {len(declared)} "
                                f"({_show(declared)}), got {len(got)} dim(s) "
                                f"({_show(list(got))})")
    for axis, (want, have) in enumerate(zip(declared, got, strict=True)):
        if isinstance(want, int) and want != have:
            raise InvalidModelError(f"{source}: input '{name}' has fixed dim {axis} = {want} "
                                    f"({_show(declared)}), got {have}")


def runtime_inputs(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """Graph inputs a caller may feed, by name (an initializer's input is an overridable
    default, and may be fed too)."""
    return {value.name: value for value in model.graph.input}


def check_names(model: onnx.ModelProto, names: Sequence[str], source: str) -> None:
    """Refuse names that are not graph inputs (a typo would otherwise be silently ignored)."""
    inputs = runtime_inputs(model)
    initializers = {init.name for init in model.graph.initializer}
    for name in names:
        if name not in inputs:
            accepted = ", ".join(n for n in inputs if n not in initializers) or "none"
            raise InvalidModelError(f"{source}: the model has no input '{name}'; its inputs "
                                    f"are: {accepted}")


def generate_feeds(model: onnx.ModelProto, run: int, *, seed: int = 0,
                   shapes: Mapping[str, Sequence[int]] | None = None,
                   values: Mapping[str, Sequence[float]] | None = None,
                   given: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Feeds for every graph input: given arrays, then given values, then random data.

    Raises InvalidModelError for names that are not inputs, arrays or values that do not fit
    an input's declared type or shape, and integer inputs with nothing given.
    """
    shapes, values, given = shapes or {}, values or {}, given or {}
    check_names(model, list(shapes), "--input-shape")
    check_names(model, list(values), "--input-value")
    check_names(model, list(given), "--inputs")
    rng = np.random.default_rng(seed + 1000 * run)
    initializers = {init.name for init in model.graph.initializer}
    symbols: dict[str, int] = {}
    feeds: dict[str, np.ndarray] = {}
    for name, value in runtime_inputs(model).items():
        if name in initializers and name not in given and name not in values:
            continue
        dtype = _dtype_of(value)
        if name in given:
            feeds[name] = _given_array(name, given[name], value, dtype)
            continue
        if name in values:
            feeds[name] = _value_array(name, values[name], value, dtype)
            continue
        if name in shapes:
            dims = [int(d) for d in shapes[name]]
            _check_shape(name, dims, value, f"--input-shape {name}:{'x'.join(map(str, dims))}")
        else:
            dims = []
            declared = _declared_dims(value) or []
            for index, dim in enumerate(declared):
                if isinstance(dim, int):
                    dims.append(dim)
                else:
                    key = dim or f"{name}:{index}"
                    symbols.setdefault(key, DEFAULT_SYMBOLIC_DIM + run + len(symbols) % 3)
                    dims.append(symbols[key])
        if np.issubdtype(dtype, np.floating):
            feeds[name] = rng.uniform(-1, 1, dims).astype(dtype)
        elif dtype == np.bool_:
            feeds[name] = rng.integers(0, 2, dims).astype(np.bool_)
        else:
            raise InvalidModelError(
                f"input '{name}' is {dtype.name}: give its value with --input-value "
                f"{name}=1,2,3 (random integers would be meaningless as sizes or indices)")
    return feeds


def _given_array(name: str, array: np.ndarray, value: onnx.ValueInfoProto, dtype: np.dtype
                 ) -> np.ndarray:
    array = np.asarray(array)
    if array.dtype != dtype:
        raise InvalidModelError(f"--inputs: '{name}' is {array.dtype.name} but the model's "
                                f"input '{name}' is {dtype.name}; save it as {dtype.name} "
                                f"(array.astype(np.{dtype.name}))")
    _check_shape(name, array.shape, value, "--inputs")
    return array


def _value_array(name: str, numbers: Sequence[float], value: onnx.ValueInfoProto,
                 dtype: np.dtype) -> np.ndarray:
    source = f"--input-value {name}={','.join(f'{v:g}' for v in numbers)}"
    array = np.asarray(numbers, dtype=np.float64)
    if not np.issubdtype(dtype, np.floating) and dtype != np.bool_ \
            and not np.all(array == np.round(array)):
        raise InvalidModelError(f"{source}: input '{name}' is {dtype.name}; give whole numbers")
    declared = _declared_dims(value)
    if declared is not None and len(declared) != 1:
        if len(declared) == 0:
            if array.size != 1:
                raise InvalidModelError(f"{source}: input '{name}' is a scalar; give one value")
            array = array.reshape(())
        elif (static := [d for d in declared if isinstance(d, int)]) == declared \
                and int(np.prod(static)) == array.size:
            array = array.reshape(static)
        else:
            raise InvalidModelError(f"{source}: input '{name}' has rank {len(declared)} "
                                    f"({_show(declared)}); --input-value gives a list of "
                                    f"values, so give this input with --inputs FILE.npz")
    _check_shape(name, array.shape, value, source)
    return array.astype(dtype)


__all__ = ["DEFAULT_SYMBOLIC_DIM", "check_names", "generate_feeds", "load_npz",
           "parse_input_shapes", "parse_input_values", "runtime_inputs"]
