"""The command line: ``decomposer IN OUT`` / ``python -m decomposer IN OUT``, many models
with ``decomposer IN... -o OUT_DIR`` (or a folder), and ``decomposer check IN...|DIR``.

In: ``argv`` (a list of strings). Out: an exit code, one summary line on stdout, and errors
as one clear line (per offending node, for unsupported nodes) on stderr. Many models: a
progress bar on a terminal (tqdm; none with ``-q`` or when stderr is not a terminal), one
line per failed model, one summary line, ``--report`` a JSON report with every model and
the totals (:mod:`decomposer.batch`).

Exit codes: 0 ok; 1 verification failed; 2 bad input or usage; 3 unsupported nodes remain;
4 internal error (the output failed onnx.checker, or a pattern crashed); 5 cannot write the
output. Many models: the highest code of any model. Only ``--debug`` shows a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from decomposer import __version__
from decomposer.api import decompose_file
from decomposer.engine_support import known_engines
from decomposer.errors import (
    DecomposerError,
    ModelIOError,
    UnsupportedNodeError,
    VerificationError,
)
from decomposer.freezing import parse_shape, parse_value
from decomposer.plugins import load_pattern_source
from decomposer.registry import build_registry
from decomposer.targets import MODES, engine_targets
from decomposer.targets import resolve as resolve_target

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_INTERNAL = 4


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="decomposer",
        description="Rewrite custom ONNX nodes (custom-domain ops, torch ATen fallbacks) into "
                    "standard ONNX ops so stock ONNX Runtime runs the model. "
                    "--list-patterns shows which ops are covered.",
        epilog="exit codes: 0 ok, 1 verification failed, 2 bad input or usage, "
               "3 unsupported nodes remain, 4 internal error, 5 cannot write output",
    )
    parser.add_argument("paths", nargs="*", metavar="IN [OUT]",
                        help="model to read (.onnx) and model to write (may equal IN); with "
                             "-o: models and folders to read (a folder: every *.onnx below "
                             "it)")
    parser.add_argument("-o", "--output-dir", metavar="OUT_DIR",
                        help="decompose every model given into OUT_DIR (relative layout "
                             "kept); the run's exit code is the worst model's")
    parser.add_argument("-j", "--jobs", type=int, metavar="N",
                        help="worker processes for many models (default: the CPU count)")
    parser.add_argument("--list-patterns", action="store_true",
                        help="list the available patterns and exit")
    parser.add_argument("--dry-run", action="store_true",
                        help="report what would change; write nothing")
    parser.add_argument("--report", metavar="FILE.json",
                        help="write a JSON report (counts, unsupported nodes, opset)")
    parser.add_argument("--allow-unsupported", action="store_true",
                        help="keep nodes no pattern can rewrite (warn, exit 0)")
    parser.add_argument("--patterns", action="append", default=[], metavar="FILE_OR_MODULE",
                        help="load extra patterns (repeatable): a .py file or module (pattern "
                             "classes, or onnxscript functions defining ops), or a .onnx file "
                             "whose functions define ops")
    parser.add_argument("--override", action="store_true",
                        help="let --patterns replace built-in patterns for the same op")
    parser.add_argument("--target", type=_target, default="portable",
                        metavar="{" + ",".join(MODES) + "}|ENGINE[,ENGINE]",
                        help="portable (default): the output runs on every engine (ONNX "
                             "Runtime, OpenVINO, TVM, TensorRT, converters) and ONNX "
                             "Runtime-only contrib ops count as unsupported; ops most "
                             "engines compute wrongly (antialiased Resize) are lowered where "
                             "they can be; ort: ONNX Runtime "
                             "only (its contrib ops are kept; ORT-tuned forms where faster); "
                             "qdq: as portable, but block-quantized weights (ONNX Runtime's "
                             "4-bit matmuls) stay int4/int8 behind a DequantizeLinear at "
                             "opset 21+, for ONNX Runtime, OpenVINO and TensorRT (not TVM or "
                             "the converters); ENGINE (" + ", ".join(engine_targets()) +
                             "; several joined by commas): as portable, and also within "
                             "each engine's opset cap, with the ops it lacks or computes "
                             "wrongly lowered (its measured profile)")
    parser.add_argument("--target-opset", type=int, metavar="N", dest="target_opset",
                        help="take the model down to default-domain opset N (11 to the "
                             "newest): standard ops are rewritten to N's signatures, ops N "
                             "lacks are lowered by patterns, custom nodes decomposed at N; "
                             "what N cannot say exits 3. At or above the model's opset: no "
                             "change (never upgrades)")
    parser.add_argument("--lower", action="append", default=[], metavar="OP[,OP]",
                        help="also decompose these standard ONNX ops where the opset defines "
                             "them, for engines that lack them (an op onnx2torch or another "
                             "converter has no kernel for); repeatable")
    parser.add_argument("--overwrite-input-shape", action="append", default=[],
                        metavar="NAME:DIMS", dest="overwrite_input_shape",
                        help="fix an input's dims in the written model (1x3x640x640, or "
                             "1,3,640,640; a name keeps a dim symbolic) and fold the shape "
                             "arithmetic they decide (onnxslim); repeatable")
    parser.add_argument("--freeze-input", action="append", default=[], metavar="NAME=VALUE",
                        dest="freeze_input",
                        help="replace a run-time input by a constant (sr=16000, or 1,2,3) "
                             "and fold what it decides: an If on it, a Range it sizes; "
                             "repeatable")
    verify = parser.add_argument_group("verification (--verify)")
    verify.add_argument("--verify", nargs="?", const="fast", choices=("fast", "full"),
                        metavar="MODE",
                        help="check the result before writing it; exit 1 on a mismatch. "
                             "--verify (fast): run the result once per feed set and compare "
                             "every replaced node's outputs with its pattern's numpy reference "
                             "on the captured inputs; --verify=full: also run the whole "
                             "original on onnx.reference (pure numpy: small sizes only)")
    verify.add_argument("--engine", action="append", default=[], metavar="NAME",
                        help="engine to run the result on: ort (default), openvino, tvm "
                             "(repeatable); each is checked against the same references")
    verify.add_argument("--atol", type=float, default=None,
                        help="absolute tolerance (default: the tolerance policy, float32 1e-5)")
    verify.add_argument("--rtol", type=float, default=None,
                        help="relative tolerance (default: the tolerance policy, float32 1e-5)")
    verify.add_argument("--runs", type=int, default=2,
                        help="generated feed sets, with different dynamic sizes (2)")
    verify.add_argument("--seed", type=int, default=0, help="seed for generated inputs (0)")
    verify.add_argument("--inputs", metavar="FILE.npz", help="explicit feeds (one run)")
    verify.add_argument("--input-shape", action="append", default=[],
                        metavar="NAME:1x3x224x224", help="fix an input's shape (repeatable)")
    verify.add_argument("--input-value", action="append", default=[],
                        metavar="NAME=1,64,32,32",
                        help="value of a small (e.g. integer size) input (repeatable)")
    verify.add_argument("--expected", metavar="FILE.npz",
                        help="graph outputs saved from PyTorch for --inputs, compared too")
    parser.add_argument("--no-check", action="store_true",
                        help="skip onnx.checker (full_check) on the result")
    parser.add_argument("-q", "--quiet", action="store_true", help="print errors only")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="print each replaced node")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("--version", action="version", version=f"decomposer {__version__}")
    return parser


def _target(text: str) -> str:
    """argparse's check of a --target value (one clear usage line when it is wrong)."""
    try:
        resolve_target(text)
    except DecomposerError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(argv) if argv is not None else sys.argv[1:]
    if arguments[:1] == ["check"]:
        return check_main(arguments[1:])
    parser = _parser()
    try:
        args = parser.parse_args(_verify_mode_explicit(arguments))
    except SystemExit as exit_:  # argparse already printed usage/--help/--version
        return int(exit_.code or 0)
    logging.basicConfig(level=logging.DEBUG if args.debug else
                        logging.INFO if args.verbose else logging.WARNING,
                        format="decomposer: %(levelname)s: %(message)s")
    try:
        return _run(args, parser)
    except DecomposerError as exc:
        if args.debug:
            traceback.print_exc()
        _print_error(exc)
        report = getattr(exc, "report", None)
        if args.report and report is not None:
            _write_report(args.report, report.to_dict())
        return exc.exit_code
    except KeyboardInterrupt:
        print("decomposer: interrupted; nothing written", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug: one line, unless --debug
        if args.debug:
            traceback.print_exc()
        print(f"decomposer: internal error: {type(exc).__name__}: {exc} "
              f"(rerun with --debug for a traceback and please report it)", file=sys.stderr)
        return EXIT_INTERNAL


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    registry = build_registry(override=args.override)
    for source in args.patterns:
        load_pattern_source(source, registry, override=args.override)
    if args.list_patterns:
        entries = list(registry)
        width = max([16, *(len(entry.pattern.name) + 1 for entry in entries)])
        for entry in entries:
            pattern = entry.pattern
            forms = [form.describe(pattern.op_type) for form in pattern.spellings()]
            print(f"{pattern.name:<{width}} [{entry.source}] ({'; '.join(forms)}) "
                  f"{pattern.summary}")
        return EXIT_OK
    if args.output_dir is not None:
        return _run_many(args, parser)
    if len(args.paths) > 2:
        parser.print_usage(sys.stderr)
        print("decomposer: error: give IN OUT, or IN... -o OUT_DIR for many models",
              file=sys.stderr)
        return EXIT_USAGE
    args.input, args.output = (args.paths + [None, None])[:2]
    if args.jobs is not None and not args.quiet:
        print("decomposer: warning: -j applies to many models (-o OUT_DIR)", file=sys.stderr)
    if not args.input:
        parser.print_usage(sys.stderr)
        print("decomposer: error: give INPUT and OUTPUT (or --list-patterns)", file=sys.stderr)
        return EXIT_USAGE
    if Path(args.input).is_dir():
        print(f"decomposer: error: {args.input} is a directory; give -o OUT_DIR to "
              f"decompose every model in it", file=sys.stderr)
        return EXIT_USAGE
    if not args.output and not args.dry_run:
        parser.print_usage(sys.stderr)
        print("decomposer: error: give OUTPUT, or --dry-run to only report", file=sys.stderr)
        return EXIT_USAGE
    if args.report and any(_same_file(args.report, path)
                           for path in (args.input, args.output) if path):
        print("decomposer: error: --report would overwrite a model file; give the report "
              "its own name", file=sys.stderr)
        return EXIT_USAGE
    if args.dry_run and args.output and not args.quiet:
        print("decomposer: warning: --dry-run given: OUTPUT will not be written",
              file=sys.stderr)
    verify_flags = [flag for flag, given in [
        ("--inputs", args.inputs), ("--expected", args.expected),
        ("--input-shape", args.input_shape), ("--input-value", args.input_value),
        ("--engine", args.engine)] if given]
    if verify_flags and not args.verify and not args.quiet:
        print(f"decomposer: warning: {', '.join(verify_flags)} ignored without --verify",
              file=sys.stderr)
    if args.expected and not args.inputs:
        print("decomposer: error: --expected needs --inputs FILE.npz (the feeds the expected "
              "outputs came from)", file=sys.stderr)
        return EXIT_USAGE
    for path, what in [(args.output, "OUTPUT"), (args.report, "--report")]:
        if path and (what != "OUTPUT" or not args.dry_run):
            _require_writable(path, what)
    options = _verify_options(args) if args.verify else None
    report = decompose_file(args.input, args.output, allow_unsupported=args.allow_unsupported,
                            check=not args.no_check, registry=registry, dry_run=args.dry_run,
                            verify=args.verify is not None, verify_options=options,
                            target=args.target, lower=_split_names(args.lower),
                            target_opset=args.target_opset, **_fixed_inputs(args))
    if args.report:
        _write_report(args.report, report.to_dict())
    if not args.quiet:
        if args.verbose:
            for node in report.replaced:
                print(f"  {node.pattern}: '{node.name}' ({node.domain or '<default>'}::"
                      f"{node.op_type}) in {node.graph} -> {node.new_nodes} nodes")
        for issue in report.unsupported:
            print(f"decomposer: warning: kept {issue.describe()}", file=sys.stderr)
        for warning in report.warnings:
            print(f"decomposer: warning: {warning}", file=sys.stderr)
        if report.verification is not None and args.verbose:
            print(report.verification.table())
        elif report.verification is not None:
            for note in report.verification.notes:
                print(f"decomposer: warning: verification: {note}", file=sys.stderr)
        print(report.summary())
        if report.verification is not None:
            print(report.verification.summary())
    return EXIT_OK


def _progress_bar(total: int, quiet: bool, what: str) -> Any:
    """A tqdm bar on stderr when it is a terminal (and not ``-q``), else None."""
    if quiet or total < 2 or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="model", desc=what, file=sys.stderr, leave=False)


