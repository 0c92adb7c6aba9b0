"""SquarePlus defined from its torch forward: a function library for ``--patterns``.

In: an output path (default ``squareplus_library.onnx``). Out: an ONNX file whose graph is
empty and whose functions define ``custom.ops::SquarePlus(x; b: float = 4.0)``, exported
from the pure-torch forward by ``decomposer.torch.define`` and checked against it.
"""

from __future__ import annotations

import sys

import torch

from decomposer.torch.define import define, write_library


def square_plus(x, b):
    return (x + torch.sqrt(x * x + b)) / 2


def main(path: str = "squareplus_library.onnx") -> None:
    function = define(square_plus, (torch.randn(2, 8),), domain="custom.ops",
                      name="SquarePlus", attributes={"b": 4.0},
                      dynamic_shapes=({0: torch.export.Dim("batch")},))
    write_library([function], path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main(*sys.argv[1:])
