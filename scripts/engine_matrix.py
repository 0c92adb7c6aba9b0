"""Measure every engine on the probes and the zoo, before and after ``--target ENGINE``, and
write what was measured: the edge engines' gap rows and profiles in
decomposer/data/engine_support.json, and the matrix in docs/portability.md.

In: the engines installed (ONNX Runtime, OpenVINO and TVM in this interpreter; OpenCV DNN,
ncnn via pnnx, MNN, tract and RKNN's simulator each in its own venv,
``EDGE/ENGINE/venv/bin/python``, set up as ../shared/engines.md says; ``--edge DIR``,
default ``$EDGE_ENGINES_DIR`` or /work/engines). Options: ``--engines`` (a subset),
``--probes`` / ``--zoo`` / ``--shipped`` (only that phase; the real models packages ship,
scripts/shipped.py), ``--write`` (update the data file and the docs
section from this run), ``--json FILE`` (default bench-results/engine_matrix.json).

Out: per probe (scripts/engine_probes.py: one op, one condition) and engine, ``ok``,
``wrong`` (max error) or ``fails: <the engine's first error line>``; for each failing
probe, the first fix that makes it exact on that engine, tried in order: the op's
lowering pattern (``--lower OP``), taking the model below each version of the op, highest
first (``take_down: N``, where decomposer.opsets rewrites it in its older form or without
it), folding static shape arithmetic (``fold``), and both the lowering and the folding
(``lower+fold``: pnnx turns shape arithmetic into expressions ncnn cannot load). Per zoo model
(scripts/zoo.py) or shipped model (scripts/shipped.py) and engine: the cell as exported
and after ``--target ENGINE`` (with the input flags check names for it, such as
``--freeze-input sr=16000``, given the values fed). The
reference is ONNX Runtime on the model as exported; a cell is exact within 1e-3 (2e-2 for
RKNN, whose simulator computes in float16).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import decomposer  # noqa: E402
from decomposer import engines as in_process  # noqa: E402
from decomposer.engine_support import dynamic_inputs  # noqa: E402
from decomposer.engines import first_error_line  # noqa: E402

IN_PROCESS = ("ort", "openvino", "tvm")
EDGE = ("opencv", "ncnn", "mnn", "tract", "rknn")
TOLERANCE = {"rknn": 2e-2}
DEFAULT_TOLERANCE = 1e-3
DATA = ROOT / "decomposer" / "data" / "engine_support.json"
DOCS = ROOT / "docs" / "portability.md"
MARK = ("<!-- engine-matrix:begin (scripts/engine_matrix.py --write) -->",
        "<!-- engine-matrix:end -->")
SHIPPED_MARK = ("<!-- shipped-matrix:begin (scripts/engine_matrix.py --shipped --write) -->",
                "<!-- shipped-matrix:end -->")


def run(engine: str, model: onnx.ModelProto, feeds: dict[str, np.ndarray], edge: Path
        ) -> list[np.ndarray]:
    """The model's outputs on ``engine``; RuntimeError(one line) when it fails."""
    if engine in IN_PROCESS:
        try:
            return in_process.run_model(engine, model, feeds, static_shapes=True)
        except Exception as exc:  # noqa: BLE001 - a cell records any failure
            raise RuntimeError(first_error_line(str(exc)) or type(exc).__name__) from None
    import edge_runner

    os.environ["EDGE_ENGINES_DIR"] = str(edge)
    edge_runner.ENGINES_DIR = str(edge)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        onnx.save(model, path)
        return list(edge_runner.run(engine, str(path), feeds, timeout=300.0))


