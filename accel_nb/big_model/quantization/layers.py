"""Which layers get quantized, and how one float weight becomes a quantized layer.

Linear layers (``nn.Linear``) and Conv1D-style layers (GPT-2's ``Conv1D``: a linear layer whose
weight is stored transposed, ``(in_features, out_features)``) are quantized; everything else
keeps its float weights. The output head, tied weights, ``skip_modules`` and
``keep_in_fp32_modules`` are never quantized.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from ...logging import quiet_import_notes
from .backends import backend_for
from .config import BnbQuantizationConfig, QuantizationConfig, QuantizationError

_EXTRA = 'pip install "accel_nb[quantization]"'


def require(library: str):
    """Import bitsandbytes or torchao, or raise QuantizationError naming the extra that installs it."""
    try:
        with quiet_import_notes():  # their CUDA-less import notes stay out of the user's cell
            return importlib.import_module(library)
    except ImportError as exc:
        raise QuantizationError(
            f"{library} is needed for this quantization but cannot be imported ({exc}); install it with "
            f"{_EXTRA} (or pip install {library}). Nothing was loaded"
        ) from None


@dataclass
class QuantTarget:
    """One layer to quantize: its path, its in/out features and whether its weight is stored transposed."""

    name: str
    module: nn.Module
    in_features: int
    out_features: int
    transposed: bool  # Conv1D: weight is (in, out)

    @property
    def has_bias(self) -> bool:
        return getattr(self.module, "bias", None) is not None


def as_target(name: str, module: nn.Module) -> QuantTarget | None:
    """A QuantTarget for a linear or Conv1D-style layer, else None."""
    if isinstance(module, nn.Linear):
        return QuantTarget(name, module, module.in_features, module.out_features, False)
    weight = getattr(module, "weight", None)
    if (
        type(module).__name__ == "Conv1D"
        and isinstance(weight, torch.Tensor)
        and weight.dim() == 2
        and getattr(module, "nf", None) == weight.shape[1]
        and not module._modules
    ):
        return QuantTarget(name, module, weight.shape[0], weight.shape[1], True)
    return None


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(name == p or name.startswith(p + ".") or f".{p}." in f".{name}." for p in patterns)


def default_skip_modules(model: nn.Module) -> list[str]:
    """The modules kept unquantized by default: those holding tied weights, and a model's output head.

    A model with a head (its last child, e.g. ``lm_head``) keeps the head in float for accuracy;
    a base model (e.g. ``GPT2Model``) without tied weights keeps nothing.
    """
    by_id: dict[int, list[str]] = {}
    for pname, p in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(pname)
    tied = [n for names in by_id.values() if len(names) > 1 for n in names]
    skip = [n.rsplit(".", 1)[0] for n in tied if "." in n]
    prefix = getattr(model, "base_model_prefix", None)
    is_base = bool(prefix) and not hasattr(model, prefix)
    children = list(model.named_children())
    if children and not (is_base and not tied):
        skip.append(children[-1][0])
    return list(dict.fromkeys(skip))


def find_targets(
    model: nn.Module, config: QuantizationConfig
) -> tuple[list[QuantTarget], list[str], list[str]]:
    """(layers to quantize, modules skipped in torch_dtype, modules kept in float32)."""
    skip = config.skip_modules if config.skip_modules is not None else default_skip_modules(model)
    fp32 = config.keep_in_fp32_modules or []
    targets = []
    for name, module in model.named_modules():
        target = as_target(name, module)
        if target is not None and name and not _matches(name, skip) and not _matches(name, fp32):
            targets.append(target)
    return targets, list(skip), list(fp32)


def keeps_fp32(name: str, fp32_modules: Iterable[str]) -> bool:
    return _matches(name, fp32_modules)


# -- one layer: an empty shell, and the shell filled from a float weight ------------------------------
def make_shell(target: QuantTarget, config: QuantizationConfig) -> nn.Module:
    """The quantized layer that replaces ``target``, with empty (meta) tensors (its library's back-end)."""
    layer = backend_for(config).make_shell(target.in_features, target.out_features, target.has_bias, config)
    layer.requires_grad_(False)
    return layer


def quantize_weight(
    layer: nn.Module,
    weight: torch.Tensor,
    target: QuantTarget,
    config: QuantizationConfig,
    device: torch.device,
) -> None:
    """Fill ``layer`` (a shell from make_shell) with ``weight`` (float, as saved), quantized on ``device``."""
    if target.transposed:
        weight = weight.t()
    backend_for(config).quantize_weight(layer, weight.contiguous(), config, device)


def has_4bit_bnb_layers(model: nn.Module) -> bool:
    """True when ``model`` holds bitsandbytes 4-bit layers (``Linear4bit``).

    has_4bit_bnb_layers(load_and_quantize_model(model, BnbQuantizationConfig(load_in_4bit=True), ...))  # True
    """
    return any(
        type(m).__name__ == "Linear4bit" or type(m).__name__ in ("LinearNF4", "LinearFP4")
        for m in model.modules()
    )


def get_parameter_device(parameter: nn.Module) -> torch.device:
    """The device of the first parameter of the module ``parameter`` (the reference's argument name).

    get_parameter_device(model)   # device(type='cpu')
    """
    return next(parameter.parameters()).device


get_keys_to_not_convert = default_skip_modules  # the reference's name


def replace_with_bnb_layers(
    model: nn.Module,
    bnb_quantization_config: BnbQuantizationConfig,
    modules_to_not_convert: list[str] | None = None,
    current_key_name: list[str] | None = None,
) -> nn.Module:
    """Swap each linear layer for bitsandbytes' ``Linear8bitLt`` / ``Linear4bit`` holding the same float weight.

        model = replace_with_bnb_layers(model, BnbQuantizationConfig(load_in_8bit=True), ["lm_head"])
        model.to("cpu")        # bitsandbytes quantizes each weight when it is moved (CPU or GPU)
    The reference's function (``accelerate.utils.bnb``): the layers are replaced in place and the
    model returned; weights are quantized only when the model is moved to a device (or use
    :func:`load_and_quantize_model`, which does both). ``modules_to_not_convert`` names modules
    kept as they are (a name, or a dotted path prefix). GPT-2-style ``Conv1D`` layers are replaced
    too (their transposed weight is turned the right way). ``current_key_name`` is the path of
    ``model`` inside a larger model (the reference's recursion argument). A model (meta ones
    included) with no linear layer left to replace gets a warning that says so. Needs bitsandbytes
    (runs on a CPU).
    """
    if not isinstance(bnb_quantization_config, BnbQuantizationConfig):
        raise QuantizationError(
            "replace_with_bnb_layers takes a BnbQuantizationConfig (load_in_8bit=True or load_in_4bit=True), "
            f"got {type(bnb_quantization_config).__name__}; for torchao use load_and_quantize_model"
        )
    require("bitsandbytes")
    skip = list(modules_to_not_convert or [])
    prefix = ".".join(current_key_name or [])
    replaced = 0
    for name, module in list(model.named_modules()):
        full = f"{prefix}.{name}" if prefix and name else prefix or name
        target = as_target(name, module) if name else None
        if target is None or _matches(full, skip) or _matches(name, skip):
            continue
        layer = make_shell(target, bnb_quantization_config)
        weight = module.weight.detach()
        weight = weight.t().contiguous() if target.transposed else weight
        layer.weight = backend_for(bnb_quantization_config).float_param(
            layer, weight, bnb_quantization_config
        )
        if target.has_bias:
            layer.bias = nn.Parameter(module.bias.detach(), requires_grad=False)
        layer.train(module.training)  # a model in eval mode stays so (8-bit layers differ in training)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, layer)
        replaced += 1
    if not replaced:
        warnings.warn(
            f"replace_with_bnb_layers: no linear layer of {type(model).__name__} was replaced (it has none "
            f"outside modules_to_not_convert={skip}); the model is unchanged",
            stacklevel=2,
        )
    return model
