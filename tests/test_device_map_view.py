"""The device-map view: HTML and text rendering, budget recomputation, sliders, a real kernel."""

from __future__ import annotations

import re

import pytest
from torch import nn

from accel_nb.big_model import compute_module_sizes, cpu_offload, init_empty_weights
from accel_nb.notebook.device_map_view import DeviceMapView, show_device_map


class Block(nn.Module):
    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        return self.fc2(self.fc1(x))


class Net(nn.Module):
    def __init__(self, n: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, 64)
        self.blocks = nn.ModuleList(Block() for _ in range(n))
        self.head = nn.Linear(64, 100)

    def forward(self, ids):
        h = self.embed(ids)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


def _meta_net() -> Net:
    with init_empty_weights():
        return Net()


def _bars(html: str) -> dict[str, int]:
    """device -> number of module segments in its bar."""
    out = {}
    for m in re.finditer(
        r'<div class="accel-nb-device-bar" data-device="([^"]+)"(.*?)</div><div class="accel-nb-device-info">',
        html,
        re.S,
    ):
        out[m.group(1)] = m.group(2).count('class="accel-nb-module"')
    return out


def test_html_has_one_bar_per_device_with_modules_headroom_and_budget():
    net = _meta_net()
    sizes = compute_module_sizes(net)
    block = sizes["blocks.0"]
    budgets = {0: sizes["embed"] + 4 * block, 1: 4 * block, "cpu": 2 * block, "disk": "1GB"}
    view = DeviceMapView(net, max_memory=budgets, no_split_module_classes=["Block"])
    html = view.to_html()
    bars = _bars(html)
    assert set(bars) == {"0", "1", "cpu", "disk"}
    assert sum(bars.values()) == len(view.device_map)
    for name, dev in view.device_map.items():
        assert f'data-module="{name}"' in html
        assert re.search(rf'<tr data-module="{re.escape(name)}" data-device="{dev}"', html)
    # only GPU 0 (it runs the offloaded blocks) keeps room for the offload engine's buffers
    assert html.count('class="accel-nb-headroom"') == 1
    # a budget line on each GPU and the CPU; the disk bar is scaled to what it holds (1 GB is far more)
    assert html.count('class="accel-nb-budget-line"') == 3
    assert "Why blocks moved on" in html and "needs" in html
    assert 'title="blocks.0 (Block)' in html  # hover shows path and class
    assert view._repr_html_() == html


