"""LSTM as unrolled cells (MatMul, Sigmoid, Tanh), for ``--lower LSTM`` and the engine
targets whose engine has no LSTM (TVM's Relax importer: "operators are not supported for
frontend ONNX: LSTM").

Matches ``LSTM(X, W, R, [B], [sequence_lens], [initial_h], [initial_c], [P];
activations, activation_alpha, activation_beta, clip, direction, hidden_size,
input_forget, layout)`` in the default domain where it is lowered. Semantics are ONNX's
(gates in i, o, f, c order; peepholes P in i, o, f order)::

    i = f(Xt Wi + H Ri + Pi * C + Wbi + Rbi)      c~ = g(Xt Wc + H Rc + Wbc + Rbc)
    f = f(Xt Wf + H Rf + Pf * C + Wbf + Rbf)      C  = f * C + i * c~
    o = f(Xt Wo + H Ro + Po * C + Wbo + Rbo)      H  = o * h(C)

Before -> after (per direction; S steps)::

    LSTM(X, W, R, B)  ->  XW = MatMul(X, W^T) + (Wb + Rb)     (every step at once)
                          Split(XW) into steps; per step t: Split(XW_t + MatMul(H, R^T))
                          -> the cell (H, C kept (1, B, H));
                          Y = Unsqueeze(Concat(H_t)), Y_h = H_last, Y_c = C_last

The reverse direction walks t = S-1 .. 0 and writes each H_t at its own time index, as
ONNX's does. With no initial state the first step skips the H and C terms (they are
zero). ``clip`` bounds every gate's pre-activation, as ONNX Runtime does.

Refused with the reason: a sequence length that is not static (the cells are unrolled),
more than 1024 steps, ``sequence_lens`` not a constant equal to the sequence length
everywhere (padded sequences stop early), ``input_forget=1``, activations other than
Sigmoid, Tanh and Relu.

Envelope: opsets 11+ (``layout`` from 14); float32/float64 (float16 in float32); batch
and weights may be dynamic; forward, reverse and bidirectional.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, Value
from decomposer.checks import require_shape, require_type
from decomposer.examples import Example, F
from decomposer.forms import Attr, Form, In, Reject
from decomposer.opsets import LOWERING_DOMAIN
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

from ._compute import ComputeType

_TYPES = (TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE)
MAX_STEPS = 1024  # unrolled cells (about 15 nodes each)
_ACTIVATIONS = {"sigmoid": "Sigmoid", "tanh": "Tanh", "relu": "Relu"}
_NUMPY_ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)), "Tanh": np.tanh,
    "Relu": lambda x: np.maximum(x, 0)}
_DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}


class Facts(NamedTuple):
    elem_type: int
    steps: int
    directions: tuple[bool, ...]  # reversed?, per direction
    hidden: int
    activations: tuple[tuple[str, str, str], ...]  # (f, g, h) per direction
    clip: float | None
    layout: int
    batch: int | str | None


def _activations(names: list[str] | None, directions: int) -> tuple[tuple[str, str, str], ...]:
    names = list(names or ["Sigmoid", "Tanh", "Tanh"] * directions)
    if len(names) != 3 * directions:
        raise Reject(f"{len(names)} activations for {directions} direction(s); LSTM takes 3 "
                     "per direction")
    picked = []
    for name in names:
        op = _ACTIVATIONS.get(name.lower())
        if op is None:
            raise Reject(f"activation {name!r} is not lowered (Sigmoid, Tanh, Relu are)")
        picked.append(op)
    return tuple((picked[3 * d], picked[3 * d + 1], picked[3 * d + 2])
                 for d in range(directions))


def cell_facts(node: MatchedNode, ctx: MatchContext, float_roles: tuple[str, ...],
               types: tuple[int, ...]) -> Facts:
    """The facts of an LSTM-like node (ONNX's LSTM, ONNX Runtime's DynamicQuantizeLSTM):
    Reject where the cells cannot be unrolled as ONNX defines them; ``float_roles`` are
    the inputs of X's type."""
    args = node.args
    if args["input_forget"]:
        raise Reject("input_forget=1 (coupled input and forget gates) is not lowered")
    x = node.tensor("X")
    elem_type = require_type(ctx, x, "X", types)
    for role in float_roles:
        if node.tensor(role):  # ONNX's T: every float input is X's type
            require_type(ctx, node.tensor(role), role, (elem_type,))
    shape = require_shape(ctx, x, "X", "to unroll its steps", min_rank=3)
    layout = int(args.get("layout", 0))
    steps = shape[1] if layout else shape[0]
    if not isinstance(steps, int):
        raise Reject("the sequence length is not static: the cells are unrolled (a fixed "
                     "length: --overwrite-input-shape on the input it comes from)")
    if steps > MAX_STEPS:
        raise Reject(f"{steps} steps is more than the {MAX_STEPS} unrolled cells allowed")
    if steps < 1:
        raise Reject("an empty sequence (0 steps) has no cells to unroll")
    if args["activation_alpha"] or args["activation_beta"]:
        raise Reject("activation_alpha/beta are set (only Sigmoid, Tanh, Relu lowered)")
    count = _DIRECTIONS[args["direction"]]
    directions = (False, True) if count == 2 else (args["direction"] == "reverse",)
    hidden = args["hidden_size"]
    r_shape = ctx.shape(node.tensor("R"))
    if hidden is None:
        if not r_shape or not isinstance(r_shape[-1], int):
            raise Reject("hidden_size is not given and R's shape is unknown")
        hidden = r_shape[-1]
    lengths = node.tensor("sequence_lens")
    if lengths:
        value = ctx.constant(lengths)
        if value is None or np.any(np.asarray(value) != steps):
            raise Reject("sequence_lens is not a constant equal to the sequence length "
                         "for every batch entry (the unrolled cells run every step)")
    batch = shape[0] if layout else shape[1]
    return Facts(elem_type, steps, directions, int(hidden),
                 _activations(args["activations"], count), args["clip"], layout, batch)


