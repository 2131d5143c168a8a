"""Tensor parallel: split each planned layer's weights over the ``tp`` mesh dimension with torch's
``parallelize_module``, from the model's own plan or a dict of module-name patterns to styles.

    plan = resolve_plan(model, "auto")               # {"model.layers.0.mlp.up_proj": "colwise", ...}
    apply_plan(model, plan, mesh["tp"])              # the planned weights become DTensors on the tp mesh

Patterns use transformers' spelling: dot-separated module names where ``*`` stands for one name
(``layers.*.mlp.down_proj``). Styles: ``colwise`` (output split over the last dimension),
``rowwise`` (input split, output summed), ``colwise_rep``/``colwise_gather_output`` (output
gathered), ``rowwise_rep``/``rowwise_split_input`` (full input split on entry), ``embedding_rowwise``
(vocabulary split), ``embedding_colwise`` (embedding dimension split, output gathered), or a torch
``ParallelStyle``. Parameters no pattern names stay whole on every rank of the tp group.
"""

from __future__ import annotations

import re
from typing import Any

import torch

__all__ = ["STYLE_NAMES", "apply_plan", "get_model_tp_size", "model_plan", "resolve_plan"]

STYLE_NAMES = (
    "colwise",
    "rowwise",
    "colwise_rep",
    "colwise_gather_output",
    "rowwise_rep",
    "rowwise_split_input",
    "embedding_rowwise",
    "embedding_colwise",
)
# style -> (which weight dimension it splits, None for a torch ParallelStyle)
_SPLIT_DIM = {
    "colwise": 0,
    "colwise_rep": 0,
    "colwise_gather_output": 0,
    "rowwise": 1,
    "rowwise_rep": 1,
    "rowwise_split_input": 1,
    "embedding_rowwise": 0,
    "embedding_colwise": 1,
}


def _style(name: str) -> Any:
    from torch.distributed.tensor import Replicate  # deferred: torch.distributed
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel  # deferred: same

    if name == "colwise":
        return ColwiseParallel()
    if name in ("colwise_rep", "colwise_gather_output", "embedding_colwise"):
        return ColwiseParallel(output_layouts=Replicate())
    if name == "rowwise":
        return RowwiseParallel()
    return RowwiseParallel(input_layouts=Replicate())  # rowwise_rep, rowwise_split_input, embedding_rowwise


def model_plan(model: torch.nn.Module) -> dict[str, Any] | None:
    """The model's own tensor-parallel plan with full module names, or None when it has none.

    Looked up as ``model.tp_plan`` (a plain attribute or transformers' merged plan), ``model._tp_plan``,
    then the config's ``base_model_tp_plan`` under the model's ``base_model_prefix``.
    """
    for attr in ("tp_plan", "_tp_plan"):
        plan = getattr(model, attr, None)
        if isinstance(plan, dict) and plan:
            return dict(plan)
    config = getattr(model, "config", None)
    base = getattr(config, "base_model_tp_plan", None)
    if isinstance(base, dict) and base:
        prefix = getattr(model, "base_model_prefix", "")
        names = dict(model.named_modules())
        if prefix and prefix in names:
            return {f"{prefix}.{k}": v for k, v in base.items()}
        return dict(base)
    return None


def _pattern(key: str) -> re.Pattern[str]:
    return re.compile(
        "^" + r"\.".join("[^.]+" if part == "*" else re.escape(part) for part in key.split(".")) + "$"
    )


def resolve_plan(model: torch.nn.Module, plan: Any, tp_size: int) -> dict[str, Any]:
    """``{module name: style}`` for every module of ``model`` the plan names; a clear error for a bad plan.

    ``plan`` is ``"auto"``/None (the model's own) or a dict of patterns. Checked here, before any
    collective: a pattern that names no module, an unknown style, a style on a module it cannot
    split, and a weight dimension ``tp_size`` does not divide.
    """
    kind = type(model).__name__
    if plan is None or plan == "auto":
        plan = model_plan(model)
        if plan is None:
            raise ValueError(
                f"tp_size={tp_size} but this {kind} has no tensor-parallel plan (no tp_plan attribute, no "
                "config.base_model_tp_plan): give one, e.g. ParallelismConfig(tp_size=2, tp_plan="
                '{"layers.*.up": "colwise", "layers.*.down": "rowwise"})'
            )
    modules = dict(model.named_modules())
    out: dict[str, Any] = {}
    missing = []
    for key, style in plan.items():
        if isinstance(style, str) and style not in STYLE_NAMES:
            raise ValueError(
                f"tp_plan[{key!r}] = {style!r} is not a tensor-parallel style; use one of {', '.join(STYLE_NAMES)} "
                "or a torch.distributed.tensor.parallel ParallelStyle"
            )
        pattern = _pattern(key)
        hits = [name for name in modules if name and pattern.match(name)]
        if not hits:
            missing.append(key)
        for name in hits:
            out[name] = style
    if missing:
        some = ", ".join(n for n in list(modules)[1:9] if n)
        raise ValueError(
            f"tp_plan names module(s) this {kind} does not have: {', '.join(map(repr, missing))}; its modules are "
            f"named like {some}, ... (print(dict(model.named_modules()).keys())); fix the pattern(s) or drop them"
        )
    for name, style in out.items():
        _check_splittable(kind, name, modules[name], style, tp_size)
    _check_ties(model, out)
    return out