def cell(engine: str, model: onnx.ModelProto, feeds: dict[str, np.ndarray],
         want: list[np.ndarray], edge: Path) -> dict[str, Any]:
    try:
        got = run(engine, model, feeds, edge)
    except RuntimeError as exc:
        return {"status": "fails", "detail": str(exc)}
    if len(got) < len(want):
        return {"status": "fails", "detail": f"{len(got)} outputs for {len(want)}"}
    error = 0.0
    for value, expected in zip(got, want, strict=False):
        value = np.asarray(value)
        if value.size != expected.size:
            return {"status": "wrong", "detail": f"shape {list(value.shape)} for "
                                                 f"{list(expected.shape)}"}
        a = value.reshape(expected.shape).astype(np.float64)
        b = expected.astype(np.float64)
        if a.dtype == bool or b.dtype == bool:
            a, b = a.astype(np.float64), b.astype(np.float64)
        same_nan = np.isnan(a) == np.isnan(b)
        if not same_nan.all():
            return {"status": "wrong", "detail": "NaN where the reference has none"}
        diff = np.abs(np.nan_to_num(a) - np.nan_to_num(b))
        error = max(error, float(diff.max()) if diff.size else 0.0)
    ok = error <= TOLERANCE.get(engine, DEFAULT_TOLERANCE)
    return {"status": "ok" if ok else "wrong", "error": error}


def _reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return in_process.run_model("ort", model, feeds)


def fixes(probe: Any, model: onnx.ModelProto, feeds: dict[str, np.ndarray]
          ) -> list[tuple[str, onnx.ModelProto]]:
    """(fix, model) candidates for a probe an engine fails, in the order they are tried;
    folding fixes the inputs at the probe's sizes, as ``--overwrite-input-shape`` would."""
    found = []
    try:
        found.append(("lower", decomposer.decompose(model, lower=[probe.op])))
    except decomposer.DecomposerError:
        pass
    for below in _boundaries(probe.op, model):
        try:
            found.append((f"take_down:{below}", decomposer.decompose(model, target_opset=below)))
        except decomposer.DecomposerError:
            pass
    static = {value.name: list(feeds[value.name].shape) for value in model.graph.input
              if value.name in feeds}
    for name, lower in (("fold", []), ("lower+fold", [probe.op])):
        try:
            found.append((name, decomposer.decompose(model, input_shapes=static,
                                                     lower=lower)))
        except decomposer.DecomposerError:
            pass
    return found


def _boundaries(op: str, model: onnx.ModelProto) -> list[int]:
    """The opsets just below each version of ``op`` at or below the model's, highest first
    (taking the model there rewrites the op in its older form, or without it), from 11."""
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    found = []
    while opset >= 12:
        try:
            since = int(onnx.defs.get_schema(op, opset, "").since_version)
        except onnx.defs.SchemaError:
            break
        if since - 1 < 11:
            break
        found.append(since - 1)
        opset = since - 1
    return found


def probe_phase(engines: list[str], edge: Path) -> list[dict[str, Any]]:
    from engine_probes import PROBES

    caps = {name: profile.get("max_opset") for name, profile in
            json.loads(DATA.read_text(encoding="utf-8"))["profiles"].items()}
    rows = []
    for probe in PROBES:
        source, feeds = probe.build()
        want = _reference(source, feeds)
        for engine in engines:
            # an engine with an opset cap sees the probe taken down to it (the cap itself
            # is its profile's max_opset, not a gap of the op)
            model = source
            cap = caps.get(engine)
            opset = next(o.version for o in source.opset_import if o.domain in ("", "ai.onnx"))
            if cap and opset > cap:
                try:
                    model = decomposer.decompose(source, target_opset=cap)
                except decomposer.DecomposerError as exc:
                    print(f"{probe.label:34} {engine:9} n/a: {exc}", flush=True)
                    continue
            candidates = None
            result = cell(engine, model, feeds, want, edge)
            row = {"probe": probe.label, "op": probe.op, "when": probe.when,
                   "engine": engine, "dynamic": bool(dynamic_inputs(model)), **result}
            if result["status"] != "ok":
                candidates = candidates if candidates is not None else \
                    fixes(probe, model, feeds)
                for name, fixed in candidates:
                    if cell(engine, fixed, feeds, want, edge)["status"] == "ok":
                        row["fix"] = name
                        break
            print(f"{probe.label:34} {engine:9} {_text(row)}", flush=True)
            rows.append(row)
    return rows