# the inputs and attributes ONNX's LSTM and ONNX Runtime's DynamicQuantizeLSTM share
CELL_INPUTS = (In("X"), In("W"), In("R"), In("B", optional=True),
               In("sequence_lens", optional=True), In("initial_h", optional=True),
               In("initial_c", optional=True), In("P", optional=True))
CELL_ATTRIBUTES = {
    "activation_alpha": Attr("floats", default=None),
    "activation_beta": Attr("floats", default=None),
    "activations": Attr("strings", default=None),
    "clip": Attr("float", default=None),
    "direction": Attr("string", default="forward", choices=tuple(_DIRECTIONS)),
    "hidden_size": Attr("int", default=None),
    "input_forget": Attr("int", default=0, choices=(0, 1))}


def direction_slice(b: Builder, weights: dict[str, Value | None], d: int
                    ) -> dict[str, Value | None]:
    """Direction d of each per-direction input: W, R, B, P as that direction's matrix or
    vector, initial_h and initial_c kept (1, B, H)."""
    index = b.const(np.array(d, np.int64), hint="direction")
    return {role: None if value is None else
            b.Gather(value, index, axis=0, hint=f"{role}{d}") if role in ("W", "R", "B", "P")
            else b.Slice(value, [d], [d + 1], [0], hint=f"{role}{d}")
            for role, value in weights.items()}


def cell_output_types(facts: Facts, elem_type: int, outputs: int) -> list[OutputType]:
    """Y (S, D, B, H), Y_h and Y_c (D, B, H), batch first with ``layout=1``."""
    count, batch = len(facts.directions), facts.batch
    shapes: list[list[int | str | None]] = \
        [[facts.steps, count, batch, facts.hidden], [count, batch, facts.hidden],
         [count, batch, facts.hidden]]
    if facts.layout:
        shapes = [[batch, facts.steps, count, facts.hidden],
                  [batch, count, facts.hidden], [batch, count, facts.hidden]]
    return [(elem_type, shape) for shape in shapes[:outputs]]


class Products:
    """How a direction's cells get their matrix products: ``inputs(d)``, every step's
    input part (S, B, 4H) at once, and ``hidden(h, d, t)``, a step's (1, B, 4H) from the
    previous H. ``bias_in_gates``: add each gate's bias after its peephole term, as ONNX
    Runtime's kernels order the sums (else the bias joins the input part once)."""

    bias_in_gates = False

    def inputs(self, b: Builder, d: int) -> Value:
        raise NotImplementedError

    def hidden(self, b: Builder, h: Value, d: int, t: int) -> Value:
        raise NotImplementedError


class FloatProducts(Products):
    """ONNX's LSTM: MatMul with W^T and R^T."""

    def __init__(self, x: Value, w: Value, r: Value) -> None:
        self.x, self.w, self.r = x, w, r
        self.r_t: Value | None = None

    def inputs(self, b: Builder, d: int) -> Value:
        return b.MatMul(self.x, b.Transpose(self.w, [1, 0], hint=f"w_t{d}"), hint=f"xw{d}")

    def hidden(self, b: Builder, h: Value, d: int, t: int) -> Value:
        if self.r_t is None:
            self.r_t = b.Transpose(self.r, [1, 0], hint=f"r_t{d}")
        return b.MatMul(h, self.r_t, hint=f"hr{d}_t{t}")


