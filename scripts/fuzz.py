"""Fuzz decomposer with structure-aware and byte-level mutants of valid models.

In: ``--count N`` mutants (default 10000), ``--seed S``, ``--timeout SECONDS`` per mutant;
``--keep DIR`` saves each crashing or hanging mutant, ``--replay FILE...`` runs saved ones
again, ``--describe FILE`` prints one, ``--check-seeds`` only checks the seed corpus.
Out: one line of counts (mutants, decomposed, untouched, rejected, crashes, hangs), the
refusals and crashes by kind, and, with ``--json FILE``, every crash and hang with the seed
model it came from. Exit 1 if any mutant crashed or hung.

Every mutant must either decompose (and the written model then passes
``onnx.checker.check_model(full_check=True)``), come back untouched when nothing in it is
a custom node (and pass the structural check), or be refused with a ``DecomposerError``
other than exit code 4. Anything else is a crash: exit 4 (``PatternBugError``, a pattern
that crashed; ``CheckFailedError``, a rewritten model that fails the checker, tagged
``declared type`` when only the input's own declared types contradict the result, else
``ill-typed``), another exception (with the innermost decomposer or pattern file:line),
or the worker dying. Mutants run in a worker subprocess, capped at 4 GiB of address space,
that is restarted when it dies or exceeds the per-mutant time limit (a hang), so a native
crash in onnx or ONNX Runtime cannot take the campaign down with it.

Seeds: every built-in pattern in every form its ``examples`` write (decomposer.examples:
native in its domains, torch's ``org.pytorch.aten::<op>`` and ``ATen(operator=<op>)`` with
constant arguments as the exporter writes them), plus chains, an If body and an ATen STN.
Mutations (seeded, reproducible): attribute types and values, arity and empty input
names, domain and op_type (every pattern's), opset imports (absurd versions included),
input dims (0, -1, large, 2**62), ranks and dtypes, the values of Constants (ATen
arguments), node order, deleted outputs, colliding names; plus byte flips, truncation and
splices of the serialized model.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import select
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper

# -- seed corpus ----------------------------------------------------------------------------

ATEN = "org.pytorch.aten"
F, D, I32, I64, B = (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT32,
                     TensorProto.INT64, TensorProto.BOOL)


def _vi(name, elem, dims):
    return helper.make_tensor_value_info(name, elem, dims)


def _structural_seeds() -> list[tuple[str, onnx.ModelProto]]:
    """Custom nodes in chains, in an If body, and feeding standard nodes."""
    found = []
    for op, attrs in [("Rot90AndScale", {"k": 3, "scale": 2.0, "clockwise": "yes"}),
                      ("CustomRotScale", {"rotations": 2, "scale_factor": 1.5,
                                          "dims": "width,height"})]:
        rot = helper.make_graph(
            [helper.make_node(op, ["x"], ["y"], name="rot", domain="custom.ops", **attrs),
             helper.make_node(op, ["y"], ["z"], name="rot2", domain="custom.ops")],
            "rot", [_vi("x", F, ["N", 3, "H", "W"])], [_vi("z", F, [None] * 4)])
        found.append((f"chain of {op}", helper.make_model(rot, opset_imports=[
            helper.make_opsetid("", 17), helper.make_opsetid("custom.ops", 1)], ir_version=8)))
    then = helper.make_graph([helper.make_node("Rot90AndScale", ["x"], ["t"], name="in_if",
                                               domain="custom.ops", k=1)],
                             "then", [], [_vi("t", F, [None] * 4)])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"], name="id")],
                              "else", [], [_vi("e", F, [None] * 4)])
    branchy = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], name="if", then_branch=then, else_branch=other)],
        "if", [_vi("x", F, [1, 2, 3, 3]), _vi("c", B, [])], [_vi("y", F, [None] * 4)])
    found.append(("Rot90AndScale in an If body", helper.make_model(branchy, opset_imports=[
        helper.make_opsetid("", 16), helper.make_opsetid("custom.ops", 1)], ir_version=8)))
    # An STN: AffineGrid -> GridSample fallbacks, a Tril of the output, all ATen.
    nodes = [helper.make_node("Constant", [], [name], name=f"c_{name}",
                              value=onnx.numpy_helper.from_array(value, "v"))
             for name, value in [("align", np.array(False)), ("zero", np.array(0, np.int64))]]
    nodes += [helper.make_node("Shape", ["x"], ["size"], name="shape"),
              helper.make_node("affine_grid_generator", ["theta", "size", "align"], ["grid"],
                               name="affine", domain=ATEN),
              helper.make_node("grid_sampler", ["x", "grid", "zero", "zero", "align"], ["s"],
                               name="sample", domain=ATEN),
              helper.make_node("ATen", ["s", "zero"], ["y"], name="tril", domain=ATEN,
                               operator="tril", overload_name="")]
    stn = helper.make_graph(nodes, "stn", [_vi("x", F, ["N", 3, "H", "W"]),
                                           _vi("theta", F, ["N", 2, 3])],
                            [_vi("y", F, [None] * 4)])
    found.append(("ATen STN chain", helper.make_model(stn, opset_imports=[
        helper.make_opsetid("", 13), helper.make_opsetid(ATEN, 1)], ir_version=8)))
    return found


def labelled_seeds() -> list[tuple[str, onnx.ModelProto]]:
    """(label, model) of every seed: each built-in pattern in every form its ``examples``
    write (decomposer.examples), then the structural seeds."""
    from decomposer.examples import example_models
    from decomposer.registry import build_registry

    found = []
    for entry in build_registry(entry_points=False):
        pattern = entry.pattern
        for index, example in enumerate(pattern.examples):
            found += [(f"{type(pattern).__name__}[{index}] {label}", model)
                      for label, model in example_models(pattern, example)]
    return found + _structural_seeds()


def seed_models() -> list[onnx.ModelProto]:
    """Small valid models holding every custom-node form decomposer knows."""
    return [model for _, model in labelled_seeds()]


def check_seeds() -> list[str]:
    """Problems with the seed corpus: a seed that does not decompose cleanly (every custom
    node replaced, full_check passes), or a built-in pattern form no seed holds."""
    import decomposer
    from decomposer.registry import build_registry

    registry = build_registry(entry_points=False)
    wanted = set()
    for entry in registry:
        pattern = entry.pattern
        for form in pattern.spellings():
            wanted |= {(pattern.name, f"native {op}") for op in form.op_types}
            if form.aten:
                wanted |= {(pattern.name, "fallthrough"), (pattern.name, "ATen")}
    problems = []
    for label, model in labelled_seeds():
        try:
            out, report = decomposer.decompose_with_report(model)
            onnx.checker.check_model(out, full_check=True)
            assert report.replaced and not report.unsupported, report.summary()
        except Exception as exc:  # every failure is a problem with the corpus
            problems.append(f"{label}: {type(exc).__name__}: {exc}")
            continue
        for node in _nodes(model.graph):
            found = registry.lookup(node)
            if found is not None:
                aten = node.op_type == "ATen" or node.domain == ATEN
                form = ("ATen" if node.op_type == "ATen" else "fallthrough") if aten \
                    else f"native {node.op_type}"
                wanted.discard((found[0].name, form))
    problems += [f"no example of pattern {name} holds its {form} form (add one to its "
                 f"examples)"
                 for name, form in sorted(wanted)]
    return problems


# -- mutators -------------------------------------------------------------------------------

_DOMAINS = ["", "ai.onnx", "custom.ops", "org.pytorch.aten", "ai.onnx.ml", "ai.onnx.contrib",
            "com.microsoft", "mmcv", "x" * 300, "é.ops"]
# Large static dims: 2**16 + 1 and 2**24 reach size-dependent code paths (unrolled tables,
# baked constants), 2**31 int32 overflow, 2**40 and 2**62 absurd sizes.
_DIMS = [0, -1, 1, 2, 3, 5, 2**16 + 1, 2**24, 2**31, 2**40, 2**62]
_INTS = [0, 1, -1, 2, 3, 5, 2**31, -(2**63), 2**63 - 1]


@functools.cache
def _vocabulary() -> tuple[list[str], list[str]]:
    """(op types, attribute names) to mutate into: every built-in pattern's op type, ATen
    name and attribute, plus standard and unknown ones."""
    from decomposer.registry import build_registry

    ops = ["ATen", "Relu", "If", "Loop", "Constant", "Trilu", "Unknown", ""]
    names = ["operator", "overload_name", "value", "zzz"]
    for entry in build_registry(entry_points=False):
        for form in entry.pattern.spellings():
            ops += list(form.op_types) + ([form.aten] if form.aten else [])
            names += list(form.attributes)
    return sorted(set(ops)), sorted(set(names))


def _random_tensor(rng: random.Random) -> TensorProto:
    """A Constant value of a random dtype and shape: what ATen forms read their arguments
    from (scalars, pairs, empty, NaN, huge, strings)."""
    dtype = rng.choice([np.int64, np.int32, np.bool_, np.float64, np.float32, np.float16,
                        np.uint8, object])
    shape = rng.choice([(), (), (1,), (2,), (0,), (3,), (1, 1)])
    size = int(np.prod(shape, dtype=np.int64))
    if dtype is object:
        pool = [b"left", b"right", b"", b"\xff", b"bilinear"]
    elif dtype in (np.float64, np.float32, np.float16):
        pool = [0.0, -0.0, 0.5, 1.0, -1.0, 3.0, float("nan"), float("inf"), -1e30, 1e30]
    elif dtype is np.bool_:
        pool = [True, False]
    else:
        info = np.iinfo(dtype)
        pool = [v for v in _INTS + [4, 7, -2, -3, 64, 10**6] if info.min <= v <= info.max]
    with np.errstate(over="ignore"):  # 1e30 as float16 is inf, on purpose
        value = np.array([rng.choice(pool) for _ in range(size)], dtype=dtype).reshape(shape)
    return onnx.numpy_helper.from_array(value, "v")


def _nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    found = []
    for node in graph.node:
        found.append(node)
        for attr in node.attribute:
            if attr.type == AttributeProto.GRAPH:
                found.extend(_nodes(attr.g))
    return found


def _random_attribute(rng: random.Random, name: str) -> AttributeProto:
    choice = rng.randrange(7)
    if choice == 0:
        return helper.make_attribute(name, rng.choice(_INTS))
    if choice == 1:
        return helper.make_attribute(name, rng.choice([0.0, -1.5, float("nan"), float("inf"),
                                                       1e300, 2.0]))
    if choice == 2:
        return helper.make_attribute(name, rng.choice(["yes", "no", "", "height,width",
                                                       "\x00", "W" * 5000, "TRUE"]))
    if choice == 3:
        return helper.make_attribute(name, [rng.choice(_INTS) for _ in range(rng.randrange(4))])
    if choice == 4:
        return helper.make_attribute(name, helper.make_tensor("t", TensorProto.FLOAT, [1], [1]))
    if choice == 5:
        return helper.make_attribute(name, b"\xff\xfe")
    return helper.make_attribute(name, [1.0, float("nan")])


# Mutation kinds below, weighted toward what reaches a pattern's check (attributes, dims
# and dtypes, ATen constant arguments) over what the input checker refuses outright
# (node order, deleted outputs, colliding names, graph-level damage).
_KIND_WEIGHTS = [3, 2, 2, 1, 2, 1, 4, 1, 1, 1, 1, 4]


def mutate_structure(model: onnx.ModelProto, rng: random.Random) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    ops, attribute_names = _vocabulary()
    for _ in range(rng.randint(1, 3)):
        nodes = _nodes(m.graph)
        node = rng.choice(nodes)
        kind = rng.choices(range(12), _KIND_WEIGHTS)[0]
        if kind == 0 and node.attribute:  # attribute type and value
            attr = rng.choice(node.attribute)
            attr.CopyFrom(_random_attribute(rng, attr.name))
        elif kind == 1:  # a new or renamed attribute
            node.attribute.append(_random_attribute(rng, rng.choice(attribute_names)))
        elif kind == 2:  # arity and empty names
            if node.input and rng.random() < 0.5:
                del node.input[rng.randrange(len(node.input))]
            else:
                known = [i.name for i in m.graph.input] + [o for n in nodes for o in n.output]
                node.input.insert(rng.randrange(len(node.input) + 1),
                                  rng.choice(["", "nowhere"] + known))
        elif kind == 3:
            node.domain = rng.choice(_DOMAINS)
        elif kind == 4:
            node.op_type = rng.choice(ops)
        elif kind == 5:  # opset imports, absurd versions included
            if m.opset_import and rng.random() < 0.7:
                rng.choice(m.opset_import).version = rng.choice(
                    [0, -1, 1, 10, 11, 12, 13, 14, 17, 18, 20, 21, 28, 10**9, 2**62])
            else:
                m.opset_import.append(helper.make_opsetid(rng.choice(_DOMAINS),
                                                          rng.choice([1, 16, 99])))
        elif kind == 6:  # dims and dtypes of inputs
            value = rng.choice(list(m.graph.input) or [None])
            if value is not None:
                tensor = value.type.tensor_type
                what = rng.random()
                if what < 0.4 and tensor.shape.dim:
                    rng.choice(tensor.shape.dim).dim_value = rng.choice(_DIMS)
                elif what < 0.5 and tensor.shape.dim:  # one dim fewer
                    del tensor.shape.dim[rng.randrange(len(tensor.shape.dim))]
                elif what < 0.6:  # one dim more, static or symbolic
                    dim = tensor.shape.dim.add()
                    if rng.random() < 0.5:
                        dim.dim_value = rng.choice(_DIMS[1:])
                    else:
                        dim.dim_param = "extra"
                elif what < 0.65:  # rank unknown
                    tensor.ClearField("shape")
                else:
                    tensor.elem_type = rng.choice([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
                                                   13, 16, 1000])
        elif kind == 7:  # node order
            order = list(m.graph.node)
            rng.shuffle(order)
            del m.graph.node[:]
            m.graph.node.extend(order)
        elif kind == 8 and node.output:  # deleted outputs
            if rng.random() < 0.5:
                del node.output[:]
            else:
                node.output[0] = ""
        elif kind == 9:  # colliding names
            names = [o for n in nodes for o in n.output] + [i.name for i in m.graph.input]
            if node.output and names:
                node.output[0] = rng.choice(names)
            node.name = rng.choice([n.name for n in nodes])
        elif kind == 11:  # the value of a Constant (an ATen argument)
            constants = [n for n in nodes if n.op_type == "Constant" and n.attribute]
            if constants:
                target = rng.choice(constants)
                del target.attribute[:]
                target.attribute.append(helper.make_attribute("value", _random_tensor(rng)))
        else:  # graph-level damage
            if m.graph.output and rng.random() < 0.5:
                m.graph.output[0].name = rng.choice(["", "missing", "theta"])
            else:
                m.ir_version = rng.choice([0, 1, 3, 7, 10, 99])
    return m


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    buffer = bytearray(data)
    kind = rng.randrange(3)
    if kind == 0:
        for _ in range(rng.randint(1, 8)):
            position = rng.randrange(len(buffer))
            buffer[position] ^= 1 << rng.randrange(8)
        return bytes(buffer)
    if kind == 1:
        return bytes(buffer[:rng.randrange(len(buffer))])
    start = rng.randrange(len(buffer))
    return bytes(buffer[:start] + buffer[rng.randrange(len(buffer)):])


def make_mutants(count: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    corpus = seed_models()
    mutants = []
    for index in range(count):
        base = corpus[index % len(corpus)]
        if rng.random() < 0.75:
            try:
                mutants.append(mutate_structure(base, rng).SerializeToString())
                continue
            except Exception:  # protobuf refused the mutation itself; fall back to bytes
                pass
        mutants.append(mutate_bytes(base.SerializeToString(), rng))
    return mutants


def describe(model: onnx.ModelProto) -> str:
    """A mutant in a few lines, for a bug report: opsets, typed inputs and outputs, and
    every node (Constants with their values)."""
    def typed(value: onnx.ValueInfoProto) -> str:
        tensor = value.type.tensor_type
        dims = ([d.dim_param or (d.dim_value if d.HasField("dim_value") else "?")
                 for d in tensor.shape.dim] if tensor.HasField("shape") else "unranked")
        name = (TensorProto.DataType.Name(tensor.elem_type)
                if tensor.elem_type in TensorProto.DataType.values() else tensor.elem_type)
        return f"{value.name}: {name} {dims}"

    lines = ["opsets " + ", ".join(f"{o.domain or '<default>'}:{o.version}"
                                   for o in model.opset_import) + f"; ir {model.ir_version}"]
    lines += ["in  " + typed(v) for v in model.graph.input]
    lines += ["out " + typed(v) for v in model.graph.output]
    for node in _nodes(model.graph):
        attrs = []
        for attr in node.attribute:
            value = helper.get_attribute_value(attr)
            if isinstance(value, TensorProto):
                array = onnx.numpy_helper.to_array(value)
                value = f"{array.dtype}{list(array.shape)} {array.tolist()!r:.60}"
            elif isinstance(value, onnx.GraphProto):
                value = f"<graph {value.name}>"
            attrs.append(f"{attr.name}={value!r:.80}")
        lines.append(f"node {node.name!r}: {node.domain or '<default>'}::{node.op_type}"
                     f"({', '.join(node.input)}) -> ({', '.join(node.output)}) {' '.join(attrs)}")
    return "\n".join(lines)


# -- running --------------------------------------------------------------------------------


def run_one(src: str, dst: str) -> tuple[str, str]:
    """(decomposed | untouched | rejected, the refusal's class); raises on anything else
    (a crash)."""
    import decomposer

    try:
        report = decomposer.decompose_file(src, dst)
    except decomposer.DecomposerError as exc:
        # Exit 4 (PatternBugError: a pattern crashed; CheckFailedError: the result fails
        # the checker) is decomposer admitting a bug, not a refusal of the input.
        if exc.exit_code == 4:
            raise
        return "rejected", type(exc).__name__
    # decomposer promises full_check for what it rewrites, and the structural check for a
    # model it hands back untouched (nothing to rewrite).
    onnx.checker.check_model(dst, full_check=bool(report.replaced))
    return ("decomposed" if report.replaced else "untouched"), ""


# A worker's address-space limit: a pattern that tries to bake a tensor sized by an absurd
# static dim gets a MemoryError (a crash, reported) instead of exhausting a shared machine.
MEMORY_LIMIT = 4 << 30


def worker() -> None:
    """Read mutant paths on stdin, answer one JSON line each on stdout."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    for line in sys.stdin:
        src = line.strip()
        try:
            outcome, detail = run_one(src, src + ".out.onnx")
        except BaseException as exc:  # the crash we are looking for
            kind = type(exc).__name__
            if kind == "CheckFailedError":
                kind += f"[{_triage(src)}]"
            outcome, detail = "crash", f"{kind}: {_shorten(str(exc))}{_where(exc)}"
        print(json.dumps({"outcome": outcome, "detail": detail}), flush=True)


def _shorten(message: str, limit: int = 400) -> str:
    """The head (what failed) and the tail (the exception) of a long message."""
    if len(message) <= limit:
        return message
    return f"{message[:limit // 3]} [...] {message[-(2 * limit) // 3:]}"


def _triage(src: str) -> str:
    """Why a rewritten model failed the checker: "declared type" when the result infers
    cleanly once the input's declared output and value_info types are dropped (in every
    graph and body: the input claimed a type its op's semantics contradict, e.g. after a
    dtype or rank mutation), else "ill-typed" (the emitted nodes are inconsistent in
    themselves, or with the opset)."""
    import decomposer

    def undeclare(graph: onnx.GraphProto) -> None:
        del graph.value_info[:]
        for value in graph.output:
            value.ClearField("type")
        for node in graph.node:
            for attr in node.attribute:
                if attr.type == AttributeProto.GRAPH:
                    undeclare(attr.g)

    try:
        out = decomposer.decompose(onnx.load(src), check=False)
        undeclare(out.graph)
        onnx.shape_inference.infer_shapes(out, check_type=True, strict_mode=True)
    except Exception:  # still inconsistent without the declared types
        return "ill-typed"
    return "declared type"


def _where(exc: BaseException) -> str:
    """" at file:line" of the innermost frame in decomposer's code (a pattern's, usually)
    that raised ``exc`` or the exception it wraps."""
    root = exc.__cause__ or exc
    frames = [f for f in traceback.extract_tb(root.__traceback__)
              if "/patterns/" in f.filename or "/decomposer/" in f.filename]
    if not frames:
        return ""
    frame = frames[-1]
    return f" at {Path(frame.filename).parent.name}/{Path(frame.filename).name}:{frame.lineno}"


class Pool:
    """One worker process, restarted after a hang or a death."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> subprocess.Popen[str]:
        if self.process is None or self.process.poll() is not None:
            self.process = subprocess.Popen(
                [sys.executable, __file__, "--worker"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                env={**os.environ, "PYTHONHASHSEED": "0"})
        return self.process

    def run(self, path: str, timeout: float) -> dict:
        if self.process is None or self.process.poll() is not None:
            timeout = max(timeout, 60.0)  # a fresh worker's first answer includes its imports
        process = self.start()
        assert process.stdin and process.stdout
        process.stdin.write(path + "\n")
        process.stdin.flush()
        ready, _, _ = select.select([process.stdout], [], [], timeout)
        if not ready:
            process.kill()
            process.wait()
            return {"outcome": "hang", "detail": f"no answer in {timeout} s"}
        line = process.stdout.readline()
        if not line:
            code = process.wait()
            return {"outcome": "crash", "detail": f"worker died with exit code {code}"}
        return json.loads(line)

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def campaign(count: int, seed: int, timeout: float,
             keep: str | None = None) -> tuple[Counter, list[dict]]:
    """Run ``count`` mutants; (outcome counts, every crash and hang). ``keep``: a folder
    to save each crashing or hanging mutant in, as ``<seed>-<index>.onnx``."""
    counts: Counter = Counter()
    problems: list[dict] = []
    labels = [label for label, _ in labelled_seeds()]
    pool = Pool()
    with tempfile.TemporaryDirectory() as folder:
        try:
            for index, data in enumerate(make_mutants(count, seed)):
                path = os.path.join(folder, f"m{index}.onnx")
                Path(path).write_bytes(data)
                result = pool.run(path, timeout)
                counts[result["outcome"]] += 1
                counts["mutants"] += 1
                if result["outcome"] == "rejected":
                    counts["rejected by " + result["detail"]] += 1
                elif result["outcome"] in ("crash", "hang"):
                    counts[f"{result['outcome']}: {result['detail'].split(':')[0]}"] += 1
                if result["outcome"] in ("crash", "hang"):
                    problems.append({"index": index, "seed_model": labels[index % len(labels)],
                                     **result})
                    if keep:
                        Path(keep).mkdir(parents=True, exist_ok=True)
                        Path(keep, f"{seed}-{index}.onnx").write_bytes(data)
                for leftover in Path(folder).glob(f"m{index}.*"):
                    leftover.unlink()
        finally:
            pool.close()
    return counts, problems


def replay(paths: list[str], timeout: float) -> list[dict]:
    """Run saved mutants (``--keep``) again, e.g. to see which findings a fix closed."""
    results = []
    pool = Pool()
    with tempfile.TemporaryDirectory() as folder:
        try:
            for index, source in enumerate(paths):
                path = os.path.join(folder, f"r{index}.onnx")
                Path(path).write_bytes(Path(source).read_bytes())
                results.append({"path": source, **pool.run(path, timeout)})
                for leftover in Path(folder).glob(f"r{index}.*"):
                    leftover.unlink()
        finally:
            pool.close()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--json")
    parser.add_argument("--keep", metavar="DIR", help="save crashing and hanging mutants here")
    parser.add_argument("--describe", metavar="MODEL", help="print a saved mutant and exit")
    parser.add_argument("--replay", metavar="MODEL", nargs="+",
                        help="run saved mutants again (no campaign) and print their outcomes")
    parser.add_argument("--check-seeds", action="store_true",
                        help="only check that every seed decomposes cleanly")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker()
        return 0
    if args.describe:
        print(describe(onnx.load(args.describe)))
        return 0
    if args.replay:
        results = replay(args.replay, args.timeout)
        for result in results:
            print(f"{result['path']}: {result['outcome']} {result['detail']}")
        return 1 if any(r["outcome"] in ("crash", "hang") for r in results) else 0
    if args.check_seeds:
        problems_found = check_seeds()
        print(f"{len(labelled_seeds())} seeds, {len(problems_found)} problem(s)")
        for line in problems_found:
            print(f"  {line}")
        return 1 if problems_found else 0
    start = time.perf_counter()
    counts, problems = campaign(args.count, args.seed, args.timeout, args.keep)
    elapsed = time.perf_counter() - start
    print(f"mutants {counts['mutants']}, decomposed {counts['decomposed']}, "
          f"untouched {counts['untouched']}, rejected {counts['rejected']}, "
          f"crashes {counts['crash']}, hangs {counts['hang']} ({elapsed:.0f} s)")
    for prefix in ("rejected by ", "crash: ", "hang: "):
        found = [f"{key[len(prefix):]} {value}" for key, value in sorted(counts.items())
                 if key.startswith(prefix)]
        if found:
            print(f"  {prefix.strip(' :')}: " + ", ".join(found))
    for problem in problems[:20]:
        print(f"  mutant {problem['index']} (of {problem['seed_model']}): "
              f"{problem['outcome']}: {problem['detail']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"counts": dict(counts), "problems": problems},
                                              indent=2))
    return 1 if counts["crash"] or counts["hang"] else 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
