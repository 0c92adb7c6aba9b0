"""ONNX Runtime's com.microsoft ``DynamicQuantizeLSTM`` (what ``quantize_dynamic`` writes
for an LSTM) as unrolled cells on standard integer ops, quantizing the input and each
step's hidden state at run time as the kernel does.

Matches ``DynamicQuantizeLSTM(X, W, R, [B], [sequence_lens], [initial_h], [initial_c],
[P], W_scale, W_zero_point, R_scale, R_zero_point; activation_alpha, activation_beta,
activations, clip, direction, hidden_size, input_forget)`` in com.microsoft
(docs/ContribOperators.md). Semantics are ONNX Runtime 1.32's CPU kernel's
(contrib_ops/cpu/quantization/dynamic_quantize_lstm.cc on core/providers/cpu/rnn's
UniDirectionalLstm and rnn_helpers.cc's quantized ComputeGemm): ONNX's LSTM equations
(gates i, o, f, c) with

- W (D, input, 4H) and R (D, H, 4H), int8 or uint8, already transposed; W_scale and
  W_zero_point (alike R's) per direction (D) or per direction and column (D, 4H). The
  kernel reads only the first zero point of a direction (it requires int8 zero points to
  be 0 and uint8 ones to be equal across the columns);
- ``X W`` for every step at once, X quantized once over the whole tensor to uint8 with
  ONNX Runtime's dynamic parameters (range widened to hold 0, scale (max - min) / 255, 1
  for an all-zero range; DynamicQuantizeLinear); then at each step ``H R``, H quantized
  the same way, each product ``float(integer product) * (a_scale * w_scale)``;
- the sums in the kernel's order: ``((X W + H R) + C * P) + (Wb + Rb)`` per gate.

Before -> after (per direction; S steps)::

    DynamicQuantizeLSTM  ->  q, s, z = DynamicQuantizeLinear(X)
                             XW = Cast(MatMulInteger(q, W[d], z, W_zp[d]), float)
                                  * (s * W_scale[d])
                             per step t: qh, sh, zh = DynamicQuantizeLinear(H)
                               gates = XW_t + Cast(MatMulInteger(qh, R[d], zh, R_zp[d]))
                                       * (sh * R_scale[d])
                             -> the cells of patterns/lstm.py, biases per gate

ONNX Runtime splits the batch across its threads for the hidden-state products when the
batch is larger than 4, or at least 2 with H <= 256, and quantizes each part on its own,
so its result depends on its thread count. This lowering quantizes the whole batch at
once: the kernel's numbers with one intra-op thread, or with batch 1 (streaming) at any
thread count; otherwise within a quantization step of H per step.

Refused with the reason, besides the LSTM lowering's own limits (a static sequence length
of at most 1024 steps, no partial ``sequence_lens``, ``input_forget=0``, Sigmoid, Tanh and
Relu activations): weights or zero points of other types, scales that are not float32, a
scale or zero point shaped otherwise than (D) or (D, 4H).

Envelope: opsets 11+; X float32; the batch and every weight may be dynamic; forward,
reverse and bidirectional.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, Value
from decomposer.checks import require_type
from decomposer.examples import Example, F
from decomposer.forms import Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

from . import lstm
from .contrib_quantized_matmul import dynamic_quantize_reference

MS = frozenset({"com.microsoft"})
U8, I8 = TensorProto.UINT8, TensorProto.INT8
_NUMPY: dict[int, Any] = {U8: np.uint8, I8: np.int8}


class Facts(NamedTuple):
    cells: lstm.Facts
    weight_types: dict[str, int]  # "W", "R" -> int8 or uint8
    per_column: dict[str, bool]  # "W", "R" -> scale and zero point (D, 4H)?


class _QuantizedProducts(lstm.Products):
    """The kernel's products: X quantized once (shared by both directions), H per step."""

    bias_in_gates = True

    def __init__(self, node: MatchedNode, facts: Facts, x_quantized: tuple[Value, ...],
                 picked: dict[str, dict[str, Value]]) -> None:
        self.node, self.facts, self.x_quantized, self.picked = node, facts, x_quantized, picked

    def _product(self, b: Builder, quantized: tuple[Value, ...], role: str, hint: str
                 ) -> Value:
        q, scale, zero = quantized
        weights = self.picked[role]
        product = b.op("MatMulInteger", q, weights["data"], zero, weights["zero"],
                       hint=f"{hint}_integer", dtype=np.int32)
        # the kernel's order: the combined scale first, then the product
        combined = b.Mul(scale, weights["scale"], hint=f"{hint}_scale")
        return b.Mul(b.Cast(product, np.float32, hint=f"{hint}_float"), combined, hint=hint)

    def inputs(self, b: Builder, d: int) -> Value:
        return self._product(b, self.x_quantized, "W", f"xw{d}")

    def hidden(self, b: Builder, h: Value, d: int, t: int) -> Value:
        quantized = b.op_multi("DynamicQuantizeLinear", [h], 3, hint=f"h{d}_t{t}_dynamic",
                               dtypes=[np.uint8, np.float32, np.uint8])
        return self._product(b, tuple(quantized), "R", f"hr{d}_t{t}")