def zoo_phase(engines: list[str], edge: Path) -> list[dict[str, Any]]:
    from zoo import ZOO

    return model_phase(ZOO, engines, edge)


def shipped_phase(engines: list[str], edge: Path) -> list[dict[str, Any]]:
    from shipped import SHIPPED

    return model_phase(SHIPPED, engines, edge)


def suggested_flags(model: onnx.ModelProto, engine: str, feeds: dict[str, np.ndarray]
                    ) -> dict[str, Any]:
    """The input flags ``decomposer check --engines ENGINE`` names for the model, with the
    values a user knows (the ones they feed): ``--freeze-input`` for an input whose value
    decides an If, ``--overwrite-input-shape`` for one whose shape does."""
    from decomposer.engine_support import engine_gaps

    freeze: dict[str, np.ndarray] = {}
    shapes: dict[str, list[int | str]] = {}
    for gap in engine_gaps(model, [engine])[engine]:
        freeze.update({name: feeds[name] for name in gap.get("freeze", ()) if name in feeds})
        shapes.update({name: list(feeds[name].shape) for name in gap.get("shape", ())
                       if name in feeds})
    return {key: value for key, value in (("freeze_inputs", freeze), ("input_shapes", shapes))
            if value}


def _flag_text(flags: dict[str, Any]) -> list[str]:
    return [f"--freeze-input {name}={np.asarray(value).tolist()}"
            for name, value in flags.get("freeze_inputs", {}).items()] + \
        [f"--overwrite-input-shape {name}:{','.join(map(str, dims))}"
         for name, dims in flags.get("input_shapes", {}).items()]


def model_phase(models: dict[str, Any], engines: list[str], edge: Path
                ) -> list[dict[str, Any]]:
    """Each model on each engine as it comes and after ``--target ENGINE``, with the input
    flags ``decomposer check`` names for it (:func:`suggested_flags`)."""
    rows = []
    for name, build in models.items():
        model, feeds = build()
        want = _reference(model, feeds)
        for engine in engines:
            before = cell(engine, model, feeds, want, edge)
            flags = suggested_flags(model, engine, feeds)
            # a frozen input is no longer fed
            fixed_feeds = {k: v for k, v in feeds.items()
                           if k not in flags.get("freeze_inputs", {})}
            try:
                fixed, report = decomposer.decompose_with_report(model, target=engine, **flags)
                after = cell(engine, fixed, fixed_feeds, want, edge)
                changed = report.changed
            except decomposer.DecomposerError as exc:
                after = {"status": "refused", "detail": str(exc).splitlines()[0]}
                changed = False
            rows.append({"model": name, "engine": engine, "before": before, "after": after,
                         "changed": changed, "predicted": predicted_failure(model, engine),
                         "flags": _flag_text(flags)})
            print(f"{name:16} {engine:9} {_text(before):40} -> {_text(after)} "
                  f"{' '.join(_flag_text(flags))}", flush=True)
    return rows


def predicted_failure(model: onnx.ModelProto, engine: str) -> list[str]:
    """What ``decomposer check --engines ENGINE`` names for the model as exported (its
    gaps, an opset above the engine's cap among them)."""
    from decomposer.engine_support import engine_gaps

    return [gap["op"] for gap in engine_gaps(model, [engine])[engine]]


def _text(result: dict[str, Any]) -> str:
    status = result["status"]
    fix = f" [fix: {result['fix']}]" if result.get("fix") else ""
    if status == "ok":
        return f"ok ({result['error']:.1e})"
    if status == "wrong" and "error" in result:
        return f"wrong ({result['error']:.2g}){fix}"
    return f"{status}: {result.get('detail', '')[:90]}{fix}"


