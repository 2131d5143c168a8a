"""Big-model inference end to end, on any machine (CPU-only is fine, nothing is downloaded).

python examples/big_model_inference.py

1. build a small GPT-2 from a config and save it as sharded safetensors (stands in for a hub model);
2. build the same architecture empty (meta device) and look at the planned device map;
3. load the shards with a tight memory budget so some blocks go to disk (with a GPU: GPU, then
   RAM, then disk), and run it;
4. check the outputs equal the plain model's.
"""

from __future__ import annotations

import os
import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from accel_nb import compute_module_sizes, init_empty_weights, load_checkpoint_and_dispatch, show_device_map
from accel_nb.serialization import save_sharded_safetensors


def main() -> None:
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=6, n_embd=128, n_head=4, vocab_size=2000, n_positions=128, bos_token_id=0, eos_token_id=0
    )
    work = tempfile.mkdtemp(prefix="accel_nb_big_model_")
    ckpt = os.path.join(work, "gpt2-small-demo")
    reference = GPT2LMHeadModel(config).eval()
    save_sharded_safetensors(reference.state_dict(), ckpt, max_shard_size="1MB")
    print(f"checkpoint: {len(os.listdir(ckpt)) - 1} shards in {ckpt}")

    with init_empty_weights():
        model = GPT2LMHeadModel(config).eval()
    sizes = compute_module_sizes(model)
    if torch.cuda.is_available():  # half the model on the GPU, a quarter in RAM, the rest on disk
        budget = {0: sizes[""] // 2, "cpu": sizes[""] // 4, "disk": "10GB"}
    else:  # half the model in RAM, the rest on disk
        budget = {"cpu": sizes[""] // 2, "disk": "10GB"}
    view = show_device_map(model, max_memory=budget, no_split_module_classes=["GPT2Block"], interactive=False)
    print("headroom:", view.plan.notes[0])

    model = load_checkpoint_and_dispatch(
        model,
        ckpt,
        device_map=view.device_map,
        no_split_module_classes=["GPT2Block"],
        offload_folder=os.path.join(work, "offload"),
    )
    ids = torch.randint(0, config.vocab_size, (2, 32))
    with torch.no_grad():
        got = model(ids).logits
        want = reference(ids).logits
    on_disk = [k for k, v in model.hf_device_map.items() if v == "disk"]
    print(f"on disk: {', '.join(on_disk)}")
    print(f"max |dispatched - plain| = {(got - want).abs().max().item():.2e}")
    assert torch.allclose(got, want, atol=1e-4)


if __name__ == "__main__":
    main()
