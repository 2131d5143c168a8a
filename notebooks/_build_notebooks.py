"""Write the notebooks in this folder from the cell sources below (outputs empty).

    .venv/bin/python notebooks/_build_notebooks.py        # rewrite all three
    .venv/bin/python notebooks/_build_notebooks.py --check  # exit 1 if a notebook is out of date

Cells tagged ``key-result`` print the figures that examples/run_quickstart.py reports and that the
tests check.
"""

from __future__ import annotations

import os
import sys

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = os.path.dirname(os.path.abspath(__file__))


def md(text: str):
    return new_markdown_cell(text.strip("\n"))


def code(text: str, *tags: str):
    cell = new_code_cell(text.strip("\n"))
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


# ----------------------------------------------------------------------------- quickstart
QUICKSTART = [
    md("""
# accel_nb quickstart: a PyTorch loop on two processes, from this notebook

This notebook takes a plain PyTorch training loop, changes four lines, and runs it on **two
processes** — first with `notebook_launcher`, then with the `%%accelerate` cell magic — with a
live progress bar per rank, its metrics logged once to TensorBoard, and the results brought
back into the notebook. It runs on a laptop
CPU in well under a minute: on a machine without GPUs the two processes form a real gloo group
and train one model together (DistributedDataParallel), each on half of every batch of data.
"""),
    md("## 1. Synthetic data, a small model and a plain PyTorch loop"),
    code("""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)


def make_dataset(n=1024, seed=0):
    \"\"\"Synthetic regression data: y = x @ w + noise.\"\"\"
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    w = torch.linspace(-1.0, 1.0, 8)
    return TensorDataset(x, x @ w + 0.05 * torch.randn(n, generator=g))


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))


def train_plain(epochs=3, lr=0.05):
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loader = DataLoader(make_dataset(), batch_size=32, shuffle=True)
    for _epoch in range(epochs):
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x).squeeze(-1), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return loss.item()


print(f"one process, final batch loss: {train_plain():.4f}")
"""),
    md("""
## 2. The four-line change

```diff
+from accel_nb import Accelerator
 def train(epochs=3, lr=0.05):
+    accelerator = Accelerator()
     ...
+    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
     for epoch in range(epochs):
         for x, y in loader:
             ...
-            loss.backward()
+            accelerator.backward(loss)
```

`prepare` moves the model to this rank's device and wraps it for data-parallel training, and
gives each rank its own share of every batch of the loader. `accel_nb.progress` reports each
rank's progress to this notebook. The same function still runs in a single process.
"""),
    code("""
from accel_nb import Accelerator, notebook_launcher, progress


def train(epochs=3, lr=0.05):
    accelerator = Accelerator()
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loader = DataLoader(make_dataset(), batch_size=32, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    history = []
    with progress(total=epochs * len(loader), desc="train") as bar:
        for _epoch in range(epochs):
            for x, y in loader:
                loss = nn.functional.mse_loss(model(x).squeeze(-1), y)
                optimizer.zero_grad()
                accelerator.backward(loss)
                optimizer.step()
                bar.update()
                bar.set_postfix(loss=loss.item())
            history.append(accelerator.reduce(loss.detach(), "mean").item())  # the same on every rank
    return {"rank": accelerator.process_index, "world": accelerator.num_processes, "history": history}
"""),
    md("""
## 3. `notebook_launcher`: run it on two processes

The call returns what `train` returned on each rank, in rank order. While it runs, the cell shows
one progress row per rank (a text line per rank where there is no widget frontend).
"""),
    code(
        """
results = notebook_launcher(train, num_processes=2)
for r in results:
    print(f"rank {r['rank']} of {r['world']}: loss per epoch {[round(v, 4) for v in r['history']]}")
print("ranks:", [r["rank"] for r in results])
""",
        "key-result",
    ),
    md("""
A failing rank does not leave the notebook guessing: the other ranks are stopped and the call
raises `LaunchError`, which carries every failing rank's traceback.
"""),
    code(
        """
from accel_nb import LaunchError, PartialState


def fails_on_rank_1():
    if PartialState().process_index == 1:
        raise ValueError("boom on rank 1")
    return "ok"


try:
    notebook_launcher(fails_on_rank_1, num_processes=2)
except LaunchError as err:
    failure = err.failures[0]
    print(f"caught: rank {failure.rank} failed with {failure.exc_type}: {failure.message}")
""",
        "key-result",
    ),
    md("""
## 4. Experiment tracking: log once, to TensorBoard

`Accelerator(log_with="tensorboard", project_dir=...)` writes what `accelerator.log` receives to
TensorBoard event files (also `"mlflow"`, `"wandb"`, `"all"` or your own tracker). Only process 0
writes: the run holds each step once, however many processes log. `init_trackers` stores the
hyper-parameters with the run. While it runs, the cell draws every rank's logged values as small
live curves under the progress bars, and the final picture stays in the notebook.
"""),
    code("""
import tempfile

runs_dir = tempfile.mkdtemp(prefix="quickstart_runs_")  # tensorboard --logdir <this folder>


def train_logged(epochs=3, lr=0.05):
    accelerator = Accelerator(log_with="tensorboard", project_dir=runs_dir)
    accelerator.init_trackers("quickstart", config={"epochs": epochs, "lr": lr, "batch_size": 32})
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loader = DataLoader(make_dataset(), batch_size=32, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    step = 0
    for _epoch in range(epochs):
        for x, y in progress(loader, desc="train"):
            loss = nn.functional.mse_loss(model(x).squeeze(-1), y)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            accelerator.log({"loss": loss, "lr": lr}, step=step)  # process 0 writes; every rank is drawn
            step += 1
    accelerator.end_training()
    return round(loss.item(), 4)  # this rank's last loss: notebook_launcher returns one per rank


final_losses = notebook_launcher(train_logged, num_processes=2)
print("last loss of each rank:", final_losses)
"""),
    code(
        """
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

run = EventAccumulator(f"{runs_dir}/quickstart")  # TensorBoard's own reader
run.Reload()
losses = run.Scalars("loss")
steps = [point.step for point in losses]
print(f"TensorBoard run: {len(losses)} loss points, steps {steps[0]}..{steps[-1]}, each once: {len(set(steps)) == len(steps)}")
print(f"loss {losses[0].value:.4f} -> {losses[-1].value:.4f}; view it with: tensorboard --logdir {runs_dir}")
""",
        "key-result",
    ),
    md("""
## 5. `%%accelerate`: run a cell on two processes

Load the extension once, then `%%accelerate` runs a whole cell on N processes. The cell sees
everything defined above (`make_model`, `make_dataset`, the imports). `--return` copies the
named variables from rank 0 back into this notebook when the cell succeeds: here the per-step
loss and the trained model (modules come back on the CPU).
"""),
    code("""
%load_ext accel_nb
history, trained = [], None  # filled in by the cell below (--return)
"""),
    code("""
%%accelerate --num_processes 2 --return history,trained
accelerator = Accelerator()
model = make_model()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
loader = DataLoader(make_dataset(), batch_size=32, shuffle=True)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
history = []
with progress(total=3 * len(loader), desc="train") as bar:
    for _epoch in range(3):
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x).squeeze(-1), y)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            history.append(accelerator.reduce(loss.detach(), "mean").item())
            bar.update()
trained = accelerator.unwrap_model(model)
"""),
    md("## 6. The results, back in the notebook"),
    code("""
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(6, 2.6))
ax.plot(history, label="loss (mean over ranks)")
ax.set_xlabel("step")
ax.set_ylabel("MSE")
ax.grid(alpha=0.3)
ax.legend()
plt.show()
"""),
    code(
        """
x, y = make_dataset().tensors
with torch.no_grad():
    final_mse = nn.functional.mse_loss(trained(x).squeeze(-1), y).item()
print(f"{len(history)} steps on 2 processes; loss {history[0]:.4f} -> {history[-1]:.4f}")
print(f"trained model (back in this notebook): {type(trained).__name__}, full-data MSE {final_mse:.4f}")
""",
        "key-result",
    ),
    md("""
Next: `notebooks/big_model_inference.ipynb` (models larger than memory) and
`notebooks/config_wizard.ipynb` (save a launch config for this machine).
"""),
]


