"""Write the README's example model: the seed article's STN, exported with its custom node.

In: nothing (needs the test extra, for torch). Out: ``tests/data/stn_custom.onnx`` (or the
path given as the first argument), a Conv -> custom.ops::AffineGrid -> GridSample model
that stock ONNX Runtime refuses until decomposer rewrites it.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from seed_models import export_seed_stn  # noqa: E402


def main() -> None:
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else \
        Path(__file__).resolve().parent.parent / "tests" / "data" / "stn_custom.onnx"
    target.parent.mkdir(parents=True, exist_ok=True)
    export_seed_stn(target)
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