def gap_rows(probes: list[dict[str, Any]], engines: list[str],
             previous: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The data file's rows for the measured engines: one per failing probe (ONNX Runtime,
    the reference, has none). ``static`` (the fix needs static input sizes): a fold that
    fixed a probe with dynamic inputs; for a lowering, the pattern's own need (a sequence
    length to unroll), kept from the ``previous`` rows of the same gap."""
    kept_static = {(r["engine"], r["op"], r.get("when")) for r in previous or ()
                   if r.get("static")}
    rows = []
    seen = set()
    for row in probes:
        if row["engine"] == "ort" or row["engine"] not in engines or row["status"] == "ok":
            continue
        key = (row["engine"], row["op"], row["when"])
        if key in seen:  # another spelling of a gap already written
            continue
        seen.add(key)
        entry: dict[str, Any] = {"engine": row["engine"], "op": row["op"]}
        if row["when"]:
            entry["when"] = row["when"]
        fix = row.get("fix")
        entry["lower"] = row["op"] if fix in ("lower", "lower+fold") else None
        if fix and fix.startswith("take_down:"):
            entry["take_down"] = int(fix.split(":")[1])
        if fix in ("fold", "lower+fold"):
            entry["fold"] = True
        if (fix in ("fold", "lower+fold") and row.get("dynamic")) or \
                (fix == "lower" and key in kept_static):
            entry["static"] = True
        if row["status"] == "wrong":
            entry["kind"] = "wrong"
            detail = f"max error {row['error']:.2g}" if "error" in row else row["detail"]
            entry["evidence"] = f"measured: other numbers than ONNX Runtime ({detail})"
        else:  # (the temporary folder a model was written to is no evidence)
            detail = re.sub(r"(the model )?'?/tmp/\S*?model\.onnx'?", "the model", row["detail"])
            entry["evidence"] = f"measured: {detail}"
        rows.append(entry)
    return rows


RUN_HERE = ("ort", *IN_PROCESS[1:], *EDGE)  # the engines this script runs


def majority_wrong(gaps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The gaps most engines run here get wrong, silently (rows of kind ``wrong``): what
    ``--target portable`` lowers too."""
    wrong: dict[tuple[str, str | None], list[str]] = {}
    for row in gaps:
        if row.get("kind") == "wrong" and row["engine"] in RUN_HERE and row.get("lower"):
            wrong.setdefault((row["op"], row.get("when")), []).append(row["engine"])
    rows = []
    for (op, when), engines in sorted(wrong.items(), key=lambda kv: kv[0][0]):
        if 2 * len(set(engines)) > len(RUN_HERE):
            right = [e for e in RUN_HERE if e not in engines]
            entry: dict[str, Any] = {"engine": ",".join(sorted(set(engines))), "op": op}
            if when:
                entry["when"] = when
            entry["lower"] = op
            entry["evidence"] = (f"measured: {len(set(engines))} of the {len(RUN_HERE)} "
                                 f"engines run here compute it with other numbers "
                                 f"({', '.join(sorted(set(engines)))}; right: "
                                 f"{', '.join(right)})")
            rows.append(entry)
    return rows


def write_data(probes: list[dict[str, Any]], engines: list[str]) -> None:
    """The edge engines' rows replaced by this run's; an in-process engine (OpenVINO, TVM)
    keeps its rows (tests/test_engine_support.py measures each again) and gains the ones
    this run found that it lacks."""
    data = json.loads(DATA.read_text(encoding="utf-8"))
    measured = [e for e in engines if e != "ort"]
    kept = [row for row in data["gaps"] if row["engine"] not in EDGE or
            row["engine"] not in measured]
    keys = {(row["engine"], row["op"], row.get("when")) for row in kept}
    # a conditional row adds nothing where the engine's unconditional row of the op is kept
    data["gaps"] = kept + [row for row in gap_rows(probes, engines, data["gaps"])
                           if (row["engine"], row["op"], row.get("when")) not in keys and
                           (row["engine"], row["op"], None) not in keys]
    data["majority_wrong"] = majority_wrong(data["gaps"])
    for engine in measured:
        profile = data["profiles"].setdefault(engine, {})
        # the target folds every model only for a gap that is not fixed by static sizes:
        # --overwrite-input-shape folds on its own, and folding a dynamic model for tract
        # broke four shipped models' Convs ("Failed analyse ... ConvHir", measured)
        if any(r.get("fold") and not r.get("static") for r in gap_rows(probes, [engine])):
            profile["fold"] = True
    DATA.write_text(dump(data), encoding="utf-8")