def direction_cells(b: Builder, dtype: np.dtype[Any], facts: Facts,
                    weights: dict[str, Value | None], products: Products, d: int,
                    backwards: bool) -> tuple[Value, Value, Value]:
    """One direction's cells: its Y (S, 1, B, H), last H and last C (1, B, H);
    ``weights`` holds direction d's B (8H), P (3H), initial_h and initial_c (1, B, H)."""
    xw = products.inputs(b, d)  # (S, B, 4H)
    bias = weights["B"]
    gate_biases: list[Value] | None = None
    if bias is not None:
        wb, rb = b.Split(bias, 2, axis=0, hint=f"biases{d}")
        joined = b.Add(wb, rb, hint=f"bias{d}")
        if products.bias_in_gates:
            gate_biases = list(b.Split(joined, 4, axis=0, hint=f"gate_biases{d}"))
        else:
            xw = b.Add(xw, joined, hint=f"xw_b{d}")
    peep = weights["P"]
    p_i, p_o, p_f = b.Split(peep, 3, axis=0, hint=f"peepholes{d}") \
        if peep is not None else (None, None, None)
    h, c = weights["initial_h"], weights["initial_c"]
    act_f, act_g, act_h = facts.activations[d]

    def act(op: str, v: Value, hint: str) -> Value:
        if facts.clip is not None:
            bound = np.asarray(facts.clip, dtype)
            v = b.Clip(v, b.const(-bound), b.const(bound), hint=f"{hint}_clip")
        return b.op(op, v, hint=hint, dtype=dtype)

    def biased(v: Value, gate: int, hint: str) -> Value:
        return v if gate_biases is None else b.Add(v, gate_biases[gate], hint=hint)

    states: dict[int, Value] = {}
    # every step's input part at once: one Split, not a Gather per step
    inputs = b.Split(xw, facts.steps, axis=0, hint=f"xw{d}_steps") \
        if facts.steps > 1 else [xw]
    for t in range(facts.steps - 1, -1, -1) if backwards else range(facts.steps):
        gates = inputs[t]  # (1, B, 4H)
        if h is not None:  # (no initial state: H and C are zero at the first step)
            gates = b.Add(gates, products.hidden(b, h, d, t), hint=f"gates{d}_t{t}")
        g_i, g_o, g_f, g_c = b.Split(gates, 4, axis=2, hint=f"gate{d}_t{t}")
        if c is not None and p_i is not None and p_f is not None:
            g_i = b.Add(g_i, b.Mul(c, p_i, hint=f"pi{d}_t{t}"), hint=f"gi{d}_t{t}")
            g_f = b.Add(g_f, b.Mul(c, p_f, hint=f"pf{d}_t{t}"), hint=f"gf{d}_t{t}")
        g_i = biased(g_i, 0, f"gi_b{d}_t{t}")
        g_f = biased(g_f, 2, f"gf_b{d}_t{t}")
        g_c = biased(g_c, 3, f"gc_b{d}_t{t}")
        new_c = b.Mul(act(act_f, g_i, f"i{d}_t{t}"), act(act_g, g_c, f"c~{d}_t{t}"),
                      hint=f"ic{d}_t{t}")
        if c is not None:
            forget = act(act_f, g_f, f"f{d}_t{t}")
            new_c = b.Add(b.Mul(c, forget, hint=f"fc{d}_t{t}"), new_c, hint=f"c{d}_t{t}")
        if p_o is not None:
            g_o = b.Add(g_o, b.Mul(new_c, p_o, hint=f"po{d}_t{t}"), hint=f"go{d}_t{t}")
        g_o = biased(g_o, 1, f"go_b{d}_t{t}")
        h = b.Mul(b.op(act_h, new_c, hint=f"hc{d}_t{t}", dtype=dtype),
                  act(act_f, g_o, f"o{d}_t{t}"), hint=f"h{d}_t{t}")
        c = new_c
        states[t] = h
    assert h is not None and c is not None
    y = b.Concat(*[states[t] for t in range(facts.steps)], axis=0, hint=f"y{d}_steps")
    return b.Unsqueeze(y, [1], hint=f"y{d}"), h, c