def _split_dim(module: torch.nn.Module, style: Any) -> Any:
    """Which dimension of ``module.weight`` the style splits (None: left whole; "?" for a torch ParallelStyle)."""
    if style is None:
        return None
    if not isinstance(style, str):
        return "?"
    dim = _SPLIT_DIM[style]
    if isinstance(module, torch.nn.Embedding) and not style.startswith("embedding"):
        dim = 1 - dim
    return dim


def _check_ties(model: torch.nn.Module, plan: dict[str, Any]) -> None:
    """A clear error when tied weights (one tensor in several modules) would be split in different ways."""
    for names in _tied_groups(model):
        owners = [n.rpartition(".")[0] for n in names]
        dims = {_split_dim(model.get_submodule(o), plan.get(o)) for o in owners}
        if len(dims) > 1:
            styles = ", ".join(f"{o or type(model).__name__}: {plan.get(o, 'not planned')}" for o in owners)
            raise ValueError(
                f"tp_plan splits the tied weight {' = '.join(names)} in different ways ({styles}); give both modules "
                "styles that split it along the same dimension (e.g. embedding_rowwise with colwise_gather_output), "
                "or untie them (tie_word_embeddings=False)"
            )


def _check_splittable(kind: str, name: str, module: torch.nn.Module, style: Any, tp_size: int) -> None:
    if not isinstance(style, str):
        return
    wants = torch.nn.Embedding if style.startswith("embedding") else (torch.nn.Linear, torch.nn.Embedding)
    if not isinstance(module, wants):
        raise ValueError(
            f"tp_plan gives {kind}.{name} ({type(module).__name__}) the style {style!r}, which splits "
            f"{'an nn.Embedding' if style.startswith('embedding') else 'an nn.Linear or nn.Embedding'}; plan "
            "that module's Linear children instead, or pass a torch ParallelStyle for it"
        )
    weight = module.weight
    dim = _SPLIT_DIM[style]
    if isinstance(module, torch.nn.Embedding) and not style.startswith("embedding"):
        dim = 1 - dim  # torch splits an embedding's table the other way round for colwise/rowwise
    if weight.shape[dim] % tp_size:
        raise ValueError(
            f"tp_plan style {style!r} splits dimension {dim} of {kind}.{name}.weight {tuple(weight.shape)} over "
            f"tp_size={tp_size}, which does not divide {weight.shape[dim]}; pick a tp_size that divides it"
        )


def apply_plan(model: torch.nn.Module, plan: dict[str, Any], tp_mesh: Any) -> None:
    """Split the planned modules over ``tp_mesh`` in place (their weights become DTensors).

    Every rank of the tp group must call it with the same model (same initial weights): each
    keeps its slice of them.
    """
    from torch.distributed.tensor.parallel import parallelize_module  # deferred: torch.distributed

    tied = _tied_groups(model)
    parallelize_module(
        model,
        tp_mesh,
        {name: _style(style) if isinstance(style, str) else style for name, style in plan.items()},
    )
    _retie(model, tied)


def _tied_groups(model: torch.nn.Module) -> list[list[str]]:
    """Names of the parameters that are one tensor (tied weights, e.g. the embedding and the output layer)."""
    seen: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        seen.setdefault(id(param), []).append(name)
    return [names for names in seen.values() if len(names) > 1]


def _retie(model: torch.nn.Module, groups: list[list[str]]) -> None:
    """Tie each group again after splitting (each module got its own split copy); a clear error when
    the plan split the tied weight two different ways."""
    from torch.distributed.tensor import DTensor  # deferred: torch.distributed

    for names in groups:
        params = [model.get_parameter(n) for n in names]
        layouts = {
            (tuple(p.placements), tuple(p.shape)) if isinstance(p, DTensor) else ("whole", tuple(p.shape))
            for p in params
        }
        if len(layouts) > 1:
            raise ValueError(
                f"tp_plan splits the tied weights {', '.join(names)} in different ways ({sorted(map(str, layouts))}); "
                "give their modules styles that split the weight the same way (e.g. embedding_rowwise with "
                "colwise_gather_output), or untie them (tie_word_embeddings=False)"
            )
        first = params[0]
        for name in names[1:]:
            owner, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(owner) if owner else model, leaf, first)


def get_model_tp_size(model: torch.nn.Module) -> int | None:
    """The tensor-parallel degree a transformers model was loaded with (``tp_plan``), or None if it was not split.

    transformers 4 keeps it as ``model.tp_size``; transformers 5 in ``model.config.distributed_config``
    (an object, or a plain dict after a JSON round trip) and leaves ``model.tp_size`` as None.

        get_model_tp_size(AutoModelForCausalLM.from_pretrained(name, tp_plan="auto"))   # e.g. 2
    """
    size = getattr(model, "tp_size", None)
    if size is not None:
        return size
    distributed = getattr(getattr(model, "config", None), "distributed_config", None)
    if isinstance(distributed, dict):
        return distributed.get("tp_size")
    return getattr(distributed, "tp_size", None)
