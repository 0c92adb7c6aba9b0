"""Run every portability case on every inference engine installed, and tabulate the result.

In: nothing required. The cases are ``scripts/portability_cases.py``'s (every built-in
pattern's, including those each pattern's test module offers through its
``portability_cases()`` hook), each also
run as ONNX's own AffineGrid-20 node where it holds an AffineGrid, for comparison. Options:
``--engines`` (a subset of the configurations below), ``--cases`` (substrings of case ids),
``--json FILE`` (default ``bench-results/portability.json``), and the Python interpreters of
separate environments for the converters that cannot live beside the CPU torch pin:
``--onnx2torch-python`` (onnx2torch needs torchvision) and ``--onnx2tf-python`` (onnx2tf
needs TensorFlow and LiteRT); a converter is "not installed" unless it imports there.

Out: a markdown table on stdout (model x engine configuration: ``ok (max error)``,
``fails: <first error line>`` or ``wrong: ...``) headed by the engine versions, and the same
as JSON. Every decomposed model is compared with torch eager's outputs, never with another
engine's.

Configurations: ``ort``; ``openvino`` dynamic and ``openvino-static`` (reshaped to the
feeds' shapes), CPU with the f32 precision hint; ``tvm-static`` and ``tvm`` (dynamic) on
Relax/llvm; ``onnx2torch``; ``onnx2tf-flatbuffer_direct`` and ``onnx2tf-tf_converter``
(static shapes, inputs kept in their ONNX layout, run on the LiteRT interpreter).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import decomposer  # noqa: E402
from decomposer import engines  # noqa: E402
from decomposer.engines import first_error_line, with_static_inputs  # noqa: E402

# configuration -> (engine, static shapes)
IN_PROCESS = {
    "ort": ("ort", False),
    "openvino": ("openvino", False),
    "openvino-static": ("openvino", True),
    "tvm-static": ("tvm", True),
    "tvm": ("tvm", False),
}
CONVERTERS = ["onnx2torch", "onnx2tf-flatbuffer_direct", "onnx2tf-tf_converter"]
CONFIGS = [*IN_PROCESS, *CONVERTERS]
NATIVE_OPSET = 20  # AffineGrid became a standard op at opset 20

# Runs in the converter's own environment: argv = kind, folder, number of feed sets. For
# each set i the folder holds model_i.onnx (the same model for onnx2torch, shapes fixed to
# set i for onnx2tf) and feeds_i.npz; writes outputs_i.npz, or error.txt with the error
# text and stops.
_WORKER = textwrap.dedent("""
    import glob, os, sys, traceback
    import numpy as np
    kind, folder, count = sys.argv[1], sys.argv[2], int(sys.argv[3])

    def inputs_of(model):
        initialized = {t.name for t in model.graph.initializer}
        return [i.name for i in model.graph.input if i.name not in initialized]

    def run_onnx2torch(sets):
        import onnx, torch
        from onnx2torch import convert
        model = onnx.load(os.path.join(folder, "model_0.onnx"))
        names = inputs_of(model)
        module = convert(model).eval()
        for i, feeds in sets:
            with torch.no_grad():
                result = module(*[torch.from_numpy(feeds[n]) for n in names])
            if not isinstance(result, (list, tuple)):
                result = [result]
            yield i, [r.numpy() for r in result]

    def run_onnx2tf(sets):
        import onnx, onnx2tf
        backend = kind.split("-", 1)[1]
        try:
            from ai_edge_litert.interpreter import Interpreter
        except ImportError:
            from tensorflow.lite import Interpreter
        for i, feeds in sets:
            path = os.path.join(folder, f"model_{i}.onnx")
            model = onnx.load(path)
            names = inputs_of(model)
            work = os.path.join(folder, f"tf_{i}")
            onnx2tf.convert(input_onnx_file_path=path, output_folder_path=work,
                            non_verbose=True, tflite_backend=backend,
                            keep_shape_absolutely_input_names=names)
            found = sorted(glob.glob(os.path.join(work, "*_float32.tflite")))
            if not found:
                raise RuntimeError("onnx2tf wrote no *_float32.tflite")
            interpreter = Interpreter(model_path=found[0])
            runner = interpreter.get_signature_runner()
            signature = next(iter(interpreter.get_signature_list().values()))

            def key(name, keys):
                clean = name.replace(":", "_").replace("/", "_").replace(".", "_")
                for k in keys:
                    if k in (name, clean):
                        return k
                raise KeyError(f"no signature entry for {name!r} in {sorted(keys)}")
            result = runner(**{key(n, signature["inputs"]): feeds[n] for n in names})
            yield i, [np.asarray(result[key(o.name, result.keys())])
                      for o in model.graph.output]

    try:
        sets = [(i, dict(np.load(os.path.join(folder, f"feeds_{i}.npz"))))
                for i in range(count)]
        runner = run_onnx2torch if kind == "onnx2torch" else run_onnx2tf
        for i, outputs in runner(sets):
            np.savez(os.path.join(folder, f"outputs_{i}.npz"),
                     **{f"out{j}": o for j, o in enumerate(outputs)})
    except BaseException:
        with open(os.path.join(folder, "error.txt"), "w") as f:
            f.write(traceback.format_exc())