def _batch_done(report: Any, args: argparse.Namespace, quiet: bool) -> int:
    for model in report.models:
        if model.exit_code and not quiet:
            print(f"decomposer: error: {model.input}: {model.status}: {model.message}",
                  file=sys.stderr)
    if args.report:
        _write_report(args.report, report.to_dict())
    print(report.summary())
    return int(report.exit_code)


def _run_many(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from decomposer.batch import collect_models, decompose_many

    if not args.paths:
        parser.print_usage(sys.stderr)
        print("decomposer: error: give the models or folders to decompose before -o",
              file=sys.stderr)
        return EXIT_USAGE
    refused = [flag for flag, given in [("--verify", args.verify), ("--dry-run", args.dry_run),
                                        ("--inputs", args.inputs),
                                        ("--overwrite-input-shape",
                                         args.overwrite_input_shape),
                                        ("--freeze-input", args.freeze_input)] if given]
    if refused:
        print(f"decomposer: error: {', '.join(refused)} works on one model (IN OUT), not "
              f"with -o; use `decomposer check` for a dry run of many", file=sys.stderr)
        return EXIT_USAGE
    if args.jobs is not None and args.jobs < 1:
        print("decomposer: error: -j must be >= 1", file=sys.stderr)
        return EXIT_USAGE
    if args.report:
        _require_writable(args.report, "--report")
    count = len(collect_models(args.paths))
    bar = _progress_bar(count, args.quiet, "decomposing")
    try:
        report = decompose_many(
            args.paths, args.output_dir, jobs=args.jobs, target=args.target,
            lower=_split_names(args.lower), allow_unsupported=args.allow_unsupported,
            check=not args.no_check, pattern_sources=args.patterns, override=args.override,
            progress=(lambda _: bar.update(1)) if bar is not None else None,
            target_opset=args.target_opset)
    finally:
        if bar is not None:
            bar.close()
    return _batch_done(report, args, args.quiet)


def _check_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="decomposer check",
        description="Write nothing; list every model that still needs a plugin (custom "
                    "nodes no pattern rewrites; ONNX Runtime contrib ops under the portable "
                    "target) and, with --engines, the standard ops each engine lacks and "
                    "the --lower that fixes each.",
        epilog="exit codes: 0 every model runs without a plugin, 2 a model cannot be read, "
               "3 a model still needs a plugin, 4 internal error; --strict-engines: 3 also "
               "when an engine lacks an op")
    parser.add_argument("paths", nargs="+", metavar="IN_OR_DIR",
                        help="models and folders (a folder: every *.onnx below it)")
    parser.add_argument("--engines", default="", metavar="E[,E]",
                        help=", ".join(known_engines()))
    parser.add_argument("--strict-engines", action="store_true",
                        help="exit 3 when an engine asked about lacks an op, too")
    parser.add_argument("--target", type=_target, default="portable",
                        metavar="{" + ",".join(MODES) + "}|ENGINE[,ENGINE]")
    parser.add_argument("--lower", action="append", default=[], metavar="OP[,OP]",
                        help="check as if these standard ops were decomposed too")
    parser.add_argument("--target-opset", type=int, metavar="N", dest="target_opset",
                        help="check as if taken down to opset N: name what cannot go down")
    parser.add_argument("--patterns", action="append", default=[], metavar="FILE_OR_MODULE",
                        help="extra patterns: a .py file or module, or a .onnx function "
                             "library (repeatable)")
    parser.add_argument("--override", action="store_true")
    parser.add_argument("--report", metavar="FILE.json", help="write the JSON report")
    parser.add_argument("-j", "--jobs", type=int, metavar="N")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="only the models that need work, and the summary")
    parser.add_argument("--no-check", action="store_true")
    parser.add_argument("--debug", action="store_true")
    return parser


