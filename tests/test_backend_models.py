"""Every ONNX backend node test model goes through decompose unchanged.

None of them holds a custom op, so decomposer must hand each back byte-identical: this is
the broad "nothing lost, nothing touched" check over ~1.9k real models.
"""

from __future__ import annotations

import warnings

import pytest

import decomposer


def _cases():
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return collect_testcases(None)


def test_every_backend_node_model_comes_back_identical():
    cases = _cases()
    assert len(cases) > 1500
    changed, failed = [], []
    for case in cases:
        before = case.model.SerializeToString(deterministic=True)
        try:
            out, report = decomposer.decompose_with_report(case.model)
        except decomposer.DecomposerError as exc:
            failed.append(f"{case.name}: {exc}")
            continue
        if out.SerializeToString(deterministic=True) != before or report.changed:
            changed.append(case.name)
        assert case.model.SerializeToString(deterministic=True) == before  # input untouched
    assert not failed, failed[:5]
    assert not changed, changed[:5]


@pytest.mark.parametrize("name", ["test_affine_grid_2d", "test_affine_grid_3d_align_corners"])
def test_standard_affine_grid_at_opset_20_is_not_a_candidate(name):
    case = next(c for c in _cases() if c.name == name)
    out, report = decomposer.decompose_with_report(case.model)
    assert report.replaced == [] and out == case.model
