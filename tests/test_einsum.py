"""Einsum at opset 11 against torch.einsum: matmuls, batch and broadcast ellipsis, sums,
transposes, outer and inner products, three operands, diagonals, implicit outputs; through
the kit (dynamic dims, two sizes) and ``--target-opset 11``."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import decomposer
from decomposer.patterns.einsum import Einsum
from decomposer.testing import Case, check_pattern, run_onnxruntime

EQUATIONS = [
    ("ij,jk->ik", [(3, 4), (4, 5)], [(2, 7), (7, 1)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)], [(1, 2, 3), (1, 3, 2)]),
    ("...ij,...jk->...ik", [(2, 2, 3, 4), (2, 4, 5)], [(1, 3, 2, 2), (3, 2, 6)]),
    ("ij->ji", [(3, 4)], [(1, 6)]),
    ("ij->i", [(3, 4)], [(5, 2)]),
    ("i,j->ij", [(3,), (4,)], [(1,), (2,)]),
    ("i,i", [(5,)], [(2,)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)], [(1, 2), (2, 2), (2, 3)]),
    ("bii->bi", [(2, 3, 3)], [(1, 4, 4)]),
    ("ij,kj", [(2, 3), (4, 3)], [(1, 5), (2, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)], [(1, 1, 2, 3), (1, 1, 2, 3)]),
    # groups of several letters flattened (constant targets where static, -1/0 else)
    ("abc,cd->abd", [(2, 3, 4), (4, 5)], [(1, 2, 3), (3, 2)]),
    ("abcd,cde->abe", [(2, 3, 4, 5), (4, 5, 6)], [(1, 1, 2, 2), (2, 2, 3)]),
    ("ab,cd->abcd", [(2, 3), (4, 5)], [(1, 2), (3, 1)]),
]


def _arrays(rng, shapes, dtype):
    if np.issubdtype(dtype, np.integer):
        return [rng.integers(-5, 6, s).astype(dtype) for s in shapes]
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


@pytest.mark.parametrize("equation, shapes, more", EQUATIONS, ids=[e for e, *_ in EQUATIONS])
def test_against_torch_einsum(equation, shapes, more):
    rng = np.random.default_rng(len(equation))
    if equation == "i,i":  # two operands, one shape
        shapes, more = shapes * 2, more * 2
    dtypes = [np.float32, np.int64] if "." not in equation else [np.float32]
    for dtype in dtypes:
        first, second = _arrays(rng, shapes, dtype), _arrays(rng, more, dtype)

        def oracle(*operands, equation=equation):
            return torch.einsum(equation, *[torch.from_numpy(o) for o in operands]).numpy()

        expected_rank = oracle(*first).ndim
        cases = [Case(first, {"equation": equation}, symbolic="all", more_inputs=[second],
                      output_rank=expected_rank, id=dtype.__name__),
                 Case(second, {"equation": equation}, output_rank=expected_rank,
                      id=f"{dtype.__name__} static")]
        tolerance = 0 if np.issubdtype(dtype, np.integer) else 1e-5
        check_pattern(Einsum(), cases, opsets=[11], domain="", oracle=oracle,
                      atol=tolerance, rtol=tolerance)


def test_target_opset_11_from_12():
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["b", 4, 8])
    w = helper.make_tensor_value_info("w", TensorProto.FLOAT, [8, 6])
    graph = helper.make_graph([helper.make_node("Einsum", ["a", "w"], ["y"], name="proj",
                                                equation="bsd,de->bse")], "g", [a, w],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                             ["b", 4, 6])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])
    out, report = decomposer.decompose_with_report(model, target_opset=11)
    onnx.checker.check_model(out, full_check=True)
    assert report.counts == {"Einsum": 1}
    rng = np.random.default_rng(0)
    left, right = rng.standard_normal((3, 4, 8)).astype(np.float32), \
        rng.standard_normal((8, 6)).astype(np.float32)
    (got,) = run_onnxruntime(out, {"a": left, "w": right})
    want = torch.einsum("bsd,de->bse", torch.from_numpy(left), torch.from_numpy(right))
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)


def portability_cases():
    """Einsum at opset 11: a batch matmul with a broadcast ellipsis and a diagonal sum;
    torch.einsum the oracle."""
    rng = np.random.default_rng(15)
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", 3, 4])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [4, 5])
    c = helper.make_tensor_value_info("c", TensorProto.FLOAT, ["n", 3, 3])
    e = helper.make_tensor_value_info("e", TensorProto.FLOAT, ["n", "m", "p", "q"])
    f = helper.make_tensor_value_info("f", TensorProto.FLOAT, ["p", "q", 6])
    graph = helper.make_graph(
        [helper.make_node("Einsum", ["a", "b"], ["y"], equation="...ij,jk->...ik"),
         helper.make_node("Einsum", ["c"], ["d"], equation="bii->bi"),
         # two letters flattened, one of them dynamic: a -1 target
         helper.make_node("Einsum", ["a", "b"], ["z"], equation="abc,cd->abd"),
         # two groups of two dynamic letters: no constant target, multiplied at full rank
         helper.make_node("Einsum", ["e", "f"], ["g"], equation="abcd,cde->abe")],
        "einsum", [a, b, c, e, f],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3, 5]),
         helper.make_tensor_value_info("d", TensorProto.FLOAT, ["n", 3]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", 3, 5]),
         helper.make_tensor_value_info("g", TensorProto.FLOAT, ["n", "m", 6])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    feeds, expected = [], []
    for rows in (2, 1):
        values = {"a": rng.standard_normal((rows, 3, 4)).astype(np.float32),
                  "b": rng.standard_normal((4, 5)).astype(np.float32),
                  "c": rng.standard_normal((rows, 3, 3)).astype(np.float32),
                  "e": rng.standard_normal((rows, 3, 4, 2)).astype(np.float32),
                  "f": rng.standard_normal((4, 2, 6)).astype(np.float32)}
        feeds.append(values)
        t = {k: torch.from_numpy(v) for k, v in values.items()}
        expected.append([torch.einsum("...ij,jk->...ik", t["a"], t["b"]).numpy(),
                         torch.einsum("bii->bi", t["c"]).numpy(),
                         torch.einsum("abc,cd->abd", t["a"], t["b"]).numpy(),
                         torch.einsum("abcd,cde->abe", t["e"], t["f"]).numpy()])
    return [{"id": "Einsum at 11", "model": model, "feeds": feeds, "expected": expected,
             "atol": 1e-5}]