def dump(data: dict[str, Any]) -> str:
    """engine_support.json as the project keeps it: one row per line."""
    lines = ["{"]
    for index, (key, value) in enumerate(data.items()):
        comma = "," if index < len(data) - 1 else ""
        if isinstance(value, list):
            lines.append(f"  {json.dumps(key)}: [")
            lines += [f"    {json.dumps(row, ensure_ascii=False)}"
                      + ("," if i < len(value) - 1 else "") for i, row in enumerate(value)]
            lines.append(f"  ]{comma}")
        elif isinstance(value, dict):
            lines.append(f"  {json.dumps(key)}: {{")
            items = list(value.items())
            lines += [f"    {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}"
                      + ("," if i < len(items) - 1 else "") for i, (k, v) in enumerate(items)]
            lines.append(f"  }}{comma}")
        else:
            lines.append(f"  {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}{comma}")
    return "\n".join(lines + ["}"]) + "\n"


def matrix_markdown(zoo: list[dict[str, Any]], versions: dict[str, str]) -> str:
    engines = list(dict.fromkeys(r["engine"] for r in zoo))
    models = list(dict.fromkeys(r["model"] for r in zoo))
    by = {(r["model"], r["engine"]): r for r in zoo}

    def short(result: dict[str, Any]) -> str:
        if result["status"] == "ok":
            return "ok"
        if result["status"] == "wrong":
            return f"**wrong** ({result['error']:.2g})" if "error" in result else "**wrong**"
        return f"**{result['status']}**"

    lines = ["Measured by `python scripts/engine_matrix.py --write` "
             f"({time.strftime('%Y-%m-%d')}): " + ", ".join(f"{e} {versions.get(e, '')}"
                                                            for e in engines) + ".",
             "Each cell: as exported -> after `--target ENGINE` (`=` when the target "
             "changed nothing). ok: within 1e-3 of ONNX Runtime on the export (2e-2 for "
             "RKNN's float16 simulator).", "",
             "| model | " + " | ".join(engines) + " |",
             "|---|" + "---|" * len(engines)]
    for model in models:
        cells = []
        for engine in engines:
            row = by.get((model, engine))
            if row is None:
                cells.append("")
                continue
            after = "=" if not row["changed"] and row["after"]["status"] != "refused" \
                else short(row["after"])
            cells.append(f"{short(row['before'])} -> {after}")
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    before = sum(r["before"]["status"] == "ok" for r in zoo)
    after = sum((r["after"]["status"] == "ok") for r in zoo)
    failing = [r for r in zoo if r["before"]["status"] != "ok"]
    passing = [r for r in zoo if r["before"]["status"] == "ok"]
    caught = sum(bool(r.get("predicted")) for r in failing)
    flagged = sum(bool(r.get("predicted")) for r in passing)
    with_flags = [r for r in zoo if r.get("flags")]
    if with_flags:
        lines += ["", "With `--target ENGINE`, the input flags `decomposer check --engines "
                  "ENGINE` names (values: what the package feeds): " +
                  "; ".join(f"{r['model']} on {r['engine']}: " +
                            " ".join(f"`{flag}`" for flag in r["flags"])
                            for r in with_flags) + "."]
    lines += ["", f"Exact cells: {before} of {len(zoo)} as exported, {after} of {len(zoo)} "
              "after `--target ENGINE`.",
              f"`decomposer check --engines` on the exports: it names a gap in {caught} of the "
              f"{len(failing)} failing cells and in {flagged} of the {len(passing)} passing "
              "ones.", "", "Cells that are not exact after the target, with the engine's own "
              "error:", ""]
    for r in zoo:
        if r["after"]["status"] != "ok":
            lines.append(f"- {r['model']} on {r['engine']}: {_text(r['after'])}")
    return "\n".join(lines) + "\n"