def check_main(argv: Sequence[str]) -> int:
    """``decomposer check``: see :func:`_check_parser`."""
    parser = _check_parser()
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as exit_:
        return int(exit_.code or 0)
    try:
        from decomposer.batch import check_many, collect_models

        if args.report:
            _require_writable(args.report, "--report")
        engines = _split_names([args.engines])
        count = len(collect_models(args.paths))
        bar = _progress_bar(count, args.quiet, "checking")
        try:
            report = check_many(args.paths, engines=engines, jobs=args.jobs,
                                target=args.target, lower=_split_names(args.lower),
                                check=not args.no_check, pattern_sources=args.patterns,
                                override=args.override,
                                progress=(lambda _: bar.update(1)) if bar is not None
                                else None, target_opset=args.target_opset)
        finally:
            if bar is not None:
                bar.close()
        for model in report.models:
            if model.status == "ok" and args.quiet:
                continue
            print(f"{model.input}: {model.status}"
                  + (f" ({model.message})" if model.message else ""))
            for issue in model.unsupported:
                print(f"  needs a plugin: {issue}")
            for engine, found in model.engines.items():
                for gap in found:
                    fix = _gap_fix(engine, gap)
                    print(f"  {engine}: {gap['op']} x{gap['nodes']}: {fix} "
                          f"({gap['evidence']})")
        if args.report:
            _write_report(args.report, report.to_dict())
        print(report.summary())
        code = int(report.exit_code)
        if code == 0 and args.strict_engines and any(
                gaps for model in report.models for gaps in model.engines.values()):
            code = 3
        return code
    except DecomposerError as exc:
        if args.debug:
            traceback.print_exc()
        _print_error(exc)
        return exc.exit_code
    except KeyboardInterrupt:
        print("decomposer: interrupted", file=sys.stderr)
        return 130