class LSTM(Pattern[Facts]):
    op_type = "LSTM"
    forms = (Form("LSTM", domains=frozenset({"", LOWERING_DOMAIN}), inputs=CELL_INPUTS,
                  attributes={**CELL_ATTRIBUTES,
                              "layout": Attr("int", default=0, choices=(0, 1))},
                  outputs=(0, 3)),)
    examples = (
        Example((("x", F, (5, "N", 4)), ("w", F, (1, 12, 4)), ("r", F, (1, 12, 3)),
                 ("b", F, (1, 24))), ((F, 4), (F, 3), (F, 3)),
                attrs={"hidden_size": 3}, domains=((LOWERING_DOMAIN, 14),)),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        return cell_facts(node, ctx, float_roles=("W", "R", "B", "initial_h", "initial_c",
                                                  "P"), types=_TYPES)

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        compute = ComputeType(b, node, facts.elem_type)
        x = compute.read("X")
        assert x is not None
        if facts.layout:
            x = b.Transpose(x, [1, 0, 2], hint="x_time_major")
        weights = {role: compute.read(role) for role in ("W", "R", "B", "initial_h",
                                                         "initial_c", "P")}
        if facts.layout:  # initial states (B, D, H) -> (D, B, H)
            for role in ("initial_h", "initial_c"):
                state = weights[role]
                if state is not None:
                    weights[role] = b.Transpose(state, [1, 0, 2], hint=f"{role}_dir_major")
        outputs_y, last_h, last_c = [], [], []
        for d, backwards in enumerate(facts.directions):
            # weights as (rows, cols) of direction d; states kept (1, B, H), as Y_h holds them
            picked = direction_slice(b, weights, d)
            w, r = picked["W"], picked["R"]
            assert w is not None and r is not None
            y, h, c = direction_cells(b, compute.dtype, facts, picked, FloatProducts(x, w, r),
                                      d, backwards)
            outputs_y.append(y)
            last_h.append(h)
            last_c.append(c)
        results = [b.Concat(*outputs_y, axis=1, hint="y"), b.Concat(*last_h, axis=0, hint="y_h"),
                   b.Concat(*last_c, axis=0, hint="y_c")]
        if facts.layout:
            results = [b.Transpose(results[0], [2, 0, 1, 3], hint="y_batch_major"),
                       b.Transpose(results[1], [1, 0, 2], hint="y_h_batch_major"),
                       b.Transpose(results[2], [1, 0, 2], hint="y_c_batch_major")]
        for index, name in enumerate(node.outputs):
            if name:
                compute.write(results[index], name)

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        return cell_output_types(facts, facts.elem_type, len(node.outputs))

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None) -> list[np.ndarray]:
        """ONNX's equations in float64 numpy, step by step."""
        x = tensors["X"]
        w, r = tensors["W"], tensors["R"]
        assert x is not None and w is not None and r is not None
        dtype = x.dtype
        states = {role: tensors[role] for role in ("initial_h", "initial_c")}
        if args["layout"]:
            x = x.transpose(1, 0, 2)
            states = {role: None if v is None else v.transpose(1, 0, 2)
                      for role, v in states.items()}
        steps, batch = x.shape[0], x.shape[1]
        count = w.shape[0]
        hidden = r.shape[-1]
        names = _activations(args["activations"], count)
        clip = args["clip"]
        y = np.zeros((steps, count, batch, hidden))
        y_h = np.zeros((count, batch, hidden))
        y_c = np.zeros((count, batch, hidden))
        for d in range(count):
            backwards = args["direction"] == "reverse" or d == 1
            bias = tensors["B"][d].astype(np.float64) if tensors["B"] is not None \
                else np.zeros(8 * hidden)
            peep = tensors["P"][d].astype(np.float64) if tensors["P"] is not None \
                else np.zeros(3 * hidden)
            h0, c0 = states["initial_h"], states["initial_c"]
            h = h0[d].astype(np.float64) if h0 is not None else np.zeros((batch, hidden))
            c = c0[d].astype(np.float64) if c0 is not None else np.zeros((batch, hidden))
            f_act, g_act, h_act = (_NUMPY_ACTIVATIONS[n] for n in names[d])

            def gate(v: np.ndarray, fn: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
                return fn(np.clip(v, -clip, clip) if clip is not None else v)
            for t in (range(steps - 1, -1, -1) if backwards else range(steps)):
                z = x[t].astype(np.float64) @ w[d].T.astype(np.float64) + \
                    h @ r[d].T.astype(np.float64) + bias[:4 * hidden] + bias[4 * hidden:]
                zi, zo, zf, zc = np.split(z, 4, axis=1)
                i = gate(zi + peep[:hidden] * c, f_act)
                f = gate(zf + peep[2 * hidden:] * c, f_act)
                c = f * c + i * gate(zc, g_act)
                o = gate(zo + peep[hidden:2 * hidden] * c, f_act)
                h = o * h_act(c)
                y[t, d] = h
            y_h[d], y_c[d] = h, c
        results = [y, y_h, y_c]
        if args["layout"]:
            results = [y.transpose(2, 0, 1, 3), y_h.transpose(1, 0, 2),
                       y_c.transpose(1, 0, 2)]
        return [a.astype(dtype) for a in results]


PATTERNS = [LSTM()]
