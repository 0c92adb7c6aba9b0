"""ONNX's backend node tests taken down to older opsets: the oracle for ``--target-opset``.

In: the backend node test cases that ship inside the ``onnx`` package (model, inputs and
expected outputs, written by ONNX, not by us) and target opsets (default 17, 13, 11).
Out: for every in-scope case above a target, one outcome: ``exact`` (decomposer's output
passes ``onnx.checker.check_model(full_check=True)``, uses only ops defined at the target
and reproduces the expected outputs on ONNX Runtime within the case's own tolerance),
``refused`` (exit 3 naming what the target cannot say), ``wrong``, ``ort-error`` or
``error``; with ``--converter``, the same for ``onnx.version_converter.convert_version``.

In scope: numeric, deterministic, non-training cases of the default domain (every opset
import and node in it; tensor inputs and outputs, no strings; no random ops), at each
target whose IR can carry their input and output types (float8/int4/... need opset 19+).

    python scripts/backend_opsets.py                       # the summary table
    python scripts/backend_opsets.py --targets 13 --list refused
    python scripts/backend_opsets.py --converter           # onnx's own converter, beside
"""

from __future__ import annotations

import argparse
import collections
import sys
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

RANDOM_OPS = frozenset({"Bernoulli", "Multinomial", "RandomNormal", "RandomNormalLike",
                        "RandomUniform", "RandomUniformLike"})
# Ops whose outputs depend on more than their inputs, or that decode images.
NONDETERMINISTIC = frozenset({"ImageDecoder"})


@dataclass(frozen=True)
class Outcome:
    case: str
    source: int
    target: int
    # exact, refused, wrong, ort-error, error; ort-differs: ONNX Runtime does not reproduce
    # the case at its own opset either (ORT's kernel, not the rewrite)
    status: str
    detail: str = ""


def cases() -> list[Any]:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return list(collect_testcases(None))


def default_opset(model: onnx.ModelProto) -> int | None:
    return next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")),
                None)


def _tensor_only(values: Iterable[onnx.ValueInfoProto]) -> bool:
    for value in values:
        if not value.type.HasField("tensor_type"):
            return False
        if value.type.tensor_type.elem_type == onnx.TensorProto.STRING:
            return False
    return True


# Element types from float8 on (float8, int4/uint4, float4, int2/uint2, float6) need IR 9
# or newer, which opsets before 19 cannot carry: a case whose inputs or outputs are of such
# a type has no model at those targets at all, so it is out of scope there.
FIRST_EXOTIC_TYPE = onnx.TensorProto.FLOAT8E4M3FN


def representable(case: Any, target: int) -> bool:
    """Whether the case's inputs and outputs have types a model at ``target`` can carry."""
    if target >= 19:
        return True
    return all(v.type.tensor_type.elem_type < FIRST_EXOTIC_TYPE
               for v in [*case.model.graph.input, *case.model.graph.output])


def in_scope(case: Any) -> bool:
    model = case.model
    if case.kind != "node" or not case.data_sets:
        return False
    if any(o.domain not in ("", "ai.onnx") for o in model.opset_import):
        return False
    nodes = list(model.graph.node)
    if any(n.domain not in ("", "ai.onnx") for n in nodes):
        return False
    if any(n.op_type in RANDOM_OPS | NONDETERMINISTIC for n in nodes):
        return False
    if "training" in case.name or default_opset(model) is None:
        return False
    return _tensor_only(model.graph.input) and _tensor_only(model.graph.output)


def _close(actual: np.ndarray, expected: np.ndarray, rtol: float, atol: float) -> str:
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.shape != expected.shape:
        return f"shape {actual.shape} != {expected.shape}"
    if actual.dtype != expected.dtype:
        return f"dtype {actual.dtype} != {expected.dtype}"
    if expected.dtype.kind in "fc":
        if not np.allclose(actual, expected, rtol=rtol, atol=atol, equal_nan=True):
            error = np.nanmax(np.abs(actual.astype(np.float64) - expected.astype(np.float64)))
            return f"max error {error:.3g}"
        return ""
    if not np.array_equal(actual, expected):
        return "values differ"
    return ""


def _array(value: Any) -> np.ndarray:
    if isinstance(value, onnx.TensorProto):
        from onnx import numpy_helper

        return numpy_helper.to_array(value)
    return np.asarray(value)


