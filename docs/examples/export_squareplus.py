"""Export a model holding the custom op ``custom.ops::SquarePlus`` (needs torch).

In: an output path (default ``squareplus.onnx``). Out: an ONNX file that stock ONNX
Runtime cannot run until ``decomposer --patterns squareplus_pattern.py`` rewrites it.
"""

from __future__ import annotations

import sys
import warnings

import torch


class SquarePlusFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, b: float = 4.0):
        return (x + torch.sqrt(x * x + b)) / 2

    @staticmethod
    def symbolic(g, x, b: float = 4.0):
        return g.op("custom.ops::SquarePlus", x, b_f=b)


class Model(torch.nn.Module):
    def forward(self, x):
        return SquarePlusFunction.apply(torch.tanh(x), 1.5)


def main(path: str = "squareplus.onnx") -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Model().eval(), (torch.randn(2, 8),), path, dynamo=False,
                          input_names=["x"], output_names=["y"], opset_version=17,
                          dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}},
                          custom_opsets={"custom.ops": 1})
    print(f"wrote {path}")


if __name__ == "__main__":
    main(*sys.argv[1:])
