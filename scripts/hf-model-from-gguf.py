"""A GGUF model as a Hugging Face directory, for engines that load those (vLLM).

    .venv-vllm/bin/python scripts/hf-model-from-gguf.py MODEL.gguf OUT_DIR [TOKENIZER_JSON]

Run with the vLLM virtualenv's Python (`make test` builds it): `transformers` reads the GGUF
(with `gguf` installed), dequantizes it, and saves weights (bf16), config, tokenizer and chat
template. The dequantized model still names its GGUF quantization in `quantization_config`,
which would make vLLM look for a GGUF file: it is dropped before saving.

TOKENIZER_JSON replaces the tokenizer.json transformers writes. Its GGUF conversion is lossy:
for SmolLM2 it drops the pre-tokenizer's digit split (llama.cpp's and the original model's), so
' ١٢٣' becomes other ids than llama.cpp gives (found by the gateway's tokenizer probe). `make`
passes the one tokenwire derives from the same GGUF (`tokenwire.tokenizers.gguf`, whose ids
are checked against llama.cpp's on a corpus by tests/tokenizers/test_parity.py). Written atomically
(a temporary folder, then a rename), so an interrupted run never leaves half a model.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def main(gguf: Path, out: Path, tokenizer_json: Path | None = None) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if (out / "config.json").is_file():  # made before: only the tokenizer is brought up to date
        if tokenizer_json is not None:
            shutil.copyfile(tokenizer_json, out / "tokenizer.json")
        return
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                 dtype=torch.bfloat16)
    # the weights are plain tensors now; what still names the GGUF quantization would make
    # save_pretrained refuse, and vLLM look for a GGUF file
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(tmp)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer.save_pretrained(tmp)
    if tokenizer_json is not None:
        shutil.copyfile(tokenizer_json, tmp / "tokenizer.json")
    tmp.rename(out)


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]) if len(sys.argv) == 4 else None)