def run_ort(model: onnx.ModelProto, case: Any) -> str:
    """'' when ONNX Runtime reproduces every data set of ``case`` with ``model``."""
    import onnxruntime as ort

    ort.set_default_logger_severity(3)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(model.SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - the outcome records it
        return "ort-error: " + " ".join(str(exc).split())[:200]
    names = [i.name for i in model.graph.input]
    for inputs, expected in case.data_sets:
        feeds = {name: _array(value) for name, value in zip(names, inputs, strict=False)}
        try:
            actual = session.run(None, feeds)
        except Exception as exc:  # noqa: BLE001
            return "ort-error: " + " ".join(str(exc).split())[:200]
        for got, want in zip(actual, expected, strict=False):
            problem = _close(got, _array(want), case.rtol, case.atol)
            if problem:
                return "wrong: " + problem
    return ""


_ORIGINAL: dict[str, str] = {}


def _original_on_ort(case: Any) -> str:
    """'' when ONNX Runtime reproduces ``case`` with its own model, at its own opset."""
    if case.name not in _ORIGINAL:
        _ORIGINAL[case.name] = run_ort(case.model, case)
    return _ORIGINAL[case.name]


def only_target_ops(model: onnx.ModelProto, target: int) -> str:
    from decomposer.graphs import all_nodes, has_schema

    for node in all_nodes(model.graph):
        if node.domain in ("", "ai.onnx") and not has_schema(node.op_type, target, ""):
            return f"wrong: {node.op_type} is not defined at opset {target}"
    return ""


def outcome(case: Any, target: int, converter: bool = False) -> Outcome:
    import decomposer

    source = default_opset(case.model) or 0
    try:
        if converter:
            from onnx import version_converter

            out = version_converter.convert_version(case.model, target)
        else:
            out = decomposer.decompose(case.model, target_opset=target)
    except decomposer.UnsupportedNodeError as exc:
        return Outcome(case.name, source, target, "refused", " ".join(str(exc).split()))
    except Exception as exc:  # noqa: BLE001
        return Outcome(case.name, source, target, "error",
                       f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
    try:
        onnx.checker.check_model(out, full_check=True)
    except Exception as exc:  # noqa: BLE001
        return Outcome(case.name, source, target, "error",
                       "checker: " + " ".join(str(exc).split())[:300])
    problem = only_target_ops(out, target) or run_ort(out, case)
    if problem and "is not defined at opset" not in problem:
        original = _original_on_ort(case)
        if original:
            return Outcome(case.name, source, target, "ort-differs",
                           f"{problem}; the original: {original}")
    if problem:
        status, _, detail = problem.partition(": ")
        return Outcome(case.name, source, target, status, detail)
    return Outcome(case.name, source, target, "exact")


def measure(targets: Sequence[int], converter: bool = False,
            names: Iterable[str] | None = None) -> list[Outcome]:
    wanted = set(names) if names is not None else None
    results = []
    for case in cases():
        if not in_scope(case) or (wanted is not None and case.name not in wanted):
            continue
        for target in targets:
            if (default_opset(case.model) or 0) > target and representable(case, target):
                results.append(outcome(case, target, converter))
    return results


def summary(results: Sequence[Outcome]) -> str:
    """One row per target and one for all: counts per outcome, the share exact, and the
    share exact among the runs whose original ONNX Runtime reproduces."""
    columns = ("exact", "refused", "wrong", "ort-error", "error", "ort-differs")
    lines = ["| target | runs | " + " | ".join(columns) + " | exact % | exact % where ORT "
             "runs the original |", "|---|---|" + "---|" * len(columns) + "---|---|"]
    groups = [(str(t), [r for r in results if r.target == t])
              for t in sorted({r.target for r in results}, reverse=True)]
    for label, mine in [*groups, ("all", list(results))]:
        count = collections.Counter(r.status for r in mine)
        fair = len(mine) - count["ort-differs"]
        lines.append(f"| {label} | {len(mine)} | " + " | ".join(str(count[c]) for c in columns)
                     + f" | {100 * count['exact'] / max(len(mine), 1):.1f} | "
                     f"{100 * count['exact'] / max(fair, 1):.1f} |")
    return "\n".join(lines)


def refusals_by_op(results: Sequence[Outcome]) -> str:
    """The refused runs grouped by the op of the first node named, with one reason."""
    import re

    groups: dict[str, list[Outcome]] = collections.defaultdict(list)
    for result in results:
        if result.status != "refused":
            continue
        found = re.search(r"::([A-Za-z0-9_]+)\)", result.detail)
        groups[found.group(1) if found else "?"].append(result)
    lines = ["| op | runs refused | one reason |", "|---|---|---|"]
    for op_type, group in sorted(groups.items(), key=lambda item: (-len(item[1]), item[0])):
        reason = group[0].detail.split(": ", 2)[-1].split("; node '")[0]
        lines.append(f"| {op_type} | {len(group)} | {reason[:160]} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="17,13,11")
    parser.add_argument("--converter", action="store_true",
                        help="measure onnx.version_converter instead of decomposer")
    parser.add_argument("--by-op", action="store_true",
                        help="also print the refused runs grouped by op")
    parser.add_argument("--list", default="", metavar="STATUS[,STATUS]",
                        help="also list the runs with these outcomes")
    args = parser.parse_args(argv)
    targets = [int(t) for t in args.targets.split(",")]
    results = measure(targets, converter=args.converter)
    print(summary(results))
    if args.by_op:
        print()
        print(refusals_by_op(results))
    shown = set(filter(None, args.list.split(",")))
    for result in results:
        if result.status in shown:
            print(f"{result.status}\t{result.case}\t{result.source}->{result.target}\t"
                  f"{result.detail[:400]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