# ----------------------------------------------------------------------------- big model
BIG_MODEL = [
    md("""
# Big-model inference: empty init, the device map, CPU and disk offload

A model does not have to fit in memory to be built, planned and run. This notebook builds a
small GPT-2-style model from a `transformers` config (nothing is downloaded), plans where each
block goes under memory budgets, shows the plan, and runs it with part of the weights offloaded
to disk. The sizes are tiny so it runs in seconds on a CPU; the same calls place a 70B model on
GPUs, CPU and disk.
"""),
    code("""
import os
import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.utils import logging as hf_logging

from accel_nb import (
    compute_module_sizes,
    infer_auto_device_map,
    init_empty_weights,
    load_checkpoint_and_dispatch,
    show_device_map,
)

torch.set_num_threads(1)
hf_logging.disable_progress_bar()
config = GPT2Config(
    n_layer=6, n_embd=128, n_head=4, n_positions=64, vocab_size=512, bos_token_id=0, eos_token_id=0, pad_token_id=0
)
workdir = tempfile.mkdtemp(prefix="accel_nb_big_model_")
"""),
    md("""
## 1. A real checkpoint to load

In real life the weights come from a hub or a disk. Here we make a model with random weights
once, keep its output on a fixed prompt as the ground truth, and save it as sharded safetensors.
"""),
    code("""
torch.manual_seed(0)
reference_model = GPT2LMHeadModel(config).eval()
checkpoint = os.path.join(workdir, "checkpoint")
reference_model.save_pretrained(checkpoint, max_shard_size="500KB")
prompt = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
with torch.no_grad():
    expected_logits = reference_model(prompt).logits
print(sorted(f for f in os.listdir(checkpoint) if f.endswith(".safetensors"))[:3], "...")
"""),
    md("""
## 2. Build the model empty

Under `init_empty_weights()` the parameters live on the `meta` device: they have shapes and
dtypes but no storage, so building costs no memory at any size.
"""),
    code(
        """
with init_empty_weights():
    model = GPT2LMHeadModel(config)
sizes = compute_module_sizes(model)
print("parameter device:", next(model.parameters()).device)
print(f"whole model: {sizes[''] / 2**20:.2f} MiB; one block: {sizes['transformer.h.0'] / 2**20:.2f} MiB")
""",
        "key-result",
    ),
    md("""
## 3. Plan and look at the device map

`show_device_map` plans the placement the way `infer_auto_device_map` does — filling the
devices in order, GPUs, then the CPU, then the disk, never splitting a `GPT2Block` — and draws
one bar per device with the modules placed on it, the budget line and the free room. In
JupyterLab a slider per device changes its budget and recomputes the map live on the empty
model; `view.device_map` is the map for the budgets you settled on.
"""),
    code(
        """
max_memory = {"cpu": "1.2MB", "disk": "64MB"}
view = show_device_map(model, max_memory=max_memory, no_split_module_classes=["GPT2Block"])
""",
        "device-map",
    ),
    code(
        """
device_map = view.device_map
print("devices used:", sorted({str(d) for d in device_map.values()}))
same = device_map == infer_auto_device_map(model, max_memory=max_memory, no_split_module_classes=["GPT2Block"])
print("same map as infer_auto_device_map:", same)
""",
        "key-result",
    ),
    md("""
### Planning for a GPU machine, here

GPU budgets need no GPU, so a map for the GPU machine can be made on this one. When the model
fits on the GPU, all of it goes there and nothing is held back; when it does not, the GPU that
will run the offloaded blocks keeps free exactly what the offload engine allocates there (two
buffers the size of the largest block it streams), and the plan says so in its first line.
"""),
    code("""
total = sizes[""]
for gpu_budget in (int(total * 1.1), int(total * 0.7)):
    plan = infer_auto_device_map(model, {0: gpu_budget, "cpu": "64MB"}, no_split_module_classes=["GPT2Block"]).plan
    on_gpu = sum(sizes[name] for name, device in plan.device_map.items() if device == 0)
    print(f"GPU budget {gpu_budget / 2**20:.2f} MiB: {on_gpu / total:.0%} of the model on GPU 0")
    print("   headroom:", plan.notes[0])
"""),
    md("""
## 4. Load and dispatch: CPU + disk offload

`load_checkpoint_and_dispatch` loads each tensor straight to its place (memory-mapped
safetensors), writes the disk part to the offload folder, and adds hooks that move activations
between devices and bring offloaded weights in only for their module's forward.
"""),
    code("""
model = load_checkpoint_and_dispatch(
    model,
    checkpoint,
    device_map=device_map,
    offload_folder=os.path.join(workdir, "offload"),
    no_split_module_classes=["GPT2Block"],
)
model.eval()
placement = {}
for name, device in model.hf_device_map.items():
    placement.setdefault(str(device), []).append(name)
for device, names in placement.items():
    print(f"{device:>5}: {len(names)} modules, e.g. {names[0]}")
"""),
    code(
        """
with torch.no_grad():
    logits = model(prompt).logits
print("offloaded forward matches the in-memory model:", torch.allclose(logits, expected_logits, atol=1e-5))
""",
        "key-result",
    ),
    md("## 5. Generate"),
    code(
        """
with torch.no_grad():
    tokens = model.generate(prompt, max_new_tokens=8, do_sample=False)
    expected_tokens = reference_model.generate(prompt, max_new_tokens=8, do_sample=False)
print("generated:", tokens[0, prompt.shape[1]:].tolist())
print("same tokens as the in-memory model:", torch.equal(tokens, expected_tokens))
""",
        "key-result",
    ),
    md("""
## 6. Offloading a whole model

`cpu_offload` keeps every weight in (pinned) CPU memory and `disk_offload` in memory-mapped
files; each layer's weights travel to the execution device only for its own forward. On a GPU
machine `execution_device` is the GPU, and a model of any size runs in about two layers of GPU
memory; on this CPU-only machine the execution device is the CPU.
"""),
    code(
        """
from accel_nb import cpu_offload, disk_offload

execution_device = 0 if torch.cuda.is_available() else "cpu"
for name, offload in (("cpu_offload", cpu_offload), ("disk_offload", disk_offload)):
    copy = GPT2LMHeadModel(config).eval()
    copy.load_state_dict(reference_model.state_dict())
    if offload is disk_offload:
        copy = disk_offload(copy, os.path.join(workdir, "whole_model"), execution_device=execution_device)
    else:
        copy = cpu_offload(copy, execution_device=execution_device)
    with torch.no_grad():
        logits = copy(prompt).logits.cpu()
    print(f"{name}: forward matches the in-memory model:", torch.allclose(logits, expected_logits, atol=1e-5))
""",
        "key-result",
    ),
    md("""
## 7. Quantized: a model that fits only in 8 bits

Quantizing the weights is the cheapest way to make a model fit. `load_and_quantize_model` reads
the same float checkpoint and stores each linear layer's weight as int8 (torchao's weight-only
int8: one byte per weight plus a float32 scale per row) as it reads it, shard by shard; the
embeddings, norms and the (tied) output head stay float32. It runs on a CPU; the same call with
`BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4")` gives bitsandbytes' 4-bit.
Needs `pip install "accel_nb[quantization]"`.

`show_device_map(..., quantization_config=...)` plans with the bytes each block will hold once
quantized and shows, per block, that size, its dtype (`int8 + float32`: int8 weights, float32
layer norms and biases) and its size unquantized. With a 1 MB CPU budget the quantized blocks
that do not fit go to disk (the section's last cell loads a 4-bit model that way).
"""),
    code(
        """
from accel_nb.big_model.quantization import TorchAoQuantizationConfig, load_and_quantize_model

quant = TorchAoQuantizationConfig("int8")
with init_empty_weights():
    model = GPT2LMHeadModel(config)
planned = show_device_map(
    model, max_memory={"cpu": "1MB", "disk": "64MB"}, no_split_module_classes=["GPT2Block"], quantization_config=quant
)
quantized_total = sum(row["size"] for row in planned.rows())
print("planned:", planned.quantization_summary())
""",
        "key-result",
    ),
    md("""
A CPU budget 10% above the quantized size: in float32 the model spills to disk, quantized it
all stays on the CPU.
"""),
    code(
        """
budget = {"cpu": int(quantized_total * 1.1), "disk": "64MB"}
float_map = infer_auto_device_map(model, max_memory=budget, no_split_module_classes=["GPT2Block"])
print("float32 with this budget:", sorted({str(d) for d in float_map.values()}))
model = load_and_quantize_model(
    model, quant, weights_location=checkpoint, device_map="auto", max_memory=budget, no_split_module_classes=["GPT2Block"]
)
model.eval()
print("int8 with this budget:", sorted({str(d) for d in model.hf_device_map.values()}))


def held_bytes(module):
    # each tensor once (the output head shares the embedding's); a quantized tensor holds its
    # inner tensors (int8 data and scales)
    tensors = {id(t): t for t in [*module.parameters(), *module.buffers()]}.values()
    return sum(
        sum(getattr(t, inner).nbytes for inner in t.__tensor_flatten__()[0])
        if hasattr(t, "__tensor_flatten__")
        else t.nbytes
        for t in tensors
    )


after = held_bytes(model)
before = held_bytes(reference_model)
print(f"weights before: {before / 2**20:.2f} MiB (float32), after: {after / 2**20:.2f} MiB ({before / after:.1f}x smaller)")
""",
        "key-result",
    ),
    md("""
Weight-only int8 keeps the logits close to the float model's (about 1% relative error here) and,
on this prompt, the same greedy tokens.
"""),
    code(
        """
with torch.no_grad():
    quantized_logits = model(prompt).logits
    quantized_tokens = model.generate(prompt, max_new_tokens=8, do_sample=False)
error = ((quantized_logits - expected_logits).norm() / expected_logits.norm()).item()
print(f"relative error of the int8 logits: {error:.2%}")
print("int8 logits close to float32 (under 5%):", error < 0.05)
print("same greedy tokens as float32:", torch.equal(quantized_tokens, expected_tokens))
""",
        "key-result",
    ),
    md("""
The same with bitsandbytes' 4-bit NF4 (also on the CPU): half a byte per weight plus a float32
scale per block of 64. The error is larger than int8's (random small weights are the hard case);
greedy generation gives the float model's tokens here.
"""),
    code(
        """
from accel_nb.big_model.quantization import BnbQuantizationConfig

nf4 = BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype="fp32")
with init_empty_weights():
    model_nf4 = GPT2LMHeadModel(config)
print("planned:", show_device_map(model_nf4, max_memory={"cpu": "64MB"}, quantization_config=nf4, interactive=False).quantization_summary())
model_nf4 = load_and_quantize_model(model_nf4, nf4, weights_location=checkpoint).eval()
with torch.no_grad():
    nf4_logits = model_nf4(prompt).logits
    nf4_tokens = model_nf4.generate(prompt, max_new_tokens=8, do_sample=False)
error = ((nf4_logits - expected_logits).norm() / expected_logits.norm()).item()
print(f"relative error of the nf4 logits: {error:.2%}")
print("nf4 greedy tokens same as float32:", torch.equal(nf4_tokens, expected_tokens))
""",
        "key-result",
    ),
    md("""
Placed with a small budget: with 500 KB of CPU the 4-bit blocks that do not fit go to disk, in
their 4-bit form (one safetensors file per layer in the offload folder). Each such layer's
quantized bytes are read just before its forward and dropped after, so a forward reads about 7x
fewer bytes than the same blocks offloaded in float32; the outputs are those of the NF4 model
held on the CPU, bit for bit.
"""),
    code(
        """
with init_empty_weights():
    model_small = GPT2LMHeadModel(config)
model_small = load_and_quantize_model(
    model_small,
    nf4,
    weights_location=checkpoint,
    device_map="auto",
    max_memory={"cpu": "500KB", "disk": "64MB"},
    no_split_module_classes=["GPT2Block"],
    offload_folder=os.path.join(workdir, "nf4_offload"),
).eval()
print("nf4 with a 500 KB CPU budget:", sorted({str(d) for d in model_small.hf_device_map.values()}))
with torch.no_grad():
    small_logits = model_small(prompt).logits
    small_tokens = model_small.generate(prompt, max_new_tokens=8, do_sample=False)
offloader = model_small._accel_nb_quantized_offloader
quantized_bytes = sum(store.nbytes for store in offloader.stores)
float_bytes = sum(store.layer.in_features * store.layer.out_features * 4 for store in offloader.stores)
print(
    f"{len(offloader.stores)} quantized layers on disk: {quantized_bytes / 2**20:.2f} MiB read per forward "
    f"(float32: {float_bytes / 2**20:.2f} MiB, {float_bytes / quantized_bytes:.1f}x more)"
)
print("nf4 offloaded to disk, logits equal to nf4 on the CPU:", torch.equal(small_logits, nf4_logits))
print("nf4 offloaded to disk, same greedy tokens:", torch.equal(small_tokens, nf4_tokens))
""",
        "key-result",
    ),
]