class DynamicQuantizeLSTM(Pattern[Facts]):
    op_type = "DynamicQuantizeLSTM"
    forms = (Form("DynamicQuantizeLSTM", domains=MS,
                  inputs=(*lstm.CELL_INPUTS, In("W_scale"), In("W_zero_point"),
                          In("R_scale"), In("R_zero_point")),
                  attributes=lstm.CELL_ATTRIBUTES, outputs=(0, 3)),)
    examples = (
        Example((("x", F, (4, "N", 3)),), ((F, 4), (F, 3), (F, 3)),
                attrs={"hidden_size": 2},
                args=("x", np.arange(-12, 12, dtype=np.int8).reshape(1, 3, 8),
                      np.arange(16, dtype=np.int8).reshape(1, 2, 8) - 8, "", "", "", "", "",
                      np.array([0.05], np.float32), np.array([0], np.int8),
                      np.array([0.04], np.float32), np.array([0], np.int8)),
                domains=(("com.microsoft", 17),)),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        cells = lstm.cell_facts(node, ctx, float_roles=("B", "initial_h", "initial_c", "P"),
                                types=(TensorProto.FLOAT,))
        count, columns = len(cells.directions), 4 * cells.hidden
        weight_types, per_column = {}, {}
        for role in ("W", "R"):
            weight_types[role] = require_type(ctx, node.tensor(role), role, (U8, I8))
            require_type(ctx, node.tensor(f"{role}_zero_point"), f"{role}_zero_point",
                         (weight_types[role],))
            require_type(ctx, node.tensor(f"{role}_scale"), f"{role}_scale",
                         (TensorProto.FLOAT,))
            shapes = [ctx.shape(node.tensor(f"{role}_{part}")) for part in ("scale",
                                                                           "zero_point")]
            for part, shape in zip(("scale", "zero_point"), shapes, strict=True):
                if shape is None or list(shape) not in ([count], [count, columns]):
                    raise Reject(f"{role}_{part} must be ({count}) or ({count}, {columns}) "
                                 f"(per direction, or per direction and column), got "
                                 f"{None if shape is None else list(shape)}")
            per_column[role] = len(shapes[0]) == 2  # type: ignore[arg-type]
        return Facts(cells, weight_types, per_column)

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        cells = facts.cells
        x = b.input(node.tensor("X"), np.float32)
        x_quantized = tuple(b.op_multi("DynamicQuantizeLinear", [x], 3, hint="x_dynamic",
                                       dtypes=[np.uint8, np.float32, np.uint8]))
        floats = {role: b.input(node.tensor(role), np.float32) if node.tensor(role) else None
                  for role in ("B", "initial_h", "initial_c", "P")}
        outputs_y, last_h, last_c = [], [], []
        for d, backwards in enumerate(cells.directions):
            index = b.const(np.array(d, np.int64), hint="direction")
            picked = {role: self._direction_weights(b, node, facts, role, d, index)
                      for role in ("W", "R")}
            weights = lstm.direction_slice(b, floats, d)
            products = _QuantizedProducts(node, facts, x_quantized, picked)
            y, h, c = lstm.direction_cells(b, np.dtype(np.float32), cells, weights, products,
                                           d, backwards)
            outputs_y.append(y)
            last_h.append(h)
            last_c.append(c)
        results = [b.Concat(*outputs_y, axis=1, hint="y"), b.Concat(*last_h, axis=0, hint="y_h"),
                   b.Concat(*last_c, axis=0, hint="y_c")]
        for position, name in enumerate(node.outputs):
            if name:
                b.Identity(results[position], hint=f"output{position}", out=name)

    @staticmethod
    def _direction_weights(b: Builder, node: MatchedNode, facts: Facts, role: str, d: int,
                           index: Value) -> dict[str, Value]:
        """Direction d's weight matrix, scale (scalar or 4H) and zero point (the kernel
        reads the direction's first one: a scalar)."""
        dtype = _NUMPY[facts.weight_types[role]]
        data = b.Gather(b.input(node.tensor(role), dtype), index, axis=0, hint=f"{role}q{d}")
        scale = b.Gather(b.input(node.tensor(f"{role}_scale"), np.float32), index, axis=0,
                         hint=f"{role}_scale{d}")
        zero = b.Gather(b.input(node.tensor(f"{role}_zero_point"), dtype), index, axis=0,
                        hint=f"{role}_zero{d}")
        if facts.per_column[role]:
            zero = b.Gather(zero, b.const(np.array(0, np.int64), hint="first"), axis=0,
                            hint=f"{role}_zero{d}_first")
        return {"data": data, "scale": scale, "zero": zero}

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        return lstm.cell_output_types(facts.cells, TensorProto.FLOAT, len(node.outputs))

    def compute(self, args: dict[str, Any], **t: np.ndarray | None) -> list[np.ndarray]:
        """The kernel's arithmetic in float32 numpy (one intra-op thread), step by step."""
        x, w, r = t["X"], t["W"], t["R"]
        assert x is not None and w is not None and r is not None
        steps, batch = x.shape[0], x.shape[1]
        count, hidden = w.shape[0], r.shape[1]
        names = lstm._activations(args["activations"], count)
        clip = args["clip"]
        f32 = np.float32
        q_x, s_x, z_x = dynamic_quantize_reference(x)
        y = np.zeros((steps, count, batch, hidden), f32)
        y_h = np.zeros((count, batch, hidden), f32)
        y_c = np.zeros((count, batch, hidden), f32)

        def product(q: np.ndarray, s: np.ndarray, z: np.ndarray, role: str, d: int
                    ) -> np.ndarray:
            weights, scale, zero = t[role], t[f"{role}_scale"], t[f"{role}_zero_point"]
            assert weights is not None and scale is not None and zero is not None
            integer = (q.astype(np.int64) - int(z)) @ \
                (weights[d].astype(np.int64) - int(zero[d].reshape(-1)[0]))
            return integer.astype(f32) * (f32(s) * scale[d].astype(f32))

        for d in range(count):
            backwards = args["direction"] == "reverse" or d == 1
            bias = t["B"]
            gate_bias = (bias[d, :4 * hidden] + bias[d, 4 * hidden:]).astype(f32) \
                if bias is not None else np.zeros(4 * hidden, f32)
            peep = t["P"][d].astype(f32) if t["P"] is not None else np.zeros(3 * hidden, f32)
            h0, c0 = t["initial_h"], t["initial_c"]
            h = h0[d].astype(f32) if h0 is not None else np.zeros((batch, hidden), f32)
            c = c0[d].astype(f32) if c0 is not None else np.zeros((batch, hidden), f32)
            f_act, g_act, h_act = (lstm._NUMPY_ACTIVATIONS[n] for n in names[d])
            xw = product(q_x, s_x, z_x, "W", d)  # (S, B, 4H)

            def gate(v: np.ndarray, fn: Any) -> np.ndarray:
                return fn(np.clip(v, -clip, clip) if clip is not None else v).astype(f32)
            for step in (range(steps - 1, -1, -1) if backwards else range(steps)):
                q_h, s_h, z_h = dynamic_quantize_reference(h)
                z = xw[step] + product(q_h, s_h, z_h, "R", d)
                zi, zo, zf, zc = np.split(z, 4, axis=1)
                bi, bo, bf, bc = np.split(gate_bias, 4)
                i = gate((zi + c * peep[:hidden]) + bi, f_act)
                f = gate((zf + c * peep[2 * hidden:]) + bf, f_act)
                c = c * f + i * gate(zc + bc, g_act)
                o = gate((zo + c * peep[hidden:2 * hidden]) + bo, f_act)
                h = (h_act(c) * o).astype(f32)
                y[step, d] = h
            y_h[d], y_c[d] = h, c
        return [y, y_h, y_c]


PATTERNS = [DynamicQuantizeLSTM()]