def write_docs(zoo: list[dict[str, Any]], versions: dict[str, str],
               mark: tuple[str, str] = MARK,
               heading: str = "Engine matrix: the zoo before and after --target") -> None:
    text = DOCS.read_text(encoding="utf-8")
    table = matrix_markdown(zoo, versions)
    if mark[0] in text:
        head, rest = text.split(mark[0], 1)
        tail = rest.split(mark[1], 1)[1]
        text = f"{head}{mark[0]}\n{table}{mark[1]}{tail}"
    else:
        text += f"\n## {heading}\n\n{mark[0]}\n{table}{mark[1]}\n"
    DOCS.write_text(text, encoding="utf-8")


_PACKAGES = {"opencv": "opencv-python-headless", "ncnn": "ncnn", "mnn": "mnn",
             "tract": "tract", "rknn": "rknn-toolkit2"}


def versions(engines: list[str], edge: Path) -> dict[str, str]:
    """Each engine's version: in-process ones here, edge ones in their own venv."""
    import subprocess

    found = {}
    for engine in engines:
        if engine in IN_PROCESS:
            found[engine] = in_process.engine_version(engine)
            continue
        try:  # installed in this interpreter (the test extra has all but RKNN)
            found[engine] = importlib.metadata.version(_PACKAGES[engine])
            continue
        except importlib.metadata.PackageNotFoundError:
            pass
        python = edge / engine / "venv" / "bin" / "python"
        probe = f"import importlib.metadata as m; print(m.version('{_PACKAGES[engine]}'))"
        try:
            found[engine] = subprocess.run([str(python), "-c", probe], capture_output=True,
                                           text=True, timeout=60).stdout.strip()
        except OSError:
            found[engine] = "not installed"
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default=",".join(IN_PROCESS[1:] + EDGE))
    parser.add_argument("--edge", default=os.environ.get("EDGE_ENGINES_DIR", "/work/engines"))
    parser.add_argument("--probes", action="store_true", help="only the probes")
    parser.add_argument("--zoo", action="store_true", help="only the zoo")
    parser.add_argument("--shipped", action="store_true",
                        help="only the real models packages ship (scripts/shipped.py)")
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--json", default=str(ROOT / "bench-results" / "engine_matrix.json"))
    parser.add_argument("--load", metavar="FILE.json",
                        help="write (--write) from a run's saved results, measuring nothing")
    args = parser.parse_args(argv)
    engines = [e for e in args.engines.split(",") if e]
    edge = Path(args.edge)
    if args.load:
        results = json.loads(Path(args.load).read_text())
        engines = list(results["versions"])
    else:
        results = {"versions": versions(engines, edge)}
        every = not (args.probes or args.zoo or args.shipped)
        if every or args.probes:
            results["probes"] = probe_phase(engines, edge)
        if every or args.zoo:
            results["zoo"] = zoo_phase(engines, edge)
        if every or args.shipped:
            results["shipped"] = shipped_phase(engines, edge)
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    if args.write:
        if "probes" in results:
            write_data(results["probes"], engines)
        if "zoo" in results:
            write_docs(results["zoo"], results["versions"])
        if "shipped" in results:
            write_docs(results["shipped"], results["versions"], SHIPPED_MARK,
                       "Engine matrix: models packages ship, before and after --target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