# ----------------------------------------------------------------------------- config wizard
WIZARD = [
    md("""
# The config wizard

`config_wizard()` shows what this machine has, proposes launch settings for it, validates your
changes as you make them, and on **Save** writes the launch config that `notebook_launcher`,
`%%accelerate` and `accel-nb launch` read. It also shows the equivalent `%%accelerate` line,
`notebook_launcher(...)` call and `accel-nb launch` command.

This notebook points `ACCEL_NB_CONFIG_FILE` at a temporary file so that running it does not
touch your own config.
"""),
    code("""
import os
import tempfile

config_path = os.path.join(tempfile.mkdtemp(prefix="accel_nb_wizard_"), "default_config.yaml")
os.environ["ACCEL_NB_CONFIG_FILE"] = config_path
print("config file for this notebook:", config_path)
"""),
    code("""
from accel_nb import config_wizard

wizard = config_wizard()
wizard
"""),
    md("""
Change the settings above and press **Save**. The next cell does the same from code, so that
the notebook also runs unattended: it picks 2 processes and no mixed precision, then saves.
"""),
    code(
        """
wizard.set_values(num_processes=2, mixed_precision="no")
wizard.save()
print(open(config_path).read())
""",
        "key-result",
    ),
    md("The saved file is the config in effect from now on:"),
    code(
        """
from accel_nb import LaunchConfig

config = LaunchConfig.load(config_path)
print(f"num_processes={config.num_processes}, mixed_precision={config.mixed_precision}")
""",
        "key-result",
    ),
    md("""
`%accelerate_config` (after `%load_ext accel_nb`) prints the launch config that `%%accelerate` and
`notebook_launcher` will use: the file just saved.
"""),
    code("""
%load_ext accel_nb
%accelerate_config
"""),
]


