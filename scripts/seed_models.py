"""The seed articles' PyTorch modules, written as the articles write them, plus exporters.

In: nothing (torch is needed). Out: ``SpatialTransformer`` (Conv -> custom AffineGrid ->
GridSample, exported as ``custom.ops::AffineGrid``), ``CustomRotateScale`` (exported as
``CustomRotScale``), ``ClassicSTN`` (plain ``F.affine_grid(theta, x.size())``, exported as
torch's ATen fallbacks), and ``export_*`` helpers that write ``.onnx`` files with torch's
legacy (TorchScript) exporter, as the articles do.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.onnx import OperatorExportTypes


class CustomAffineGrid(nn.Module):
    class _Function(torch.autograd.Function):
        @staticmethod
        def forward(ctx, theta, size):
            grid = torch.nn.functional.affine_grid(theta, size.cpu().tolist(),
                                                   align_corners=False)
            return grid.to(theta.device)

        @staticmethod
        def symbolic(g, theta, size):
            return g.op("custom.ops::AffineGrid", theta, size, align_corners_i=0)

    def forward(self, theta, size):
        return self._Function.apply(theta, size)


class SpatialTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 64, kernel_size=3)
        self.affine = CustomAffineGrid()

    def forward(self, x, theta, size):
        features = self.conv(x)
        grid = self.affine(theta, size)
        return nn.functional.grid_sample(features, grid, mode="bilinear", padding_mode="zeros")


class CustomRotateScale(nn.Module):
    class _Function(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            x = torch.rot90(x, k=2, dims=[2, 3])
            return x * 1.5

        @staticmethod
        def symbolic(g, x):
            return g.op("CustomRotScale", x, rotations_i=2, scale_factor_f=1.5,
                        dims_s="height,width")

    def forward(self, x):
        return self._Function.apply(x)


class ClassicSTN(nn.Module):
    """An STN with no custom symbolic: torch exports affine_grid as an ATen fallback."""

    def __init__(self, align_corners: bool = False):
        super().__init__()
        self.loc = nn.Conv2d(3, 6, kernel_size=3, padding=1)
        self.align_corners = align_corners

    def forward(self, x):
        theta = self.loc(x).mean(dim=(2, 3)).view(-1, 2, 3)
        grid = F.affine_grid(theta, x.size(), align_corners=self.align_corners)
        return F.grid_sample(x, grid, align_corners=self.align_corners)


def _export(model, args, path, **kwargs) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, str(path), dynamo=False, **kwargs)
    return Path(path)


def export_seed_stn(path, seed: int = 0) -> SpatialTransformer:
    """The article's export call, verbatim apart from the file name and dynamo=False."""
    torch.manual_seed(seed)
    model = SpatialTransformer().eval()
    dummy_input = torch.randn(1, 3, 256, 256)
    theta = torch.randn(1, 2, 3)
    size = torch.tensor([1, 64, 512, 512])
    _export(model, (dummy_input, theta, size), path,
            input_names=["image", "theta", "size"], output_names=["output"],
            dynamic_axes={"image": {2: "height", 3: "width"},
                          "output": {2: "out_h", 3: "out_w"}},
            opset_version=16, operator_export_type=OperatorExportTypes.ONNX_FALLTHROUGH)
    return model


def export_rotate_scale(path) -> CustomRotateScale:
    """The article's second export call, verbatim apart from the file name and dynamo=False."""
    model = CustomRotateScale().eval()
    dummy_input = torch.randn(1, 3, 224, 224)
    _export(model, dummy_input, path, input_names=["input"], output_names=["output"],
            custom_opsets={"custom.ops": 1})
    return model


def export_classic_stn(path, export_type: OperatorExportTypes, align_corners: bool = False,
                       seed: int = 0) -> ClassicSTN:
    torch.manual_seed(seed)
    model = ClassicSTN(align_corners).eval()
    _export(model, (torch.randn(2, 3, 16, 20),), path, input_names=["x"],
            output_names=["y"], opset_version=16, operator_export_type=export_type,
            dynamic_axes={"x": {0: "n", 2: "h", 3: "w"}, "y": {0: "n", 2: "h", 3: "w"}})
    return model
