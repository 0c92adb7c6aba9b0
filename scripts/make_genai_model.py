"""Write a decoder model with the onnxruntime-genai model builder, offline: a random Llama
checkpoint from a ``transformers`` config (no download), a word-level tokenizer made on the
spot (the builder insists on one), then ``onnxruntime_genai.models.builder``.

In: sizes and a precision. Out: ``OUT/model.onnx`` and ``OUT/model.onnx.data`` (the builder's
files, as it wrote them; its genai_config.json and tokenizer files are left out). The tests'
``tests/data/genai_llama_{int4,fp32}`` came from the defaults, and the benchmark's models
from ``--hidden 768 --heads 12 --kv-heads 4 --layers 4 --intermediate 2048 --vocab 4096``.

Needs what the test extra does not install: ``pip install onnxruntime-genai==0.18.0
onnx-ir`` (the builder imports onnx_ir without declaring it) next to torch 2.13.0+cpu and
transformers; ``python -m onnxruntime_genai.models.builder --help`` crashes on Python 3.11
in 0.18.0, the options used here are read from its source.

    python scripts/make_genai_model.py OUT_DIR --precision int4
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def _checkpoint(folder: Path, args: argparse.Namespace) -> None:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(args.seed)
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                         intermediate_size=args.intermediate,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads,
                         max_position_embeddings=args.positions, bos_token_id=1,
                         eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    LlamaForCausalLM(config).eval().save_pretrained(folder, safe_serialization=True)
    words = {token: index for index, token in enumerate(["<pad>", "<s>", "</s>", "<unk>"])}
    words.update({f"w{index}": index for index in range(len(words), args.vocab)})
    tokenizer = Tokenizer(models.WordLevel(vocab=words, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>",
                            eos_token="</s>", unk_token="<unk>").save_pretrained(folder)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--precision", choices=("int4", "fp32", "fp16"), default="int4")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--intermediate", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--positions", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        import onnx_ir  # noqa: F401
        import onnxruntime_genai  # noqa: F401
    except ImportError as exc:
        print(f"make_genai_model: {exc}; pip install onnxruntime-genai==0.18.0 onnx-ir",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as scratch:
        checkpoint, built = Path(scratch) / "checkpoint", Path(scratch) / "built"
        _checkpoint(checkpoint, args)
        subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder",
                        "-i", str(checkpoint), "-o", str(built), "-p", args.precision,
                        "-e", "cpu", "-c", str(Path(scratch) / "cache")], check=True,
                       env={**os.environ, "HF_HUB_OFFLINE": "1",
                            "TRANSFORMERS_OFFLINE": "1"})
        args.out.mkdir(parents=True, exist_ok=True)
        for name in ("model.onnx", "model.onnx.data"):
            shutil.copy(built / name, args.out / name)
    print(f"wrote {args.out / 'model.onnx'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