# ----------------------------------------------------------------------------- interactive session
SESSION = [
    md("""
# An interactive session: two warm workers that keep their state across cells

`%accelerate start` starts two workers once; every `%%accelerate` cell after it runs on both, in
their own persistent namespaces, with a real process group (gloo on CPU). Build the model in one
cell, train in the next, evaluate in a third, fix a failing cell and run it again — nothing is
reloaded. See docs/sessions.md.
"""),
    code("""
%load_ext accel_nb
%accelerate start -n 2 --cpu
"""),
    md("## Cell A: data, model and an Accelerator on every rank"),
    code("""
%%accelerate
import torch
from torch.utils.data import DataLoader, TensorDataset
from accel_nb import Accelerator

torch.manual_seed(0)
accelerator = Accelerator()
x = torch.randn(256, 8)
y = x @ torch.linspace(-1.0, 1.0, 8)
loader = DataLoader(TensorDataset(x, y), batch_size=16)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
f"rank {accelerator.process_index}: {len(loader)} batches"
"""),
    md("## Cell B: one epoch of training (run it again for another epoch)"),
    code("""
%%accelerate
for xb, yb in loader:
    loss = torch.nn.functional.mse_loss(model(xb).squeeze(-1), yb)
    optimizer.zero_grad()
    accelerator.backward(loss)
    optimizer.step()
round(loss.item(), 4)
"""),
    md("## Cell C: evaluate, and bring the metric back into the notebook"),
    code("""
%%accelerate
with torch.no_grad():
    errors = torch.stack([torch.nn.functional.mse_loss(model(xb).squeeze(-1), yb) for xb, yb in loader])
mse = accelerator.reduce(errors.mean(), "mean").item()
"""),
    code(
        """
%accelerate pull mse
print(f"evaluation mse after one epoch: {mse:.4f} (below 1.0: {mse < 1.0})")  # noqa: F821 - set by the pull
""",
        "key-result",
    ),
    md("""
## A failing cell leaves the workers alive

Rank 1 raises; the cell reports it, and both namespaces are intact: fix the cell and rerun it.
"""),
    code(
        """
%%accelerate
threshold = 0.5
if accelerator.process_index == 1:
    raise ValueError("a bug only rank 1 hits")
""",
        "raises-exception",
    ),
    md("""
### Debugging it: `%accelerate debug` and `breakpoint()`

Before fixing the cell, you could look inside rank 1 where it raised: the warm worker keeps the
exception and its frames until the next cell. In a cell of its own, `%accelerate debug` opens pdb in
rank 1 at the `raise` line; its prompt is the notebook's input box, labelled with the rank:

```
%accelerate debug
[accel_nb] rank 1 stopped in pdb at <accelerate-cell-6>:4. 'c' lets it go on.
ValueError: a bug only rank 1 hits
(rank 1 Pdb) p threshold
0.5
(rank 1 Pdb) c
```

A `breakpoint()` in any `%%accelerate` cell (or in a function given to `notebook_launcher`) stops
that rank the same way; the other ranks run on until they need it, and `c` lets it go on. Both need
someone to type, so this notebook shows them as text only: a headless run (`nbclient`, `jupyter
nbconvert --execute`) has no input box, and a breakpoint there is skipped with a note in the rank's
output. `PYTHONBREAKPOINT=0` turns breakpoints off in the ranks. More in `docs/debugging.md`.
"""),
    code("""
%%accelerate
threshold = 0.5
(accelerator.process_index, round(mse, 4), threshold)  # mse from cell C is still here
"""),
    md("## Moving data: push notebook values to every rank, pull one back"),
    code("""
scale = 10.0
%accelerate push scale
"""),
    code("""
%%accelerate --rank 1
scaled = scale * accelerator.process_index
"""),
    code(
        """
%accelerate pull scaled --rank 1
print(f"rank 1 computed scaled = {scaled}")  # noqa: F821 - set by the pull
""",
        "key-result",
    ),
    md("## Status, then stop (no worker process is left)"),
    code("""
%accelerate status
"""),
    code(
        """
import psutil

%accelerate stop
print(f"worker processes left: {len(psutil.Process().children(recursive=True))}")
""",
        "key-result",
    ),
]


