"""Fuzz decomposer with structure-aware and byte-level mutants of valid models.

In: ``--count N`` mutants (default 10000), ``--seed S``, ``--timeout SECONDS`` per mutant.
Out: one line of counts (mutants, decomposed, rejected, crashes, hangs) and, with
``--json FILE``, every non-clean outcome. Exit 1 if any mutant crashed or hung.

Every mutant must either decompose (and the written model then passes
``onnx.checker.check_model(full_check=True)``), come back untouched when nothing in it is
a custom node (and pass the structural check), or raise ``DecomposerError``. Anything
else is a crash: another exception, or the process dying. Mutants run in a worker
subprocess that is restarted when it dies or exceeds the per-mutant time limit (a hang),
so a native crash in onnx or ONNX Runtime cannot take the campaign down with it.

Mutations (seeded, reproducible): attribute types and values, arity and empty input
names, domain and op_type, opset imports (absurd versions included), dims (0, -1, 2**40)
and dtypes, node order, deleted outputs, colliding names; plus byte flips, truncation and
splices of the serialized model.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper

# -- seed corpus ----------------------------------------------------------------------------


def _vi(name, elem, dims):
    return helper.make_tensor_value_info(name, elem, dims)


def seed_models() -> list[onnx.ModelProto]:
    """Small valid models holding every custom-node form decomposer knows."""
    models = []
    for domain, opset in [("custom.ops", 16), ("", 13), ("ai.onnx.contrib", 20)]:
        for k in (2, 3):
            node = helper.make_node("AffineGrid", ["theta", "size"], ["grid"], name="affine",
                                    domain=domain, align_corners=k - 2)
            graph = helper.make_graph(
                [node, helper.make_node("Neg", ["grid"], ["out"], name="neg")], "affine",
                [_vi("theta", TensorProto.FLOAT, ["N", k, k + 1]),
                 _vi("size", TensorProto.INT64, [k + 2])],
                [_vi("out", TensorProto.FLOAT, [None] * (k + 2))])
            imports = [helper.make_opsetid("", opset)] + (
                [helper.make_opsetid(domain, 1)] if domain else [])
            models.append(helper.make_model(graph, opset_imports=imports, ir_version=8))
    aten = helper.make_graph(
        [helper.make_node("Constant", [], ["align"], name="c",
                          value=helper.make_tensor("v", TensorProto.BOOL, [], [True])),
         helper.make_node("ATen", ["theta", "size", "align"], ["grid"], name="aten",
                          domain="org.pytorch.aten", operator="affine_grid_generator")],
        "aten", [_vi("theta", TensorProto.FLOAT, [2, 2, 3]), _vi("size", TensorProto.INT64, [4])],
        [_vi("grid", TensorProto.FLOAT, [None] * 4)])
    models.append(helper.make_model(aten, opset_imports=[
        helper.make_opsetid("", 16), helper.make_opsetid("org.pytorch.aten", 1)], ir_version=8))
    for op, attrs in [("Rot90AndScale", {"k": 3, "scale": 2.0, "clockwise": "yes"}),
                      ("CustomRotScale", {"rotations": 2, "scale_factor": 1.5,
                                          "dims": "width,height"})]:
        rot = helper.make_graph(
            [helper.make_node(op, ["x"], ["y"], name="rot", domain="custom.ops", **attrs),
             helper.make_node(op, ["y"], ["z"], name="rot2", domain="custom.ops")],
            "rot", [_vi("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
            [_vi("z", TensorProto.FLOAT, [None] * 4)])
        models.append(helper.make_model(rot, opset_imports=[
            helper.make_opsetid("", 17), helper.make_opsetid("custom.ops", 1)], ir_version=8))
    then = helper.make_graph([helper.make_node("Rot90AndScale", ["x"], ["t"], name="in_if",
                                               domain="custom.ops", k=1)],
                             "then", [], [_vi("t", TensorProto.FLOAT, [None] * 4)])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"], name="id")],
                              "else", [], [_vi("e", TensorProto.FLOAT, [None] * 4)])
    branchy = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], name="if", then_branch=then, else_branch=other)],
        "if", [_vi("x", TensorProto.FLOAT, [1, 2, 3, 3]), _vi("c", TensorProto.BOOL, [])],
        [_vi("y", TensorProto.FLOAT, [None] * 4)])
    models.append(helper.make_model(branchy, opset_imports=[
        helper.make_opsetid("", 16), helper.make_opsetid("custom.ops", 1)], ir_version=8))
    return models


# -- mutators -------------------------------------------------------------------------------

_DOMAINS = ["", "ai.onnx", "custom.ops", "org.pytorch.aten", "ai.onnx.ml", "x" * 300, "é.ops"]
_OPS = ["AffineGrid", "Rot90AndScale", "CustomRotScale", "ATen", "affine_grid_generator",
        "Relu", "If", "Loop", "Unknown", ""]
_DIMS = [0, -1, 1, 2, 3, 5, 2**40, 2**62]
_INTS = [0, 1, -1, 2, 3, 5, 2**31, -(2**63), 2**63 - 1]


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


def mutate_structure(model: onnx.ModelProto, rng: random.Random) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for _ in range(rng.randint(1, 3)):
        nodes = _nodes(m.graph)
        node = rng.choice(nodes)
        kind = rng.randrange(11)
        if kind == 0 and node.attribute:  # attribute type and value
            attr = rng.choice(node.attribute)
            attr.CopyFrom(_random_attribute(rng, attr.name))
        elif kind == 1:  # a new or renamed attribute
            node.attribute.append(_random_attribute(rng, rng.choice(
                ["k", "scale", "align_corners", "operator", "dims", "zzz"])))
        elif kind == 2:  # arity and empty names
            if node.input and rng.random() < 0.5:
                del node.input[rng.randrange(len(node.input))]
            else:
                node.input.insert(rng.randrange(len(node.input) + 1),
                                  rng.choice(["", "theta", "size", "x", "nowhere"]))
        elif kind == 3:
            node.domain = rng.choice(_DOMAINS)
        elif kind == 4:
            node.op_type = rng.choice(_OPS)
        elif kind == 5:  # opset imports, absurd versions included
            if m.opset_import and rng.random() < 0.7:
                rng.choice(m.opset_import).version = rng.choice([0, -1, 1, 10, 28, 10**9, 2**62])
            else:
                m.opset_import.append(helper.make_opsetid(rng.choice(_DOMAINS),
                                                          rng.choice([1, 16, 99])))
        elif kind == 6:  # dims and dtypes of inputs
            value = rng.choice(list(m.graph.input) or [None])
            if value is not None:
                tensor = value.type.tensor_type
                if rng.random() < 0.5 and tensor.shape.dim:
                    rng.choice(tensor.shape.dim).dim_value = rng.choice(_DIMS)
                else:
                    tensor.elem_type = rng.choice([0, 1, 2, 6, 7, 8, 9, 10, 11, 16, 1000])
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


# -- running --------------------------------------------------------------------------------


def run_one(src: str, dst: str) -> str:
    """decomposed | rejected; raises on anything else (a crash)."""
    import decomposer

    try:
        report = decomposer.decompose_file(src, dst)
    except decomposer.DecomposerError:
        return "rejected"
    # decomposer promises full_check for what it rewrites, and the structural check for a
    # model it hands back untouched (nothing to rewrite).
    onnx.checker.check_model(dst, full_check=bool(report.replaced))
    return "decomposed" if report.replaced else "untouched"


def worker() -> None:
    """Read mutant paths on stdin, answer one JSON line each on stdout."""
    for line in sys.stdin:
        src = line.strip()
        try:
            outcome, detail = run_one(src, src + ".out.onnx"), ""
        except BaseException as exc:  # the crash we are looking for
            outcome, detail = "crash", f"{type(exc).__name__}: {str(exc)[:300]}"
        print(json.dumps({"outcome": outcome, "detail": detail}), flush=True)


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


def campaign(count: int, seed: int, timeout: float) -> tuple[Counter, list[dict]]:
    counts: Counter = Counter()
    problems: list[dict] = []
    pool = Pool()
    # The first answer includes the worker's imports; give it room.
    first_timeout = max(timeout, 60.0)
    with tempfile.TemporaryDirectory() as folder:
        try:
            for index, data in enumerate(make_mutants(count, seed)):
                path = os.path.join(folder, f"m{index}.onnx")
                Path(path).write_bytes(data)
                result = pool.run(path, first_timeout if index == 0 else timeout)
                counts[result["outcome"]] += 1
                counts["mutants"] += 1
                if result["outcome"] in ("crash", "hang"):
                    problems.append({"index": index, **result})
                for leftover in Path(folder).glob(f"m{index}.*"):
                    leftover.unlink()
        finally:
            pool.close()
    return counts, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--json")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker()
        return 0
    start = time.perf_counter()
    counts, problems = campaign(args.count, args.seed, args.timeout)
    elapsed = time.perf_counter() - start
    print(f"mutants {counts['mutants']}, decomposed {counts['decomposed']}, "
          f"untouched {counts['untouched']}, rejected {counts['rejected']}, "
          f"crashes {counts['crash']}, hangs {counts['hang']} ({elapsed:.0f} s)")
    for problem in problems[:20]:
        print(f"  mutant {problem['index']}: {problem['outcome']}: {problem['detail']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"counts": dict(counts), "problems": problems},
                                              indent=2))
    return 1 if counts["crash"] or counts["hang"] else 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
