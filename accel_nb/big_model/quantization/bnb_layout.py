"""bitsandbytes 4-bit layouts: the portable one every release reads, and the CPU-packed one of 0.50.

The portable layout (what transformers writes and every bitsandbytes release reads): ``weight`` as
packed nibbles in row order, ``weight.absmax`` a float32 vector of one scale per block of
``blocksize`` weights (row-major over output rows, then blocks), or with double quantization a
uint8 vector plus ``weight.nested_absmax`` / ``weight.nested_quant_map``.

bitsandbytes 0.50 (0.50.0 to 0.50.2 at least) repacks a 4-bit layer for its CPU kernel the first
time the layer runs a forward in eval mode without gradients on a CPU with AVX512-BF16
(``quant_state.packing_format_for_cpu``): the nibbles reordered in blocks of 32 rows, the block
scales transposed to ``(in_features / blocksize, out_features)`` and cast to bfloat16, nested
statistics folded in, and the forward then computed in bfloat16 whatever the compute dtype. Its
``state_dict`` of such a layer turns the weight back but, without double quantization, leaves
absmax transposed and in bfloat16; loaded back, the scales are read in the wrong order (logits off
by ~0.4 at a logit scale of ~0.5, no error), and the live layer itself computes wrong afterwards.

So accel_nb:
- keeps the 4-bit layers it makes in the portable layout (:func:`keep_portable`): the same numbers
  on every CPU, in the compute dtype asked for, and a ``state_dict`` that reloads exactly;
- serializes any 4-bit layer in the portable layout (:func:`portable_state`), converting a packed
  one without touching the live layer;
- converts, on load, a checkpoint written from a packed layer by bitsandbytes' own ``state_dict``
  (a 2-D bfloat16 absmax), exactly (:func:`portable_stats`);
- refuses any other absmax layout with an error naming the installed bitsandbytes and the
  releases it was tested with (:data:`TESTED_RELEASES`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .config import QuantizationError

TESTED_RELEASES = ("0.50.0", "0.50.2")  # the oldest and the newest bitsandbytes the extra allows
_ROWS_PER_PACK = 32  # bitsandbytes' CPU packing: rows interleaved in blocks of 32


def installed_version() -> str:
    try:
        import bitsandbytes

        return str(getattr(bitsandbytes, "__version__", "unknown"))
    except ImportError:  # pragma: no cover - callers have imported it already
        return "not installed"


def keep_portable(layer: nn.Module) -> None:
    """Stop bitsandbytes repacking ``layer`` for its bfloat16 CPU kernel (see the module's docstring)."""
    if "support_avx512bf16_for_cpu" in layer.__dict__:
        layer.support_avx512bf16_for_cpu = False


def is_packed(layer: nn.Module) -> bool:
    state = getattr(getattr(layer, "weight", None), "quant_state", None)
    return bool(getattr(state, "packing_format_for_cpu", False))


def _unpack_weight(packed: torch.Tensor, qshape: torch.Size) -> torch.Tensor:
    """The portable packed nibbles (``qshape``) of a CPU-packed ``(out, in/2)`` weight."""
    n, half = packed.shape
    b = _ROWS_PER_PACK
    pairs = packed.reshape(-1, b)  # each byte: a low nibble (first 32 of 64) and a high one (last 32)
    sixty_four = torch.cat([pairs & 0xF, pairs >> 4], dim=-1)  # [..., 64]: (row in block, column pair)
    nibbles = sixty_four.reshape(n // b, half, b, 2).transpose(1, 2).reshape(n, 2 * half)
    flat = nibbles.reshape(-1)
    out = (flat[::2] << 4) | flat[1::2]
    return out.to(torch.uint8).reshape(qshape)


def portable_state(layer: nn.Module) -> dict[str, torch.Tensor]:
    """``weight`` and its ``weight.*`` quantized state of a bitsandbytes 4-bit layer, portable layout.

    The live layer is left as it is (a packed one stays packed)."""
    param = layer.weight
    state = param.quant_state
    if not getattr(state, "packing_format_for_cpu", False):
        weight = param.detach().as_subclass(torch.Tensor)
        return {
            "weight": weight,
            **{f"weight.{k}": v.detach() for k, v in state.as_dict(packed=True).items()},
        }
    from bitsandbytes.functional import QuantState, quantize_blockwise

    weight = _unpack_weight(param.data, state.original_qshape)
    storage = getattr(state, "original_storage_type", None)
    if storage is not None and storage != torch.uint8:
        weight = weight.view(storage)
    absmax = state.absmax.t().reshape(-1).to(torch.float32)  # (in/bs, out) -> out rows of in/bs blocks
    common = dict(
        shape=state.shape,
        code=state.code,
        blocksize=state.blocksize,
        quant_type=state.quant_type,
        dtype=state.original_dtype,
    )
    if getattr(state, "original_nested", False):  # the statistics quantized again, as bitsandbytes does
        offset = absmax.mean()
        nested, state2 = quantize_blockwise(absmax - offset, blocksize=256)
        portable = QuantState(absmax=nested, offset=offset, state2=state2, **common)
    else:
        portable = QuantState(absmax=absmax, **common)
    return {"weight": weight, **{f"weight.{k}": v.detach() for k, v in portable.as_dict(packed=True).items()}}


def portable_stats(stats: dict[str, Any], where: str) -> dict[str, Any]:
    """The saved quantized state of one 4-bit layer (keys without ``weight.``), in the portable layout.

    Converts the absmax of a checkpoint written from a CPU-packed layer; refuses layouts it does not know."""
    absmax = stats.get("absmax")
    if absmax is None or absmax.dim() == 1:
        return stats
    nested = "nested_absmax" in stats
    if absmax.dim() == 2 and not nested and absmax.is_floating_point():
        # bitsandbytes 0.50's state_dict of a layer repacked for its CPU kernel: (in/bs, out), bfloat16
        return {**stats, "absmax": absmax.t().reshape(-1).to(torch.float32)}
    raise QuantizationError(
        f"{where}: the 4-bit block scales (weight.absmax) are saved as a {absmax.dim()}-D {absmax.dtype} "
        f"tensor of shape {tuple(absmax.shape)}{' with double quantization' if nested else ''}, a layout "
        f"accel_nb does not know (bitsandbytes installed: {installed_version()}; layouts known from "
        f"bitsandbytes {' and '.join(TESTED_RELEASES)}). Re-save the model from its float weights, or "
        "with the bitsandbytes release it was written with. Nothing was loaded"
    )