# ----------------------------------------------------------------------------- TPU (Kaggle, Colab)
TPU = [
    md("""
# Training on TPU cores from a notebook (Kaggle, Colab)

This notebook trains a small model on **every TPU core of the session** with
`notebook_launcher`: accel_nb detects the XLA runtime, starts one host process that calls
`torch_xla.launch`, and brings each core's result, output and failure back to the cell.

- **Kaggle** (TPU v5e-8 runtime, 8 chips): torch 2.8 and torch_xla 2.8 are preinstalled.
- **Colab** (TPU v5e-1 runtime, 1 chip): torch_xla 2.9.0 works only with exactly torch 2.9.0.
- **Anywhere else** with torch_xla installed, the notebook runs on XLA's CPU backend with two
  devices (threads of one process). That is how accel_nb's tests run it; it has not been run on
  a real TPU by accel_nb's tests.
"""),
    md("""
## 1. Install (Kaggle or Colab only)

The cell installs what the platform lacks and nothing elsewhere. On Colab, if pip replaced torch,
restart the session once (Runtime > Restart session) before going on.
"""),
    code("""
import os

if os.environ.get("KAGGLE_KERNEL_RUN_TYPE"):  # Kaggle: torch 2.8 + torch_xla 2.8 are already there
    %pip install -q accel_nb
elif os.environ.get("COLAB_RELEASE_TAG"):  # Colab: torch_xla 2.9.0 needs exactly torch 2.9.0
    %pip install -q torch==2.9.0 'torch_xla[tpu]==2.9.0' accel_nb
else:
    print("not on Kaggle or Colab: nothing installed (torch_xla and accel_nb must be installed already)")
"""),
    md("""
## 2. What this runtime has

Without TPU chips, the next cell asks torch_xla for its CPU backend with two devices, so the rest
of the notebook runs anywhere torch_xla is installed. On a TPU runtime it changes nothing.
"""),
    code(
        """
from accel_nb.xla_detect import detect_tpu, xla_runtime

if not detect_tpu().detected:
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    os.environ.setdefault("CPU_NUM_DEVICES", "2")
runtime = xla_runtime()
print("XLA runtime:", runtime.describe() if runtime else "none (install torch_xla)")
""",
        "key-result",
    ),
    code("""
%load_ext accel_nb
%accelerate_env
"""),
    md("""
## 3. A training function

The usual accel_nb loop: `prepare` puts the model on this core's XLA device and feeds it its
shard of every batch; the optimizer step reduces the gradients across cores. The weights are
initialised explicitly (on the CPU backend the devices are threads that share one random
generator).
"""),
    code("""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def make_dataset(n=512, seed=0):
    \"\"\"Synthetic regression data: y = x @ w + noise.\"\"\"
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    w = torch.linspace(-1.0, 1.0, 8)
    return TensorDataset(x, x @ w + 0.05 * torch.randn(n, generator=g))


def make_model():
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return model


def train(epochs=4, lr=0.1):
    from accel_nb import Accelerator
    from accel_nb.progress_bar import progress

    accelerator = Accelerator()
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loader = DataLoader(make_dataset(), batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(0))
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    history = []
    for epoch in range(epochs):
        total, steps = 0.0, 0
        for x, y in progress(loader, desc=f"epoch {epoch}"):
            loss = nn.functional.mse_loss(model(x).squeeze(-1), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            total, steps = total + loss.detach(), steps + 1
        history.append(round(accelerator.reduce(total / steps, reduction="mean").item(), 4))
        accelerator.print(f"epoch {epoch}: mean loss {history[-1]}")
    state = accelerator.unwrap_model(model).state_dict()  # moved to the CPU on the way back
    return {"rank": accelerator.process_index, "cores": accelerator.num_processes,
            "device": str(accelerator.device), "history": history, "state": state}
"""),
    md("""
## 4. Launch on every core

`num_processes` may be left out: on XLA it is the number of devices (a different number is
refused with the count it should be).
"""),
    code(
        """
from accel_nb import notebook_launcher

results = notebook_launcher(train)
for r in results:
    print(f"rank {r['rank']} of {r['cores']} on {r['device']}: loss per epoch {r['history']}")
print("loss fell:", results[0]["history"][-1] < results[0]["history"][0])
print("every core ends with the same weights:",
      all(torch.equal(results[0]["state"][k], r["state"][k]) for r in results for k in r["state"]))
""",
        "key-result",
    ),
    md("## 5. Use the trained weights in this notebook"),
    code(
        """
model = make_model()
model.load_state_dict(results[0]["state"])
x, y = make_dataset(n=256, seed=1).tensors
with torch.no_grad():
    print(f"held-out mse of the trained model: {nn.functional.mse_loss(model(x).squeeze(-1), y).item():.4f}")
""",
        "key-result",
    ),
    md("""
## 6. A failing core

An exception on one core stops the others and is raised here with that core's traceback.
"""),
    code(
        """
from accel_nb.launch import LaunchError


def fails_on_the_last_core():
    from accel_nb import PartialState

    state = PartialState()
    if state.process_index == state.num_processes - 1:
        raise ValueError(f"boom on core {state.process_index}")
    return state.process_index


try:
    notebook_launcher(fails_on_the_last_core)
except LaunchError as exc:
    print("caught:", str(exc).splitlines()[0])
""",
        "key-result",
    ),
]


# ----------------------------------------------------------------------------- DeepSpeed ZeRO-3
DEEPSPEED = [
    md("""
# DeepSpeed ZeRO-3 from a notebook, on two CPU processes

ZeRO stage 3 splits a model's parameters, gradients and optimizer state over the processes, so
each process holds about half of each when there are two. This notebook trains a small model
that way with `notebook_launcher`, prints the loss of each step, and saves the trained model with
`save_model`. The shards are gathered into one ordinary `model.safetensors`, which then loads into
the plain PyTorch model. It runs on a laptop CPU in well under a minute: DeepSpeed uses its CPU
accelerator and gloo.

DeepSpeed is an optional extra: `DS_BUILD_OPS=0 pip install 'accel_nb[deepspeed]'`. Nothing is
compiled.
"""),
    code("""
import importlib.util

if importlib.util.find_spec("deepspeed") is None:
    raise RuntimeError("this notebook needs deepspeed: DS_BUILD_OPS=0 pip install 'accel_nb[deepspeed]'")
"""),
    md("## 1. Data, a small model and the training function"),
    code("""
import os
import tempfile

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from accel_nb import Accelerator, DeepSpeedPlugin, load_checkpoint_in_model, notebook_launcher

torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
x = torch.randn(128, 8, generator=g)
dataset = TensorDataset(x, (x @ torch.linspace(-1.0, 1.0, 8)).sin().unsqueeze(1))
probe = torch.linspace(-1.0, 1.0, 32).reshape(4, 8)
save_dir = tempfile.mkdtemp(prefix="accel_nb_zero3_")


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))


def train(steps=8):
    plugin = DeepSpeedPlugin(zero_stage=3, gradient_clipping=1.0, zero3_save_16bit_model=True)
    accelerator = Accelerator(deepspeed_plugin=plugin)
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.02)
    loader = DataLoader(dataset, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(1))
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for step, (xb, yb) in zip(range(steps), loader):
        loss = nn.functional.mse_loss(model(xb), yb)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        mean = accelerator.reduce(loss.detach(), reduction="mean").item()
        losses.append(mean)
        accelerator.print(f"step {step}: loss {mean:.4f}")
    held = sum(p.ds_tensor.numel() for p in model.module.parameters())  # this rank's shard
    total = sum(p.numel() for p in make_model().parameters())
    with torch.no_grad():
        out = model(probe)  # every rank takes part: the layers' shards are gathered for the forward
    accelerator.save_model(model, save_dir)  # every rank: the shards are gathered into one file
    return {"losses": losses, "held": held, "total": total, "probe": out.float()}
"""),
    md("""
## 2. Train on two processes

`cpu=True` asks for CPU processes. The model, the optimizer and the loader go to one `prepare`
call, which returns the DeepSpeed engine in place of the model.
"""),
    code(
        """
results = notebook_launcher(train, num_processes=2, cpu=True)
first, last = results[0]["losses"][0], results[0]["losses"][-1]
print(f"loss: {first:.4f} -> {last:.4f} (went down: {last < first})")
for rank, r in enumerate(results):
    print(f"rank {rank} held {r['held']} of {r['total']} parameter elements")
""",
        "key-result",
    ),
    md("""
## 3. The consolidated checkpoint loads into the plain model

`save_model` wrote one `model.safetensors` with full tensors, so the plain model needs neither
DeepSpeed nor two processes to use it.
"""),
    code(
        """
print("files:", sorted(os.listdir(save_dir)))
plain = make_model()
load_checkpoint_in_model(plain, os.path.join(save_dir, "model.safetensors"))
with torch.no_grad():
    same = torch.allclose(plain(probe), results[0]["probe"], atol=1e-6)
    changed = not torch.equal(plain(probe), make_model()(probe))
print(f"the plain model computes what the trained engine computed: {same}; trained weights: {changed}")
""",
        "key-result",
    ),
]