""")

_PROBE = {
    "onnx2torch": "import onnx2torch, torch, importlib.metadata as m; "
                  "print(m.version('onnx2torch'), 'torch', torch.__version__)",
    "onnx2tf": "import onnx2tf, importlib.metadata as m; print(m.version('onnx2tf'), "
               "'tensorflow', m.version('tensorflow'))",
}


def converter_version(python: str | None, name: str) -> str | None:
    """The converter's version in interpreter ``python``, or None if it does not import."""
    if not python:
        return None
    try:
        done = subprocess.run([python, "-c", _PROBE[name]], capture_output=True, text=True,
                              timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def converter_environment(python: str) -> dict[str, str]:
    """The environment of an activated virtualenv for ``python``: its bin folder first on
    PATH, since onnx2tf runs the ``onnxsim`` command it installs there."""
    bin_folder = os.path.dirname(os.path.abspath(python))
    return {**os.environ, "PATH": bin_folder + os.pathsep + os.environ.get("PATH", ""),
            "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}


def run_converter(python: str, kind: str, model: onnx.ModelProto,
                  feed_sets: Sequence[dict[str, np.ndarray]], timeout: float
                  ) -> list[list[np.ndarray]]:
    """Convert and run ``model`` on every feed set in another environment (one process);
    the outputs per set, or RuntimeError holding the converter's last error line."""
    with tempfile.TemporaryDirectory(prefix="portability-") as folder:
        work = Path(folder)
        for index, feeds in enumerate(feed_sets):
            # LiteRT needs static shapes: onnx2tf converts once per feed set's shapes.
            fixed = with_static_inputs(model, feeds) if kind.startswith("onnx2tf") else model
            onnx.save(fixed, work / f"model_{index}.onnx")
            np.savez(work / f"feeds_{index}.npz", **feeds)
        (work / "worker.py").write_text(_WORKER)
        try:
            done = subprocess.run([python, str(work / "worker.py"), kind, str(work),
                                   str(len(feed_sets))], capture_output=True, text=True,
                                  timeout=timeout, env=converter_environment(python))
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"timed out after {timeout:.0f} s") from None
        error = work / "error.txt"
        if error.exists():
            lines = error.read_text().strip().splitlines()
            raise RuntimeError(lines[-1] if lines else "failed")
        results = []
        for index in range(len(feed_sets)):
            path = work / f"outputs_{index}.npz"
            if not path.exists():
                raise RuntimeError(first_error_line(done.stderr[-2000:]) or
                                   f"worker exited {done.returncode}")
            with np.load(path) as saved:
                results.append([saved[f"out{j}"] for j in range(len(saved.files))])
        return results


def native_variant(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """``model`` with every custom AffineGrid made ONNX's own AffineGrid-20 (opset raised
    to 20, GridSample's mode renamed as GridSample-20 spells it); None if it has none."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    found = False

    def visit(graph: onnx.GraphProto) -> None:
        nonlocal found
        for node in graph.node:
            if node.op_type == "AffineGrid" and node.domain not in ("", "ai.onnx"):
                node.domain = ""
                found = True
            if node.op_type == "GridSample":
                for attribute in node.attribute:
                    if attribute.name == "mode":
                        attribute.s = {b"bilinear": b"linear", b"bicubic": b"cubic"}.get(
                            attribute.s, attribute.s)
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    visit(attribute.g)

    visit(copy.graph)
    if not found:
        return None
    imports = [i for i in copy.opset_import if i.domain not in ("", "ai.onnx", "custom.ops")]
    del copy.opset_import[:]
    copy.opset_import.extend([onnx.helper.make_opsetid("", NATIVE_OPSET), *imports])
    copy.ir_version = max(copy.ir_version, 9)
    return copy


def evaluate(config: str, case: Any, model: onnx.ModelProto, converters: dict[str, str],
             timeout: float) -> dict[str, Any]:
    """One cell: {"status": ok|fails|wrong|not installed, "detail", "max_error"}."""
    try:
        if config in IN_PROCESS:
            engine, static = IN_PROCESS[config]
            if not engines.available(engine):
                return {"status": "not installed", "detail": engines.ENGINES[engine].package}
            results = [engines.run_model(engine, model, feeds, static_shapes=static)
                       for feeds in case.feeds]
        else:
            python = converters.get(config.split("-")[0])
            if not python:
                return {"status": "not installed", "detail": config.split("-")[0]}
            results = run_converter(python, config, model, case.feeds, timeout)
    except Exception as error:  # engine failures are the data here
        return {"status": "fails", "detail": first_error_line(str(error))[:160]
                or type(error).__name__}
    worst, notes = 0.0, set()
    for got, expected in zip(results, case.expected, strict=True):
        if len(got) != len(expected):
            return {"status": "wrong", "detail": f"{len(got)} outputs, torch has "
                                                 f"{len(expected)}"}
        for actual, wanted in zip(got, expected, strict=True):
            if actual.shape != wanted.shape and config.startswith("onnx2tf") \
                    and wanted.ndim in (4, 5) \
                    and actual.shape == np.moveaxis(wanted, 1, -1).shape:
                # onnx2tf's convention: image-like outputs come out channels-last.
                wanted = np.moveaxis(wanted, 1, -1)
                notes.add("channels-last output")
            if actual.shape != wanted.shape:
                return {"status": "wrong", "detail": f"shape {list(actual.shape)}, torch "
                                                     f"{list(wanted.shape)}"}
            error = float(np.max(np.abs(actual.astype(np.float64) -
                                        wanted.astype(np.float64)), initial=0.0))
            if not np.isfinite(error) or error > case.atol:
                return {"status": "wrong", "detail": f"max error {error:.3g}",
                        "max_error": error}
            worst = max(worst, error)
    return {"status": "ok", "max_error": worst, "detail": ", ".join(sorted(notes))}


def cell_text(cell: dict[str, Any]) -> str:
    if cell["status"] == "ok":
        note = f", {cell['detail']}" if cell.get("detail") else ""
        return f"ok ({cell['max_error']:.1e}{note})"
    if cell["status"] == "not installed":
        return "not installed"
    detail = str(cell.get("detail", "")).replace("|", "\\|")
    return f"**{cell['status']}**: {detail}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--engines", nargs="+", choices=CONFIGS, default=CONFIGS)
    parser.add_argument("--cases", nargs="+", help="substrings of case ids to run")
    parser.add_argument("--no-native", action="store_true",
                        help="skip the ONNX AffineGrid-20 comparison rows")
    parser.add_argument("--onnx2torch-python", default=sys.executable,
                        help="interpreter of an environment with onnx2torch")
    parser.add_argument("--onnx2tf-python", default=sys.executable,
                        help="interpreter of an environment with onnx2tf and LiteRT")
    parser.add_argument("--timeout", type=float, default=600,
                        help="seconds per converter run")
    parser.add_argument("--json", default=str(ROOT / "bench-results" / "portability.json"))
    args = parser.parse_args(argv)

    import portability_cases  # the case catalogue (needs torch, for the oracle)

    cases = list(portability_cases.all_cases())
    if args.cases:
        cases = [c for c in cases if any(s.lower() in c.id.lower() for s in args.cases)]

    versions: dict[str, str] = {"decomposer": decomposer.__version__,
                                "onnx": onnx.__version__}
    for name in engines.ENGINES:
        versions[name] = engines.engine_version(name) if engines.available(name) \
            else "not installed"
    converters: dict[str, str] = {}
    for name, python in (("onnx2torch", args.onnx2torch_python),
                         ("onnx2tf", args.onnx2tf_python)):
        version = converter_version(python, name) if any(
            c.startswith(name) for c in args.engines) else None
        versions[name] = version or "not installed"
        if version:
            converters[name] = python

    rows: list[dict[str, Any]] = []
    for case in cases:
        variants = [("decomposed", decomposer.decompose(case.model, lower=case.lower))]
        # A lowering case's native row would repeat its plain case's.
        native = None if args.no_native or case.lower else native_variant(case.model)
        if native is not None:
            variants.append(("ONNX AffineGrid-20", native))
        for label, model in variants:
            row = {"case": case.id, "model": label, "cells": {}}
            for config in args.engines:
                row["cells"][config] = evaluate(config, case, model, converters, args.timeout)
                print(f"  {case.id} [{label}] {config}: {cell_text(row['cells'][config])}",
                      file=sys.stderr, flush=True)
            rows.append(row)

    print("Engines: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    print()
    print("| model | " + " | ".join(args.engines) + " |")
    print("|---|" + "---|" * len(args.engines))
    for row in rows:
        name = row["case"] if row["model"] == "decomposed" else \
            f"{row['case']}, {row['model']}"
        print(f"| {name} | " + " | ".join(cell_text(row["cells"][c]) for c in args.engines)
              + " |")
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"versions": versions, "configs": args.engines, "rows": rows},
                               indent=1) + "\n")
    print(f"\nwrote {path}", file=sys.stderr)
    bad = [r for r in rows if r["model"] == "decomposed" and any(
        c["status"] in ("fails", "wrong") for c in r["cells"].values())]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