def _verify_options(args: argparse.Namespace) -> dict[str, Any]:
    from decomposer.verification import load_npz, parse_input_shapes, parse_input_values

    def progress(line: str) -> None:
        print(f"decomposer: {line}", file=sys.stderr, flush=True)

    return {
        "feeds": load_npz(args.inputs) if args.inputs else None,
        "expected": load_npz(args.expected, "--expected") if args.expected else None,
        "input_shapes": parse_input_shapes(args.input_shape),
        "input_values": parse_input_values(args.input_value),
        "atol": args.atol, "rtol": args.rtol, "runs": args.runs, "seed": args.seed,
        "mode": args.verify, "engines": args.engine or ["ort"],
        "progress": None if args.quiet else progress,
    }


def _verify_mode_explicit(argv: list[str]) -> list[str]:
    """``--verify`` takes an optional mode; a bare ``--verify`` right before the input path
    must not swallow it as the mode, so it is spelled ``--verify=fast`` before parsing."""
    return ["--verify=fast" if arg == "--verify" and (index + 1 == len(argv) or
                                                      argv[index + 1] not in ("fast", "full"))
            else arg for index, arg in enumerate(argv)]


def _require_writable(path: str, what: str) -> None:
    """Fail before anything is written if ``path`` cannot be written: a run that wrote the
    model and then failed on its report would leave half of what was asked for."""
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise ModelIOError(f"{what} {path} is a directory")
    if not folder.is_dir():
        raise ModelIOError(f"{what} {path}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK) or \
            (target.exists() and not os.access(target, os.W_OK)):
        raise ModelIOError(f"{what} {path}: permission denied")


def _gap_fix(engine: str, gap: dict[str, Any]) -> str:
    """What fixes an engine gap `check --engines` found: the engine's --target where it
    has a profile that applies the fix, else the --lower."""
    lower = f"--lower {gap['lower']}" if gap["lower"] else ""
    # an If on a run-time input: freezing it (or, where only its shape decides, fixing
    # its shape) folds the branch away; a fix that needs static sizes asks for them
    flags = [f"--freeze-input {name}=VALUE" for name in gap.get("freeze", ())] + \
        [f"--overwrite-input-shape {name}:DIMS" for name in gap.get("shape", ())]
    if engine in engine_targets() and (lower or gap.get("take_down") or gap.get("fold")):
        return " ".join([f"--target {engine}", *flags]) + (f" (or {lower})" if lower else "")
    if flags:
        return " ".join(flags)
    return lower or "no fix"


def _fixed_inputs(args: argparse.Namespace) -> dict[str, Any]:
    """decompose_file's input_shapes and freeze_inputs from --overwrite-input-shape and
    --freeze-input (InvalidModelError, one line, for a malformed one)."""
    shapes = dict(parse_shape(text) for text in args.overwrite_input_shape)
    values = dict(parse_value(text) for text in args.freeze_input)
    return {"input_shapes": shapes or None, "freeze_inputs": values or None}


def _split_names(values: list[str]) -> list[str]:
    """``--lower A,B --lower C`` -> ``[A, B, C]``."""
    return [name.strip() for value in values for name in value.split(",") if name.strip()]


def _same_file(a: str, b: str) -> bool:
    return os.path.abspath(a) == os.path.abspath(b)


def _write_report(path: str, data: dict[str, Any]) -> None:
    try:
        Path(path).write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    except OSError as exc:
        raise ModelIOError(f"{path}: cannot write report: {exc.strerror or exc}") from exc


def _print_error(exc: DecomposerError) -> None:
    if isinstance(exc, VerificationError):
        report = getattr(exc, "report", None)
        for line in str(exc).splitlines()[1:]:
            print(f"decomposer: error: {line}", file=sys.stderr)
        print(f"decomposer: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        if report is not None and report.output_path and not report.dry_run:
            print(f"decomposer: error: {report.output_path} was written but does NOT match "
                  f"the original; do not ship it", file=sys.stderr)
        return
    if isinstance(exc, UnsupportedNodeError):
        print(f"decomposer: error: {len(exc.nodes)} node(s) cannot be decomposed:",
              file=sys.stderr)
        for issue in exc.nodes:
            print(f"decomposer: error: {issue.describe()}", file=sys.stderr)
        print("decomposer: error: nothing written; pass --allow-unsupported to keep such "
              "nodes", file=sys.stderr)
        return
    message = " ".join(str(exc).split("\n"))
    print(f"decomposer: error: {message}", file=sys.stderr)


def console_main() -> None:
    """Entry point of the ``decomposer`` console script."""
    sys.exit(main())