PARALLEL = [
    md("""
# Tensor parallel × FSDP, pipeline and context parallel, from a notebook

Three ways to split a model over processes when data parallelism alone is not enough, the first
two on torch's own parallelism (DeviceMesh, DTensor, `torch.distributed.pipelining`):

1. **Tensor parallel × FSDP** (`ParallelismConfig(dp_shard_size=2, tp_size=2)` on 4 processes):
   each planned layer's weights are split over a tensor-parallel pair, and FSDP2 shards the rest
   over the other dimension. The training loop is the usual one.
2. **Pipeline parallel**: the model cut by layers into stages, one per process, the batch split
   into microbatches: `prepare_pippy` for inference, `PipelineTrainer` for training.
3. **Context parallel** (`ParallelismConfig(cp_size=2)`): each sequence split over the processes,
   attention gathering the whole sequence's keys and values (accel_nb's own, on plain collectives).

Everything here runs on CPU processes (gloo); the same code runs on GPUs (not run yet on
several GPUs). Docs: `docs/parallelism.md`, `docs/pipeline.md`.
"""),
    md("## 1. A small Llama built from a config, and its data"),
    code("""
import logging

import torch
from torch.utils.data import DataLoader, TensorDataset

# transformers imports torchao if installed; on a torch without CUDA its import logs harmless lines
# ("Failed to load ..._C_mxfp8...so", pytree notes) that ask nothing of you (docs/troubleshooting.md)
for noisy in ("torchao", "torch.utils._pytree"):
    logging.getLogger(noisy).setLevel(logging.ERROR)
from transformers import LlamaConfig, LlamaForCausalLM

from accel_nb import Accelerator, ParallelismConfig, PipelineTrainer, notebook_launcher, prepare_pippy

torch.set_num_threads(1)
STEPS = 8
g = torch.Generator().manual_seed(1)
# sequences that count up (mod 64) from a random start: a pattern the model can learn
starts = torch.randint(0, 64, (8 * STEPS, 1), generator=g)
tokens = TensorDataset((starts + torch.arange(12)) % 64)


def make_llama(tied=True):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=tied, use_cache=False)
    return LlamaForCausalLM(config)


def train(layout=None, batch_size=8):
    # STEPS clipped SGD steps; with a layout also where this rank sits and the parameter bytes it holds
    from accel_nb.fsdp.sharding import local_shard_bytes

    accelerator = Accelerator(parallelism_config=ParallelismConfig(**layout) if layout else None)
    model = make_llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(tokens, batch_size=batch_size))
    losses = []
    for (input_ids,) in loader:
        loss = model(input_ids=input_ids, labels=input_ids).loss
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(accelerator.reduce(loss.detach(), "mean").item())
    where = None
    if layout:
        where = dict(zip(accelerator.torch_device_mesh.mesh_dim_names,
                         (accelerator.data_parallel_shard_rank, accelerator.tensor_parallel_rank)))
    return {"losses": losses, "where": where, "bytes": local_shard_bytes(model.parameters())}
"""),
    md("""
## 2. Tensor parallel × FSDP on 4 processes

The mesh is `dp_shard=2 × tp=2`: processes 0 and 1 (and 2 and 3) split each planned layer —
the model's own tensor-parallel plan (`base_model_tp_plan` of the transformers config) — and the
two pairs shard over FSDP. Both processes of a pair read the same batches, so the global batch is
2 × 4 = 8, as in the one-process run it is compared with.
"""),
    code(
        """
one = train()  # the same loop in this kernel, one process, batch 8
results = notebook_launcher(train, args=({"dp_shard_size": 2, "tp_size": 2}, 4), num_processes=4, cpu=True)
same = torch.allclose(torch.tensor(results[0]["losses"]), torch.tensor(one["losses"]), rtol=1e-5)
print(f"losses equal to the one-process run: {same} ({one['losses'][0]:.4f} -> {one['losses'][-1]:.4f})")
for rank, r in enumerate(results):
    print(f"rank {rank} at {r['where']} holds {r['bytes']} of {one['bytes']} parameter bytes")
""",
        "key-result",
    ),
    md("""
## 3. Pipeline-parallel inference on 2 processes

`prepare_pippy` cuts the model in front of whole decoder layers, balanced by parameter bytes,
and runs the batch as microbatches through the two stages; the last process returns the logits.
"""),
    code(
        """
prompts = torch.randint(0, 64, (4, 12), generator=torch.Generator().manual_seed(2))


def infer():
    model = make_llama(tied=False).eval()
    model = prepare_pippy(model, split_points="auto", example_args=(prompts,), num_chunks=2)
    return model.hf_split_points, model(prompts)


stages = notebook_launcher(infer, num_processes=2, cpu=True)
with torch.no_grad():
    whole = make_llama(tied=False).eval()(prompts).logits
logits = stages[1][1]
logits = getattr(logits, "logits", logits)
print(f"split in front of {stages[0][0]}; process 0 returned {stages[0][1]}")
print(f"pipeline logits equal to the whole model's: {torch.allclose(logits, whole, atol=1e-5)}")
""",
        "key-result",
    ),
    md("""
## 4. Pipeline-parallel training on 2 processes (1F1B, 4 microbatches)

`PipelineTrainer` builds one optimizer per stage from a factory over that stage's parameters;
`step()` runs the schedule and returns the batch's mean loss on every process.
"""),
    code(
        """
def lm_loss(logits, labels):
    logits = getattr(logits, "logits", logits)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def train_pipeline():
    trainer = PipelineTrainer(make_llama(tied=False), loss_fn=lm_loss,
                              optimizer=lambda params: torch.optim.SGD(params, lr=0.5),
                              example_args=(tokens.tensors[0][:8],), n_microbatches=4, schedule="1f1b")
    return [trainer.step(tokens.tensors[0][i:i + 8], target=tokens.tensors[0][i:i + 8])
            for i in range(0, 8 * STEPS, 8)]


def train_unsplit():
    model = make_llama(tied=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for i in range(0, 8 * STEPS, 8):
        x = tokens.tensors[0][i:i + 8]
        loss = sum(lm_loss(model(m), m) for m in x.chunk(4)) / 4
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


piped = notebook_launcher(train_pipeline, num_processes=2, cpu=True)[0]
plain = train_unsplit()
same = torch.allclose(torch.tensor([float(v) for v in piped]), torch.tensor(plain), rtol=1e-5)
print(f"pipeline losses equal to the unsplit model's: {same} ({plain[0]:.4f} -> {plain[-1]:.4f})")
""",
        "key-result",
    ),
    md("""
## 5. Context parallel on 2 processes

Each process keeps half of every 32-token sequence (load-balanced chunks) inside
`maybe_context_parallel`; the labels are shifted and `position_ids` made before the split, so the
model sees the true positions. Both processes read the same batches.
"""),
    code(
        """
import torch.nn.functional as F

long_tokens = TensorDataset((starts[:32] + torch.arange(33)) % 64)  # 4 batches of 8 sequences of 33 tokens


def train_cp(cp_size=1):
    accelerator = Accelerator(parallelism_config=ParallelismConfig(cp_size=cp_size) if cp_size > 1 else None)
    model = make_llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(long_tokens, batch_size=8))
    losses = []
    for (seq,) in loader:
        input_ids, targets = seq[:, :-1].clone(), seq[:, 1:].clone()  # shift before the split
        position_ids = torch.arange(input_ids.shape[1]).expand_as(input_ids)
        with accelerator.maybe_context_parallel(buffers=[input_ids, position_ids, targets], buffer_seq_dims=[1, 1, 1]):
            logits = model(input_ids=input_ids, position_ids=position_ids).logits
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())  # this process's tokens
            accelerator.backward(loss)
            here = input_ids.shape[1]
        optimizer.step()
        optimizer.zero_grad()
        losses.append(accelerator.reduce(loss.detach(), "mean").item())
    return {"losses": losses, "tokens": here}


one = train_cp()
split = notebook_launcher(train_cp, args=(2,), num_processes=2, cpu=True)
same = torch.allclose(torch.tensor(split[0]["losses"]), torch.tensor(one["losses"]), rtol=1e-5)
print(f"context parallel losses equal to the one-process run: {same} ({one['losses'][0]:.4f} -> {one['losses'][-1]:.4f})")
print(f"each process computed {split[0]['tokens']} and {split[1]['tokens']} of {one['tokens']} tokens per sequence")
""",
        "key-result",
    ),
]


