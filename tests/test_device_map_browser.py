"""The device-map view in a real browser: bars per device, and a budget slider that re-plans live."""

from __future__ import annotations

import json
import os

import pytest

from tests.browser_helpers import (
    LabServer,
    cell_errors,
    chromium,
    open_notebook,
    run_all_cells,
    screenshot,
    wait_until,
)

pytestmark = [pytest.mark.browser, pytest.mark.timeout(400)]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHOTS = os.path.join(ROOT, "artifacts", "screenshots")

CELL = f"""
import sys
sys.path.insert(0, {ROOT!r})
import torch
from torch import nn
from accel_nb import init_empty_weights, show_device_map, compute_module_sizes

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(100, 64)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(64, 256), nn.Linear(256, 64)) for _ in range(8))
        self.head = nn.Linear(64, 100)

with init_empty_weights():
    net = Net()
total = compute_module_sizes(net)[""]
view = show_device_map(net, max_memory={{"cpu": total // 2, "disk": "1GB"}}, no_split_module_classes=["Sequential"])
"""


def _notebook(path: str) -> None:
    nb = {
        "cells": [
            {
                "cell_type": "code",
                "execution_count": None,
                "id": "map",
                "metadata": {},
                "outputs": [],
                "source": CELL,
            }
        ],
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    with open(path, "w") as f:
        json.dump(nb, f)


def _bar_devices(page) -> list[str]:
    return page.evaluate(
        "() => [...document.querySelectorAll('.jp-OutputArea .accel-nb-device-bar')].map(b => b.dataset.device)"
    )


def test_device_bars_and_live_slider(tmp_path):
    _notebook(str(tmp_path / "device_map.ipynb"))
    with LabServer(str(tmp_path)) as lab, chromium() as browser:
        page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
        open_notebook(page, lab, "device_map.ipynb")
        run_all_cells(page, lab, "device_map.ipynb")
        assert cell_errors(page) == []
        wait_until(lambda: _bar_devices(page), 60, "the device bars to render")
        assert _bar_devices(page) == ["cpu", "disk"]
        segments = page.locator('.accel-nb-device-bar[data-device="disk"] .accel-nb-module').count()
        assert segments >= 1
        title = page.locator(".accel-nb-module").first.get_attribute("title")
        assert title and "(" in title  # hover text: module path and class
        # the slider reads out the budget exactly as the bar's text writes it (decimals included)
        readout_text = page.locator(".accel-nb-budget-slider .widget-readout").first.inner_text().strip()
        slider_unit = (
            page.locator(".accel-nb-budget-slider .widget-label").first.inner_text().split("(")[1].rstrip(")")
        )
        cpu_info = page.locator('.accel-nb-device-row[data-device="cpu"] .accel-nb-device-info').inner_text()
        assert f"/ {readout_text} {slider_unit} budget" in cpu_info, (readout_text, slider_unit, cpu_info)
        disk_info = page.locator(
            '.accel-nb-device-row[data-device="disk"] .accel-nb-device-info'
        ).inner_text()
        assert "free" in disk_info and "bar drawn to what it holds, not to its budget" in disk_info
        screenshot(page, "device_map_before", SHOTS)
        # type a bigger CPU budget into the slider's readout: the map is recomputed in the kernel
        readout = page.locator(".accel-nb-budget-slider .widget-readout").first
        readout.click()
        page.keyboard.press("Control+A")
        page.keyboard.type("100000")
        page.keyboard.press("Enter")
        disk_modules = page.locator('.accel-nb-device-bar[data-device="disk"] .accel-nb-module')
        wait_until(lambda: disk_modules.count() == 0, 60, "the disk bar to empty after the slider moved")
        assert _bar_devices(page) == ["cpu", "disk"]  # disk still has a budget: its bar stays, empty
        assert page.locator('.accel-nb-device-table tr[data-device="disk"]').count() == 0
        readout_after = page.locator(".accel-nb-budget-slider .widget-readout").first.inner_text().strip()
        cpu_after = page.locator('.accel-nb-device-row[data-device="cpu"] .accel-nb-device-info').inner_text()
        assert f"/ {readout_after} {slider_unit} budget" in cpu_after, (readout_after, cpu_after)
        screenshot(page, "device_map_after", SHOTS)


QUANT_CELL = f"""
import sys
sys.path.insert(0, {ROOT!r})
from transformers import LlamaConfig, LlamaForCausalLM
from accel_nb import init_empty_weights, show_device_map
from accel_nb.big_model.quantization import TorchAoQuantizationConfig

config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=256, num_hidden_layers=4,
                     num_attention_heads=4, num_key_value_heads=2)
with init_empty_weights():
    model = LlamaForCausalLM(config)
view = show_device_map(model, max_memory={{"cpu": "200KiB", "disk": "1GB"}},
                       quantization_config=TorchAoQuantizationConfig("int8"))
"""


def test_quantized_plan_shows_dtype_and_unquantized_size(tmp_path):
    pytest.importorskip("transformers")
    _notebook(str(tmp_path / "quantized_map.ipynb"))
    with open(tmp_path / "quantized_map.ipynb") as f:
        nb = json.load(f)
    nb["cells"][0]["source"] = QUANT_CELL
    with open(tmp_path / "quantized_map.ipynb", "w") as f:
        json.dump(nb, f)
    with LabServer(str(tmp_path)) as lab, chromium() as browser:
        page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
        open_notebook(page, lab, "quantized_map.ipynb")
        run_all_cells(page, lab, "quantized_map.ipynb")
        assert cell_errors(page) == []
        wait_until(lambda: _bar_devices(page), 120, "the device bars to render")
        assert _bar_devices(page) == ["cpu", "disk"]
        row = page.locator('.jp-OutputArea .accel-nb-device-table tr[data-module="model.layers.0"]')
        assert row.locator(".accel-nb-dtype").inner_text() == "int8 + float32"
        assert "unquantized" in page.locator(".jp-OutputArea .accel-nb-quantization").inner_text()
        title = page.locator('.jp-OutputArea .accel-nb-module[data-module="model.layers.0"]').get_attribute(
            "title"
        )
        assert "int8 + float32" in title and "unquantized" in title
        screenshot(page, "device_map_quantized_before", SHOTS)
        # the slider re-plans with the quantized sizes: a budget above the quantized total empties the disk
        readout = page.locator(".accel-nb-budget-slider .widget-readout").first
        readout.click()
        page.keyboard.press("Control+A")
        page.keyboard.type("500")
        page.keyboard.press("Enter")
        disk_modules = page.locator('.accel-nb-device-bar[data-device="disk"] .accel-nb-module')
        wait_until(lambda: disk_modules.count() == 0, 60, "the disk bar to empty after the slider moved")
        screenshot(page, "device_map_quantized_after", SHOTS)
