"""Cases shared by the two rotation pattern tests: shapes, k values, dtypes, the oracle, and
the node counts each form is expected to have."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import torch

from decomposer.testing import Case

KS = [0, 1, 2, 3, 5, -1]
OPSETS = [o for o in (11, 13, 18, 20, 23, 28) if o <= onnx.defs.onnx_opset_version()]
# Non-square H != W, batch > 1, and more shapes fed to the same model (all dims symbolic).
SHAPES = [(2, 3, 5, 7), (1, 1, 4, 2), (3, 2, 1, 6)]


def inputs(dtype=np.float32, shapes=SHAPES, seed=0):
    rng = np.random.default_rng(seed)
    sets = []
    for shape in shapes:
        if np.issubdtype(dtype, np.integer):
            sets.append([rng.integers(-100, 100, shape).astype(dtype)])
        else:
            sets.append([rng.normal(size=shape).astype(dtype)])
    return sets


def case(attrs, dtype=np.float32, shapes=SHAPES, label=""):
    sets = inputs(dtype, shapes)
    return Case(sets[0], attrs, symbolic="all", more_inputs=sets[1:], id=label)


def torch_rot_scale(x: np.ndarray, k: int, dims, scale: float) -> np.ndarray:
    """The oracle, in x's dtype: torch.rot90(x, k, dims) * scale."""
    rotated = torch.rot90(torch.from_numpy(np.ascontiguousarray(x)), k, list(dims))
    if scale == 1.0:
        return rotated.numpy()
    factor = int(scale) if not rotated.is_floating_point() else scale
    return (rotated * factor).numpy()


# One row flip: n = Gather(Shape(x), -2); index = (n - 1) - Range(0, n, 1); Gather(x, index).
FLIP = Counter({"Shape": 1, "Gather": 2, "Sub": 2, "Range": 1})


def expected_ops(turns: int, scaled: bool, target: str = "portable") -> Counter:
    """Non-Constant node counts of a decomposed rotation by ``turns`` (0..3) quarter turns."""
    ops: Counter = Counter()
    if turns in (1, 3):
        ops = FLIP + Counter({"Transpose": 1})
    elif turns == 2:
        ops = Counter({"Slice": 1}) if target == "ort" else \
            FLIP + FLIP + Counter({"Transpose": 2})
    if scaled:
        ops["Mul"] += 1
    elif turns == 0:
        ops["Identity"] += 1
    return ops


def negative_step_slices(model: onnx.ModelProto) -> list[str]:
    """Names of Slice nodes whose steps input is a Constant holding a negative value."""
    constants = {n.output[0]: onnx.numpy_helper.to_array(n.attribute[0].t)
                 for n in model.graph.node if n.op_type == "Constant"}
    return [n.name for n in model.graph.node if n.op_type == "Slice" and len(n.input) > 4
            and (constants.get(n.input[4]) is None or (constants[n.input[4]] < 0).any())]