# ----------------------------------------------------------------------------- FP8
FP8 = [
    md("""
# FP8 training with torchao, from this notebook

`Accelerator(mixed_precision="fp8")` turns the model's linear layers into torchao's float8 layers
(all but the first and the last, and only those whose sizes are multiples of 16) before DDP wraps
it; the rest of the forward runs under bf16 autocast. It needs `pip install torchao` and runs on
a CPU too (slowly: the CPU float8 matmul checks correctness, not speed). docs/fp8.md has the details.
"""),
    code("""
import logging

import torch
from torch import nn

logging.getLogger("torchao").setLevel(logging.ERROR)  # its CUDA extensions do not load on a CPU machine


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def batches(steps=20, size=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(size, 16, generator=g), torch.randn(size, 4, generator=g)) for _ in range(steps)]


# the fp32 reference: plain PyTorch in this kernel
model = make_model()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
fp32 = []
for x, y in batches():
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    fp32.append(loss.item())
print("fp32 loss, step 1 and 20:", round(fp32[0], 4), round(fp32[-1], 4))
"""),
    md("""
## The same loop in FP8 on two processes

The optimizer is made before `prepare`, as usual: every parameter still trains (each rank reports
how many moved). Each rank reads its half of every batch; `accelerator.reduce` averages the loss.
"""),
    code(
        """
from accel_nb import Accelerator, notebook_launcher


def train_fp8():
    accelerator = Accelerator(mixed_precision="fp8")
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in model.parameters()]
    model, optimizer = accelerator.prepare(model, optimizer)
    half = slice(accelerator.process_index * 8, accelerator.process_index * 8 + 8)
    losses = []
    for x, y in batches():
        loss = nn.functional.mse_loss(model(x[half]), y[half])
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(accelerator.reduce(loss.detach(), "mean").item())
    inner = accelerator.unwrap_model(model)
    moved = sum(not torch.equal(b, p.detach()) for b, p in zip(before, inner.parameters()))
    return {"layers": [type(m).__name__ for m in inner if isinstance(m, nn.Linear)], "losses": losses,
            "moved": f"{moved} of {len(before)}"}


results = notebook_launcher(train_fp8, num_processes=2)
fp8 = results[0]["losses"]
print("layers:", results[0]["layers"])
print("parameters trained:", [r["moved"] for r in results])
print("fp8 loss, step 1 and 20:", round(fp8[0], 4), round(fp8[-1], 4))
worst = max(abs(a - b) / b for a, b in zip(fp8, fp32))
print(f"largest difference from fp32 over 20 steps: {worst:.2%} (under 3%: {worst < 0.03})")
""",
        "key-result",
    ),
]

