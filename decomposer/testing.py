"""Pattern test kit: prove a pattern against its numpy reference (and an oracle) on ORT.

In: a :class:`Pattern`, a list of :class:`Case` (input arrays plus attributes), and opsets.
Out: for every case and opset, a single-node model is built, decomposed, checked with
``onnx.checker.check_model(full_check=True)``, run on stock ONNX Runtime (CPU) for each of
the case's input sets, and compared with ``pattern.reference`` and, when given, a
user-supplied ``oracle`` (for example a torch function). Any mismatch raises
``AssertionError`` naming the case, opset, input set and error. Returns one
:class:`CaseResult` per (case, opset) so callers can assert more (op types, node counts).

Comparison: shapes and dtypes must be equal; values must satisfy
``|actual - expected| <= atol + rtol * |expected|``, with NaN equal to NaN (``equal_nan``) and,
with ``signed_zeros=True``, the sign of every zero equal too. ``atol``/``rtol`` may be one
number or a mapping from numpy dtype to number (the output's dtype picks), so one call can
cover float16 and float64 cases; :data:`DEFAULT_ATOL` holds the defaults.

Usage::

    from decomposer.testing import Case, check_pattern
    check_pattern(MyPattern(), [Case([x], {"alpha": 0.5})], opsets=range(11, 22),
                  oracle=my_torch_function)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper

from decomposer import tolerances
from decomposer.api import decompose_with_report
from decomposer.graphs import has_schema, is_default_domain
from decomposer.pattern import Form, Pattern
from decomposer.portability import violations
from decomposer.registry import Registry, default_registry

# The shared tolerance policy (decomposer.tolerances): float16 carries ~3 decimal digits.
DEFAULT_ATOL, DEFAULT_RTOL = tolerances.DEFAULT_ATOL, tolerances.DEFAULT_RTOL
Tolerance = tolerances.Tolerance


@dataclass
class Case:
    """One test case.

    - ``inputs``: arrays for the node's inputs, in order; their dtypes become input types.
    - ``attrs``: node attributes (Python values; ``None`` means "leave the attribute out").
    - ``symbolic``: per input index, the axes declared symbolic in the model (others are
      static, taken from ``inputs``); ``"all"`` makes every axis of every input symbolic.
    - ``more_inputs``: further input sets run through the same model (dynamic sizes).
    - ``constant_inputs``: indices of inputs baked into the model as initializers.
    - ``output_dtype`` / ``output_rank``: the outputs' dtype and rank, if not the first
      input's; a list gives one per output (e.g. ``[np.float32, np.int64]``).
    """

    inputs: Sequence[np.ndarray]
    attrs: Mapping[str, Any] = field(default_factory=dict)
    symbolic: Mapping[int, Sequence[int]] | str = field(default_factory=dict)
    more_inputs: Sequence[Sequence[np.ndarray]] = ()
    constant_inputs: Sequence[int] = ()
    output_dtype: Any = None
    output_rank: int | Sequence[int | None] | None = None
    id: str = ""

    def label(self) -> str:
        if self.id:
            return self.id
        shapes = ",".join("x".join(map(str, a.shape)) for a in self.inputs)
        attrs = ",".join(f"{k}={v}" for k, v in self.attrs.items())
        return f"({shapes}){' ' + attrs if attrs else ''}"


@dataclass
class CaseResult:
    case: Case
    opset: int
    model: onnx.ModelProto
    max_abs_error: float

    @property
    def op_types(self) -> list[str]:
        return [node.op_type for node in self.model.graph.node]


def ir_version_for(opset: int) -> int:
    """The lowest IR version that can carry ``opset`` (what ONNX Runtime expects)."""
    return helper.find_min_ir_version_for([helper.make_opsetid("", opset)], True)


def single_node_model(op_type: str, domain: str, case: Case, opset: int,
                      num_outputs: int = 1) -> onnx.ModelProto:
    """A model holding one ``domain::op_type`` node fed by graph inputs (or initializers)."""
    graph_inputs, initializers, names = [], [], []
    for index, array in enumerate(case.inputs):
        name = f"input{index}"
        names.append(name)
        array = np.asarray(array)
        if index in case.constant_inputs:
            initializers.append(onnx.numpy_helper.from_array(array, name))
            continue
        axes = range(array.ndim) if case.symbolic == "all" else \
            case.symbolic.get(index, ())  # type: ignore[union-attr]
        dims = [f"{name}_d{axis}" if axis in axes else size
                for axis, size in enumerate(array.shape)]
        graph_inputs.append(helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(array.dtype), dims))
    outputs = [f"output{i}" for i in range(num_outputs)]
    attrs = {k: v for k, v in case.attrs.items() if v is not None}
    node = helper.make_node(op_type, names, outputs, name=f"{op_type}_under_test",
                            domain=domain, **attrs)
    graph = helper.make_graph(
        [node], f"{op_type}_test", graph_inputs,
        # Output type and rank default to the first input's (true of most ops); the dims
        # are left unknown for the decomposed graph to infer.
        [helper.make_tensor_value_info(o, helper.np_dtype_to_tensor_dtype(
            np.dtype(_per_output(case.output_dtype, i, np.asarray(case.inputs[0]).dtype))),
            [None] * _per_output(case.output_rank, i, np.asarray(case.inputs[0]).ndim))
         for i, o in enumerate(outputs)],
        initializer=initializers)
    imports = [helper.make_opsetid("", opset)]
    if not is_default_domain(domain):
        imports.append(helper.make_opsetid(domain, 1))
    return helper.make_model(graph, opset_imports=imports, ir_version=ir_version_for(opset),
                             producer_name="decomposer.testing")


def _per_output(given: Any, index: int, default: Any) -> Any:
    """``given`` for output ``index``: one value for all outputs, or a list (one per output);
    None means ``default``."""
    value = given[index] if isinstance(given, (list, tuple)) else given
    return default if value is None else value


def run_onnxruntime(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Run ``model`` on stock ONNX Runtime (CPU), no custom-op libraries."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    outputs: list[np.ndarray] = session.run(None, dict(feeds))
    return outputs


def check_pattern(
    pattern: Pattern[Any],
    cases: Iterable[Case],
    opsets: Iterable[int] = range(11, 21),
    *,
    domain: str | None = None,
    oracle: Callable[..., Any] | None = None,
    atol: Tolerance | None = None,
    rtol: Tolerance | None = None,
    equal_nan: bool = True,
    signed_zeros: bool = False,
    registry: Registry | None = None,
    target: str = "portable",
    form: str | Form | None = None,
    engines: Sequence[str] = ("ort",),
    edge_sizes: bool | Sequence[int] = True,
) -> list[CaseResult]:
    """Decompose single-node models of ``pattern``'s op and compare them on each engine.

    ``oracle(*inputs, **attrs)`` returns the expected output(s); the pattern's own
    ``compute`` (``reference``) is always compared too. ``domain`` defaults to the first of
    the pattern's ``domains`` (``"custom.test"`` for a pattern that accepts any domain).
    ``registry`` defaults to the default registry plus ``pattern`` if it is not in it yet.
    ``form`` picks the spelling the nodes are written in (a :class:`Form` of the pattern,
    or the op_type of one); by default the pattern's first native one. Under the portable
    target every result must also pass :func:`decomposer.portability.violations`.

    ``engines`` names the engines every input set runs on (:mod:`decomposer.engines`:
    ``"ort"``, ``"openvino"``, ``"tvm"``; one that is not installed is an error). With
    ``edge_sizes`` (True: sizes 0 and 1; or the sizes to try), each group of symbolic dims
    (see :func:`edge_size_inputs`) also runs at those sizes, at the first and the last of
    ``opsets`` (the spellings at the ends of the range), where the pattern's reference and
    the oracle accept them; a derived set either rejects is skipped.
    """
    from decomposer import engines as engine_registry

    for engine in engines:
        engine_registry.require(engine)
    registry = registry if registry is not None else _registry_with(pattern)
    native = _native_form(pattern, form)
    if domain is None:
        domain = sorted(native.domains)[0] if native.domains else "custom.test"
    results: list[CaseResult] = []
    cases = list(cases)
    opset_list = list(opsets)
    for opset in opset_list:
        for case in cases:
            where = f"{pattern.name} case {case.label()} at opset {opset}"
            model = single_node_model(native.op_types[0], domain, case, opset,
                                      native.output_range[1])
            # a standard op at this opset is lowered (--lower), as an engine target would:
            # otherwise nothing is rewritten and the engines run the op itself
            op_type = native.op_types[0]
            standard = is_default_domain(domain) and has_schema(op_type, opset, "")
            out, report = decompose_with_report(model, registry=registry, target=target,
                                                lower=[op_type] if standard else ())
            leftover = [n.op_type for n in out.graph.node if not is_default_domain(n.domain)]
            assert not leftover, f"{where}: custom nodes remain: {leftover}"
            assert report.replaced, f"{where}: the node was not rewritten"
            onnx.checker.check_model(out, full_check=True)
            if target == "portable":
                problems = violations(out)
                assert not problems, (f"{where}: breaks the portability rules "
                                      f"(decomposer.portability): {'; '.join(problems)}")
            worst = 0.0
            attrs = {k: v for k, v in case.attrs.items() if v is not None}
            sets: list[tuple[str, Sequence[np.ndarray], bool]] = [
                (f"input set {i}", inputs, False)
                for i, inputs in enumerate([case.inputs, *case.more_inputs])]
            if edge_sizes and opset in (opset_list[0], opset_list[-1]):
                sizes = (0, 1) if edge_sizes is True else tuple(edge_sizes)
                sets += [(f"derived set ({label})", inputs, True)
                         for label, inputs in edge_size_inputs(case, sizes)]
            for set_label, inputs, derived in sets:
                try:
                    reference = pattern.evaluate(native, inputs, native.coerce_attributes(
                        attrs) if pattern.declarative else attrs)
                except NotImplementedError:
                    raise
                except Exception:
                    if derived:
                        continue  # sizes the op itself does not take
                    raise
                expectations: list[tuple[str, Sequence[Any]]] = [("reference", reference)]
                if oracle is not None:
                    try:
                        expected = oracle(*inputs, **attrs)
                    except Exception:
                        if derived:
                            continue  # the oracle (torch, say) refuses these sizes
                        raise
                    expectations.append(("oracle", expected if isinstance(expected, (list, tuple))
                                         else [expected]))
                feeds = {f"input{i}": np.asarray(a) for i, a in enumerate(inputs)
                         if i not in case.constant_inputs}
                for engine in engines:
                    got = _run_on(engine, out, feeds, f"{where}, {set_label}")
                    for label, expected_outputs in expectations:
                        for index, (actual, expected) in enumerate(zip(got, expected_outputs,
                                                                       strict=True)):
                            context = (f"{where}, {set_label}, output {index} on {engine} vs "
                                       f"{label}")
                            worst = max(worst, compare(
                                np.asarray(actual), np.asarray(expected), context, atol=atol,
                                rtol=rtol, equal_nan=equal_nan, signed_zeros=signed_zeros))
            results.append(CaseResult(case, opset, out, worst))
    return results


def _run_on(engine: str, model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
            where: str) -> list[np.ndarray]:
    if engine == "ort":
        try:
            return run_onnxruntime(model, feeds)
        except Exception as exc:
            raise AssertionError(f"{where}: ONNX Runtime cannot run the decomposition: "
                                 f"{str(exc).strip().splitlines()[0]}") from exc
    from decomposer import engines as engine_registry
    from decomposer.errors import EngineRunError

    try:
        return engine_registry.run_model(engine, model, feeds)
    except EngineRunError as exc:
        raise AssertionError(f"{where}: {engine} cannot run the decomposition: {exc}") from exc


def edge_size_inputs(case: Case, sizes: Sequence[int] = (0, 1)
                     ) -> list[tuple[str, list[np.ndarray]]]:
    """The case's first input set with each group of symbolic dims cut to each of
    ``sizes`` (smaller than the example's); labelled. Dims of one example size in different
    inputs form a group (a batch shared by two inputs moves together); a size that two dims
    of one input share, or that a static dim has too, cannot be told apart and is not
    derived."""
    groups: dict[int, list[tuple[int, int]]] = {}
    static_sizes: set[int] = set()
    for index, array in enumerate(case.inputs):
        array = np.asarray(array)
        axes = set(range(array.ndim)) if case.symbolic == "all" else \
            set(case.symbolic.get(index, ()))  # type: ignore[union-attr]
        if index in case.constant_inputs:
            axes = set()
        for axis in range(array.ndim):
            if axis in axes:
                groups.setdefault(int(array.shape[axis]), []).append((index, axis))
            else:
                static_sizes.add(int(array.shape[axis]))
    derived = []
    for size, members in sorted(groups.items()):
        owners = [index for index, _ in members]
        if size in static_sizes or len(owners) != len(set(owners)):
            continue  # which dims move together is ambiguous
        for new in sizes:
            if new >= size:
                continue
            arrays = [np.asarray(a) for a in case.inputs]
            for index, axis in members:
                arrays[index] = np.take(arrays[index], np.arange(new), axis=axis)
            dims = ", ".join(f"input{i} dim {a}" for i, a in members)
            derived.append((f"{dims} = {new}", arrays))
    return derived


def compare(actual: np.ndarray, expected: np.ndarray, context: str = "", *,
            atol: Tolerance | None = None, rtol: Tolerance | None = None,
            equal_nan: bool = True, signed_zeros: bool = False) -> float:
    """Assert ``actual`` matches ``expected`` (see the module docstring); return the max abs
    error over finite positions. The message says when NaN, infinities or the sign of a
    zero are the cause."""
    assert actual.shape == expected.shape, \
        f"{context}: shape {actual.shape} != {expected.shape}"
    assert actual.dtype == expected.dtype, \
        f"{context}: dtype {actual.dtype} != {expected.dtype}"
    abs_tol = tolerances.tolerance(atol, DEFAULT_ATOL, expected.dtype)
    rel_tol = tolerances.tolerance(rtol, DEFAULT_RTOL, expected.dtype)
    error = _max_abs_error(actual, expected)
    if not np.issubdtype(expected.dtype, np.inexact):
        mismatches = int(np.count_nonzero(actual != expected))
        assert mismatches == 0, (f"{context}: {mismatches} of {expected.size} values differ "
                                 f"(max abs error {error:.3g})")
        return error
    a64, e64 = actual.astype(np.float64), expected.astype(np.float64)
    nan_a, nan_e = np.isnan(a64), np.isnan(e64)
    if equal_nan:
        assert np.array_equal(nan_a, nan_e), (
            f"{context}: NaN positions differ ({int(nan_a.sum())} NaN in actual, "
            f"{int(nan_e.sum())} expected; first difference at "
            f"{tuple(int(i) for i in np.argwhere(nan_a != nan_e)[0])})")
    close = np.isclose(a64, e64, atol=abs_tol, rtol=rel_tol, equal_nan=equal_nan)
    if not close.all():
        bad = tuple(int(i) for i in np.argwhere(~close)[0])
        cause = ""
        if np.isnan(a64[bad]) or np.isnan(e64[bad]):
            cause = " (NaN involved; pass equal_nan=True to count NaN == NaN)"
        elif np.isinf(a64[bad]) or np.isinf(e64[bad]):
            cause = " (an infinity involved)"
        raise AssertionError(
            f"{context}: {int((~close).sum())} of {expected.size} values outside "
            f"atol={abs_tol:g} + rtol={rel_tol:g}*|expected|; first at {bad}: "
            f"{a64[bad]!r} vs {e64[bad]!r}{cause}; max abs error {error:.3g}")
    if signed_zeros:
        zeros = (e64 == 0) & (a64 == 0)
        wrong = zeros & (np.signbit(a64) != np.signbit(e64))
        assert not wrong.any(), (
            f"{context}: {int(wrong.sum())} zero(s) have the wrong sign; first at "
            f"{tuple(int(i) for i in np.argwhere(wrong)[0])}")
    return error


def _max_abs_error(actual: np.ndarray, expected: np.ndarray) -> float:
    """Max |actual - expected| over positions where both are finite (0 if none)."""
    a64, e64 = actual.astype(np.float64), expected.astype(np.float64)
    finite = np.isfinite(a64) & np.isfinite(e64)
    if not finite.any():
        return 0.0
    return float(np.max(np.abs(a64[finite] - e64[finite])))


def _native_form(pattern: Pattern[Any], form: str | Form | None) -> Form:
    if form is None:
        return pattern.native_form()
    if isinstance(form, Form):
        return form
    for spelling in pattern.spellings():
        if form in spelling.op_types:
            return spelling
    raise ValueError(f"pattern {pattern.name} has no spelling with op_type {form!r}")


def _registry_with(pattern: Pattern[Any]) -> Registry:
    registry = default_registry()
    if any(entry.pattern is pattern for entry in registry):
        return registry
    clone = registry.copy()
    clone.register(pattern, source="test", override=True)
    return clone