def test_text_summary_is_terminal_friendly():
    net = _meta_net()
    sizes = compute_module_sizes(net)
    view = DeviceMapView(
        net, max_memory={"cpu": sizes[""] // 2, "disk": "1GB"}, no_split_module_classes=["Block"]
    )
    text = str(view)
    assert text == view.text_summary()
    assert "cpu [" in text and "disk [" in text and "Moved on:" in text and "blocks.7" in text
    assert "<" not in text  # no markup
    assert all(len(line) < 120 for line in text.splitlines())


def test_set_budget_recomputes_the_map_and_reports_errors():
    net = _meta_net()
    sizes = compute_module_sizes(net)
    view = DeviceMapView(
        net, max_memory={"cpu": sizes[""] // 2, "disk": "1GB"}, no_split_module_classes=["Block"]
    )
    assert "disk" in view.device_map.values()
    new = view.set_budget("cpu", sizes[""] * 2)
    assert set(new.values()) == {"cpu"} and view.device_map == new
    assert view.budgets["cpu"] == sizes[""] * 2
    # no disk budget, cpu too small: as the reference, what fits nowhere goes to disk
    view2 = DeviceMapView(net, max_memory={"cpu": sizes[""] * 2}, no_split_module_classes=["Block"])
    view2.set_budget("cpu", "1KiB")
    assert view2.error is None and set(view2.device_map.values()) == {"disk"}
    # a plan the planner refuses (here an unknown dtype): the error is shown, the last good map kept
    good = view2.set_budget("cpu", "1GiB")
    view2.dtype = "not_a_dtype"
    view2.set_budget("cpu", "2GiB")
    assert view2.error and "unknown dtype" in view2.error and "accel-nb-error" in view2.to_html()
    assert view2.device_map == good
    view2.dtype = None
    view2.set_budget("cpu", "1GiB")
    assert view2.error is None


def test_view_of_a_plain_map_and_of_a_dispatched_model():
    view = show_device_map({"a": 0, "b": "cpu", "c": "disk"}, interactive=False)
    assert set(_bars(view.to_html())) == {"0", "cpu", "disk"}
    assert "?" in view.text_summary()
    with pytest.raises(ValueError, match="pass the model"):
        view.set_budget("cpu", 10)
    net = Net()
    cpu_offload(net, "cpu")
    shown = show_device_map(net, interactive=False)
    assert shown.device_map == {"": "cpu"} and "(model)" in shown.text_summary()


def test_widget_sliders_recompute_live():
    pytest.importorskip("ipywidgets")
    net = _meta_net()
    sizes = compute_module_sizes(net)
    view = DeviceMapView(
        net, max_memory={"cpu": sizes[""] // 2, "disk": "1GB"}, no_split_module_classes=["Block"]
    )
    box = view.widget()
    assert len(view.sliders) == 1 and "accel-nb-budget-slider" in view.sliders[0]._dom_classes
    html_before = view._html_widget.value
    assert "disk" in view.device_map.values()
    slider = view.sliders[0]
    slider.value = slider.max  # the user drags the CPU budget up
    assert set(view.device_map.values()) == {"cpu"}
    assert view._html_widget.value != html_before and 'data-device="disk"' in html_before
    assert box.children[-1] is view._html_widget
    view._interactive = True
    bundle = view._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle and "text/html" in bundle


@pytest.mark.kernel
def test_show_device_map_in_a_real_kernel():
    from tests.kernel_helpers import KernelSession

    code = """
import torch
from accel_nb import init_empty_weights, show_device_map
from tests.test_device_map_view import Net
with init_empty_weights():
    net = Net()
view = show_device_map(net, max_memory={"cpu": "100KiB", "disk": "1GB"}, no_split_module_classes=["Block"])
view
"""
    with KernelSession() as k:
        out = k.run(code, timeout=120)
        assert out.error is None, out.traceback
        bundles = [
            r for r in out.results if "text/html" in r or "application/vnd.jupyter.widget-view+json" in r
        ]
        assert len(bundles) == 1, [list(r) for r in out.results]  # displayed once, not twice
        assert "application/vnd.jupyter.widget-view+json" in bundles[0]
        assert 'accel-nb-device-bar" data-device="disk"' in bundles[0]["text/html"]
        moved = k.run(
            "view.set_budget('cpu', '10MiB'); print(sorted(set(view.device_map.values())))", timeout=60
        )
        assert moved.stdout.strip() == "['cpu']", moved.text + moved.traceback


def test_planning_a_view_never_initialises_cuda():
    import torch

    view = show_device_map(_meta_net(), interactive=False)  # default budgets: NVML / RAM only
    assert view.device_map and not torch.cuda.is_initialized()


def test_slider_readout_and_bars_show_the_same_budget_with_its_decimals():
    pytest.importorskip("ipywidgets")
    from accel_nb.utils import human_bytes

    net = _meta_net()
    total = compute_module_sizes(net)[""]
    # 100 MB is 95.37 MiB: the slider once read "95" (whole MiB) while the bars said "95.4 MiB"
    view = DeviceMapView(
        net, max_memory={0: "100MB", "cpu": total // 3, "disk": "1GB"}, no_split_module_classes=["Block"]
    )
    view.widget()
    for slider, dev in zip(view.sliders, [0, "cpu"]):
        budget = view.budgets[dev]
        shown = f"{slider.value:{slider.readout_format}} {slider.description.split('(')[1].rstrip(')')}"
        assert shown == human_bytes(budget), (shown, human_bytes(budget))
        assert f"/ {human_bytes(budget)} budget" in view._html_widget.value
    assert f"{view.sliders[0].value:.1f}" == "95.4" and "95.4 MiB budget" in view.to_html()
    # moving a slider, even past 1024 of its unit: its row says the same figure in the same unit
    cpu = view.sliders[1]
    unit = cpu.description.split("(")[1].rstrip(")")
    for value in (round(cpu.max * 0.437, 1), cpu.max):
        cpu.value = value
        assert f"/ {cpu.value:.1f} {unit} budget" in view._html_widget.value
        assert (
            f"{view.budgets['cpu'] / 1024 ** ['KiB', 'MiB', 'GiB'].index(unit) / 1024:.1f}"
            == f"{cpu.value:.1f}"
        )
    assert cpu.max >= 1024, "the top of this slider is past 1024 of its unit"


def test_disk_bar_says_it_is_drawn_to_its_contents():
    net = _meta_net()
    sizes = compute_module_sizes(net)
    view = DeviceMapView(
        net, max_memory={"cpu": sizes[""] // 2, "disk": "1GB"}, no_split_module_classes=["Block"]
    )
    html = view.to_html()
    disk = re.search(
        r'<div class="accel-nb-device-bar" data-device="disk"[^>]*>(.*?)</div><div class="accel-nb-device-info">([^<]*)<',
        html,
        re.S,
    )
    assert 'data-scale="contents"' in disk.group(0) and "free" in disk.group(2)
    assert "bar drawn to what it holds, not to its budget" in disk.group(2)
    widths = [float(x) for x in re.findall(r"width:([0-9.]+)%", disk.group(1))]
    assert abs(sum(widths) - 100) < 0.1  # full: it is drawn to its contents, and says so
    cpu = re.search(
        r'<div class="accel-nb-device-bar" data-device="cpu"[^>]*>(.*?)</div><div class="accel-nb-device-info">([^<]*)<',
        html,
        re.S,
    )
    assert 'data-scale="budget"' in cpu.group(0) and "drawn to what it holds" not in cpu.group(2)
    cpu_used = sum(sizes[k] for k, v in view.device_map.items() if v == "cpu")
    cpu_widths = sum(float(x) for x in re.findall(r"width:([0-9.]+)%", cpu.group(1)))
    assert abs(cpu_widths - 100 * cpu_used / (sizes[""] // 2)) < 0.1  # the CPU bar is to scale of its budget
    assert "(bar: contents)" in view.text_summary()
    # a disk budget close to what it holds is drawn to scale, with no note
    near = DeviceMapView(
        net, max_memory={"cpu": sizes[""] // 2, "disk": sizes[""]}, no_split_module_classes=["Block"]
    )
    near_html = near.to_html()
    assert re.search(
        r'data-device="disk" data-used="\d+" data-budget="\d+" data-headroom="0" data-scale="budget"',
        near_html,
    )
    assert "drawn to what it holds" not in near_html


def test_an_empty_disk_bar_is_drawn_to_its_budget():
    net = _meta_net()
    view = DeviceMapView(net, max_memory={"cpu": "1GB", "disk": "1GB"}, no_split_module_classes=["Block"])
    assert set(view.device_map.values()) == {"cpu"}
    html = view.to_html()
    assert re.search(
        r'data-device="disk" data-used="0" data-budget="1000000000" data-headroom="0" data-scale="budget"',
        html,
    )
    assert "drawn to what it holds" not in html


def test_set_budget_moves_the_slider_too():
    """A budget set in code shows on its slider; dragging then starts from it (no jump back)."""
    pytest.importorskip("ipywidgets")
    net = _meta_net()
    sizes = compute_module_sizes(net)
    view = DeviceMapView(
        net, max_memory={"cpu": sizes[""] // 2, "disk": "1GB"}, no_split_module_classes=["Block"]
    )
    view.widget()
    slider = view.sliders[0]
    unit = view._units["cpu"][0]
    target = sizes[""] * 3  # past the slider's top (twice the model): the slider grows to show it
    view.set_budget("cpu", target)
    assert slider.value == pytest.approx(target / unit) and slider.max >= slider.value
    assert set(view.device_map.values()) == {"cpu"}
    view.set_budget("cpu", "4MB")
    assert slider.value == pytest.approx(4_000_000 / unit)
    assert view.budgets["cpu"] == 4_000_000
    slider.value = slider.value + 0.5  # a drag from there: the budget follows the slider
    assert view.budgets["cpu"] == int(round((4_000_000 / unit + 0.5) * unit))


def test_adjacent_blocks_never_share_a_colour():
    with init_empty_weights():
        net = Net(n=40)  # more blocks than the palette has colours
    sizes = compute_module_sizes(net)
    budgets = {0: sizes["embed"] + 26 * sizes["blocks.0"], "cpu": "1GB"}
    view = DeviceMapView(net, max_memory=budgets, no_split_module_classes=["Block"])
    html = view.to_html()
    segments = 0
    for m in re.finditer(
        r'class="accel-nb-device-bar" data-device="([^"]+)"(.*?)<div class="accel-nb-device-info">',
        html,
        re.S,
    ):
        colours = re.findall(r'class="accel-nb-module"[^>]*background:([^"]+)"', m.group(2))
        segments += len(colours)
        assert all(a != b for a, b in zip(colours, colours[1:])), colours
    assert segments > 12, segments
    table = dict(re.findall(r'<tr data-module="([^"]*)"[^>]*><td><span style="color:([^"]+)"', html))
    bar = dict(re.findall(r'data-module="([^"]*)" style="width:[^;]+;background:([^"]+)"', html))
    assert table == bar, "a module has one colour in the bar and in the table"


# -- a quantized plan: quantized sizes and the dtype per block (issue 29) ------------------------------
def _meta_llama():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    with init_empty_weights():
        return transformers.LlamaForCausalLM(config), config


def test_a_view_planned_with_torchao_int8_places_and_labels_by_quantized_bytes():
    from accel_nb.big_model.quantization import TorchAoQuantizationConfig, quantized_weight_bytes

    model, _ = _meta_llama()
    quant = TorchAoQuantizationConfig("int8")
    plain = DeviceMapView(model, max_memory={"cpu": "1GiB"})
    full = plain.rows()[0]["size"]
    quantized = DeviceMapView(model, max_memory={"cpu": "1GiB"}, quantization_config=quant)
    small = quantized.rows()[0]["size"]
    assert small < full / 2 and quantized.rows()[0]["unquantized"] == full
    # a budget only the quantized model fits: all on the CPU; the float plan spills to disk
    budget = {"cpu": int(small * 1.1), "disk": "1GB"}
    assert set(DeviceMapView(model, max_memory=budget).device_map.values()) == {"cpu", "disk"}
    fits = DeviceMapView(model, max_memory=budget, quantization_config=quant)
    assert fits.error is None and fits.device_map == {"": "cpu"}
    # a budget that splits it: each decoder layer is int8 weights + float32 norms, counted exactly
    split = DeviceMapView(
        model, max_memory={"cpu": int(small * 0.6), "disk": "1GB"}, quantization_config=quant
    )
    rows = {r["module"]: r for r in split.rows()}
    layer = rows["model.layers.0"]
    assert layer["dtype"] == "int8 + float32"
    proj = quantized_weight_bytes(64, 256, quant)  # up_proj: in 64, out 256
    linears = 2 * quantized_weight_bytes(64, 64, quant) + 2 * quantized_weight_bytes(64, 32, quant)
    linears += 2 * proj + quantized_weight_bytes(256, 64, quant)
    assert layer["size"] == linears + 2 * 64 * 4  # + two float32 RMSNorm weights
    assert rows["lm_head"]["dtype"] == "float32"  # the output head stays unquantized
    assert rows["model.embed_tokens"]["dtype"] == "float32"
    assert set(split.device_map.values()) == {"cpu", "disk"}
    # the planner used the same quantized sizes as the rows show
    assert split.plan.sizes["model.layers.0"] == layer["size"]
    text = split.text_summary()
    assert "quantized torchao-int8:" in text and "x smaller" in text
    assert "int8 + float32" in text and "(unquantized 240.5 KiB)" in text
    assert all(len(line) < 120 for line in text.splitlines())
    html = split.to_html()
    assert "<th>dtype</th><th>unquantized</th>" in html
    assert '<td class="accel-nb-dtype">int8 + float32</td>' in html
    assert 'class="accel-nb-quantization"' in html
    assert "<th>dtype</th>" not in plain.to_html()  # an unquantized view is unchanged


def test_a_view_planned_with_bnb_4bit_needs_no_gpu():
    from accel_nb.big_model.quantization import BnbQuantizationConfig, get_quantized_model_device_map

    model, _ = _meta_llama()
    quant = BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4")
    budgets = {"cpu": "150KiB", "disk": "1GB"}
    view = DeviceMapView(model, max_memory=budgets, quantization_config=quant)
    assert view.error is None
    # the same map the loader would use
    assert view.device_map == get_quantized_model_device_map(model, quant, "sequential", max_memory=budgets)
    rows = {r["module"]: r for r in view.rows()}
    assert rows["model.layers.0"]["dtype"] == "nf4 + float16"
    assert rows["lm_head"]["dtype"] == "float16"  # torch_dtype: the 4-bit compute dtype
    assert rows["model.layers.0"]["size"] * 5 < rows["model.layers.0"]["unquantized"]


def test_a_model_loaded_quantized_shows_itself_quantized():
    pytest.importorskip("torchao")
    import torch

    from accel_nb.big_model.quantization import TorchAoQuantizationConfig, load_and_quantize_model

    _, config = _meta_llama()
    import transformers

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    with init_empty_weights():
        planned = transformers.LlamaForCausalLM(config)
    quant = TorchAoQuantizationConfig("int8")
    expected = DeviceMapView(planned, max_memory={"cpu": "1GiB"}, quantization_config=quant).rows()[0]
    model = load_and_quantize_model(model, quant)
    view = show_device_map(model, interactive=False)
    assert view.device_map == {"": "cpu"} and view.quantized
    row = view.rows()[0]
    assert (row["dtype"], row["size"], row["unquantized"]) == (
        expected["dtype"],
        expected["size"],
        expected["unquantized"],
    )
    assert view.quantization_summary().startswith("torchao-int8: ")