# ----------------------------------------------------------------------------- Megatron-LM
MEGATRON = [
    md("""
# Megatron-LM tensor parallelism from a notebook (megatron-core)

accel_nb runs the reference's Megatron-LM integration on **megatron-core**, the part of Megatron-LM on
PyPI. This notebook trains a tiny GPT-2 with `MegatronLMPlugin(tp_degree=2)` on **2 processes** through
`notebook_launcher`: every weight matrix is split over the two processes, and both compute every step
together. It then compares each process's losses with a one-process run from the same weights.

**It needs a machine with 2 CUDA GPUs.** megatron-core calls CUDA directly, so without a GPU
`Accelerator(megatron_lm_plugin=...)` stops with an error before anything is built. accel_nb has not yet
run Megatron-LM on GPUs (none was lent to this work): its test suite runs this notebook on CPU processes
with test-only stand-ins for megatron-core's CUDA calls (`tests/megatron_standins.py`, not part of the
package). Details: `docs/megatron.md`.
"""),
    md("## 1. Install (when accel_nb or megatron-core is missing)"),
    code("""
import importlib.util

if importlib.util.find_spec("accel_nb") is None or importlib.util.find_spec("megatron") is None:
    %pip install -q 'accel_nb[megatron]'
else:
    print("accel_nb and megatron-core are installed")
"""),
    md("""
## 2. A tiny GPT-2 config, data and the training function

As in the reference, `prepare` reads the sizes of the `transformers` model it is given and builds
megatron-core's `GPTModel` of that size, each process holding its tensor-parallel slice. It returns an
**engine whose forward runs the whole training step** (forward, backward, gradient reduction, optimizer
step) and returns the loss; `accelerator.backward`, `optimizer.step` and `optimizer.zero_grad` do nothing,
so the loop reads as any accel_nb loop. The loader's batch size is the micro-batch size.

`model.full_weights()` gives the whole model's weights in the one-process layout, and
`model.load_full_weights(...)` puts such weights on any tp/pp layout: the two-process run starts from the
one-process run's weights.
"""),
    code("""
import logging
import os
import warnings

import torch
import transformers
from torch.utils.data import DataLoader

from accel_nb import Accelerator, notebook_launcher
from accel_nb.megatron import MegatronLMPlugin

# notes that ask nothing of you (the launched processes inherit these settings): transformers imports torchao
# when installed, whose import logs the CUDA kernels it could not load; megatron-core warns without Apex
# that it uses torch's norm layers
for noisy in ("torchao", "torch.utils._pytree"):
    logging.getLogger(noisy).setLevel(logging.ERROR)
warnings.filterwarnings("ignore", message="Apex is not installed")
os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")  # megatron-core asks for it with tensor parallelism

# imported once here, so the launched processes start with megatron-core loaded (it warns at import
# when Apex or Transformer Engine, two optional GPU libraries, are absent)
with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    import megatron.core.distributed
    import megatron.core.models.gpt
    import megatron.core.optimizer
    import megatron.core.pipeline_parallel

VOCAB, SEQ, STEPS = 128, 16, 12
g = torch.Generator().manual_seed(0)
starts = torch.randint(0, VOCAB, (8 * STEPS,), generator=g)
# sequences that count up (mod VOCAB) from a random start: a pattern the model can learn
samples = [{"input_ids": (int(s) + torch.arange(SEQ)) % VOCAB} for s in starts]


def make_gpt2():
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=SEQ,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config)


def train(tp_degree=1, start=None):
    # gradient_clipping=0.0: plain AdamW steps (Megatron's clipping, on by default, runs on GPUs only)
    plugin = MegatronLMPlugin(tp_degree=tp_degree, gradient_clipping=0.0)
    accelerator = Accelerator(megatron_lm_plugin=plugin)
    model = make_gpt2()  # gives the sizes; the weights are Megatron's
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    loader = DataLoader(samples, batch_size=8)  # batches of {"input_ids": [8, SEQ]}
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    if start is None:
        start = model.full_weights()
    else:
        model.load_full_weights(start)
    model.train()
    losses = []
    for batch in loader:
        loss = model(**batch)  # one whole training iteration
        accelerator.backward(loss)  # nothing: the forward stepped
        optimizer.step()  # nothing
        optimizer.zero_grad()  # nothing
        losses.append(float(loss))
    held = sum(p.numel() for p in model.parameters())  # this process's slice
    return {"losses": losses, "held": held, "start": start if tp_degree == 1 else None}
"""),
    md("""
## 3. One process, then tensor parallel on 2 processes

The two processes of `tp_degree=2` form one tensor-parallel group: they read the same batches (one
data-parallel rank), and the loss comes back on both.
"""),
    code(
        """
one = notebook_launcher(train, num_processes=1)[0]
results = notebook_launcher(train, args=(2, one["start"]), num_processes=2)

print("one process losses:", [round(v, 6) for v in one["losses"]])
for rank, r in enumerate(results):
    print(f"rank {rank} losses:", [round(v, 6) for v in r["losses"]])
    print(f"rank {rank} holds {r['held']} of {one['held']} parameter elements")
same = all(torch.allclose(torch.tensor(r["losses"]), torch.tensor(one["losses"]), rtol=2e-5, atol=0)
           for r in results)
print(f"every rank's losses equal to the one-process run: {same}")
print(f"loss: {one['losses'][0]:.4f} -> {one['losses'][-1]:.4f}")
""",
        "key-result",
    ),
    md("""
## What else is built, and what needs a GPU

- **Models** (`prepare` reads the `transformers` config): GPT-2 and Llama become megatron-core's
  `GPTModel`; `MegatronBertForMaskedLM` becomes `BertModel` with the pre-training heads; T5 becomes
  `T5Model` (tensor and data parallel only: `pp_degree` > 1 is refused for T5). Other models: pass
  `custom_model_provider_function`.
- **Layouts**: `tp_degree`, `pp_degree` with `num_micro_batches`, and data parallel over the remaining
  processes (tp x pp must divide the number of processes).
- **GPU only** (refused on a CPU device, because megatron-core calls CUDA for them): `mixed_precision`
  bf16/fp16, `use_distributed_optimizer`, `sequence_parallelism`, recompute, and `gradient_clipping` > 0.
  fp8 needs Transformer Engine's layers, which accel_nb does not wire.
- `save_state`/`load_state`, `gather_for_metrics` over the data-parallel group, `MegatronLMDummyScheduler`
  and the launch config (`distributed_type: MEGATRON_LM`) are described in `docs/megatron.md`.
"""),
]

NOTEBOOKS = {
    "quickstart.ipynb": QUICKSTART,
    "big_model_inference.ipynb": BIG_MODEL,
    "config_wizard.ipynb": WIZARD,
    "interactive_session.ipynb": SESSION,
    "tpu_kaggle_colab.ipynb": TPU,
    "deepspeed_zero3.ipynb": DEEPSPEED,
    "parallelism.ipynb": PARALLEL,
    "fp8_training.ipynb": FP8,
    "megatron.ipynb": MEGATRON,
}


def build(name: str) -> nbformat.NotebookNode:
    nb = new_notebook(cells=NOTEBOOKS[name])
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
    }
    nb.metadata["language_info"] = {"name": "python"}
    for i, cell in enumerate(nb.cells):  # stable ids: rebuilding gives byte-identical files
        cell["id"] = f"{os.path.splitext(name)[0].replace('_', '-')}-{i:02d}"
    return nb


def main(argv: list[str]) -> int:
    stale = []
    for name in NOTEBOOKS:
        text = nbformat.writes(build(name)) + "\n"
        path = os.path.join(HERE, name)
        if "--check" in argv:
            if not os.path.exists(path) or open(path, encoding="utf-8").read() != text:
                stale.append(name)
            continue
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        print("wrote", path)
    if stale:
        print("out of date (run notebooks/_build_notebooks.py):", ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
