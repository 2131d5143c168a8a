"""Write or read 4-bit checkpoints under whichever bitsandbytes this Python imports (tests/test_bnb_layout.py).

    python bnb_release_roundtrip.py EXPECTED_VERSION FLOAT_FOLDER WORK_FOLDER write|read

``write`` quantizes the float checkpoint (NF4, FP4 with double quantization), saves each quantized
state dict as sharded safetensors under WORK_FOLDER/<kind>/ with its logits; ``read`` loads each
back (without re-quantizing) and checks logits and state dict equal. Prints one JSON line.
"""

from __future__ import annotations

import json
import os
import sys

import bitsandbytes
import torch
import transformers

from accel_nb.big_model import init_empty_weights
from accel_nb.big_model.quantization import BnbQuantizationConfig, load_and_quantize_model
from accel_nb.serialization import save_sharded_safetensors

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.tiny_models import tiny_llama_config  # noqa: E402

CONFIGS = {
    "nf4": dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32),
    "fp4-double": dict(
        load_in_4bit=True,
        bnb_4bit_quant_type="fp4",
        bnb_4bit_compute_dtype=torch.float32,
        bnb_4bit_use_double_quant=True,
    ),
}
TOKENS = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))


def empty_llama():
    with init_empty_weights():
        return transformers.LlamaForCausalLM(tiny_llama_config())


def logits(model):
    with torch.no_grad():
        return model.eval()(TOKENS).logits.float()


def main() -> None:
    expected, float_folder, work, mode = sys.argv[1:5]
    assert bitsandbytes.__version__ == expected, (bitsandbytes.__version__, bitsandbytes.__file__)
    report = {"bitsandbytes": bitsandbytes.__version__}
    for kind, kwargs in CONFIGS.items():
        folder = os.path.join(work, kind)
        config = BnbQuantizationConfig(**kwargs)
        if mode == "write":
            model = load_and_quantize_model(
                empty_llama(), config, weights_location=float_folder, device_map={"": "cpu"}
            )
            out = logits(model)
            save_sharded_safetensors(model.state_dict(), folder, max_shard_size="100KB")
            plain = {k: v.detach().as_subclass(torch.Tensor) for k, v in model.state_dict().items()}
            torch.save({"logits": out, "state": plain}, os.path.join(folder, "expected.pt"))
            report[kind] = "written"
        else:
            want = torch.load(os.path.join(folder, "expected.pt"))
            model = load_and_quantize_model(
                empty_llama(), config, weights_location=folder, device_map={"": "cpu"}
            )
            same_logits = torch.equal(logits(model), want["logits"])
            state = model.state_dict()
            differing = [k for k, v in want["state"].items() if not torch.equal(state[k], v)]
            report[kind] = {"same_logits": same_logits, "differing": differing}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
