"""Offline stand-ins for what the reference's example scripts download (GLUE/MRPC, bert-base-cased and
the ``evaluate`` metric; wikitext and SmolLM), for tests/test_reference_examples.py.

Written for accel_nb (not derived from the reference). The example variants beside this file replace
ONLY their data, model and metric sources by these:

- ``offline_mrpc()``: a synthetic MRPC-shaped ``DatasetDict`` (splits ``train``/``validation`` with the
  columns ``idx``, ``sentence1``, ``sentence2``, ``label``) that knows the ``datasets`` methods the
  examples call: ``map(fn, batched=True, remove_columns=...)``, ``rename_column``, ``select``,
  ``num_rows`` and a column by name; ``DatasetDict`` builds one from such splits (cross_validation.py);
- ``offline_tokenizer()``: a real ``transformers.BertTokenizer`` over a small built-in vocabulary;
- ``tiny_bert()``: a real ``BertForSequenceClassification`` built from a small ``BertConfig``;
- ``offline_wikitext()``, ``offline_causal_tokenizer()``, ``tiny_causal_lm()``: for the causal-LM example,
  wikitext-shaped lines (a ``text`` column, some lines empty; ``filter(fn, input_columns=...)`` as in
  ``datasets``), the same tokenizer with an end-of-sequence token and only ``input_ids``, and a real
  2-layer ``LlamaForCausalLM`` (SmolLM's architecture) from a small ``LlamaConfig``;
- ``offline_metric()``: GLUE/MRPC's accuracy and F1 computed by hand (``add_batch`` / ``compute``, which
  also takes ``predictions=`` and ``references=`` as ``evaluate``'s does).

When ``OFFLINE_RECORD_DIR`` is set, each process also writes ``record-rank<R>.json`` there at exit: every
training loss the model returned, every metric the script computed, and a digest of how far training
moved the last model built (its weight change projected on a fixed direction, and its norm) -- what the
test compares between the reference and accel_nb. Nothing here touches the library under test.

``OFFLINE_EXIT_WITHOUT_TEARDOWN=1`` (set for the reference's runs only) works around an exit deadlock of
torch 2.13's gloo seen with the reference: its ``end_training()`` destroys the process group while the
DDP reducer still holds it, and when the reducer then drops the last reference the main thread joins
gloo's worker thread with the GIL held while that thread waits for the GIL to free a finished allgather
(ranks hang, or abort with "terminate called without an active exception"). Here the process group is
kept referenced by the first ``tiny_bert()`` call, and the process leaves with ``os._exit`` after its
atexit handlers -- with status 1 if an exception escaped the script.
"""

from __future__ import annotations

import atexit
import json
import os
import random
import sys

import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    BertTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
)

_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_WORDS = (
    "the a company said shares stock market price rose fell percent year quarter profit loss sales "
    "report analysts expected billion million government official court ruling case judge law new "
    "plan deal talks agreed week monday friday city police people home service network"
).split()
_SIZES = {"train": 100, "validation": 41}  # 41: the last evaluation batch is uneven on 2 processes


def _vocab() -> dict[str, int]:
    return {token: i for i, token in enumerate(_SPECIALS + _WORDS)}


def offline_tokenizer() -> BertTokenizer:
    """A BERT word-piece tokenizer over the built-in vocabulary (no download)."""
    return BertTokenizer(vocab=_vocab())


class _Split:
    """A list of rows with the column operations the examples use."""

    def __init__(self, columns: dict[str, list]):
        self._columns = columns

    @property
    def column_names(self) -> list[str]:
        return list(self._columns)

    def __len__(self) -> int:
        return len(next(iter(self._columns.values())))

    @property
    def num_rows(self) -> int:
        return len(self)

    def __getitem__(self, i: int | str) -> dict | list:
        if isinstance(i, str):  # a column, as datasets gives it
            return list(self._columns[i])
        return {name: values[i] for name, values in self._columns.items()}

    def filter(self, function, input_columns=None):
        def keep(i: int) -> bool:
            if input_columns is None:
                return bool(function(self[i]))
            if isinstance(input_columns, str):
                return bool(function(self._columns[input_columns][i]))
            return bool(function(*(self._columns[c][i] for c in input_columns)))

        return self.select([i for i in range(len(self)) if keep(i)])

    def select(self, indices):
        indices = [int(i) for i in indices]
        return _Split({name: [values[i] for i in indices] for name, values in self._columns.items()})

    def map(self, function, batched: bool = False, remove_columns=()):
        if not batched:
            raise NotImplementedError("offline_mrpc: only batched=True is used by the examples")
        added = dict(function(dict(self._columns)))
        kept = {k: v for k, v in self._columns.items() if k not in set(remove_columns)}
        return _Split({**kept, **{k: list(v) for k, v in added.items()}})

    def rename_column(self, old: str, new: str):
        return _Split({(new if k == old else k): v for k, v in self._columns.items()})


class _DatasetDict(dict):
    def map(self, function, batched: bool = False, remove_columns=()):
        return _DatasetDict(
            {
                name: split.map(function, batched=batched, remove_columns=remove_columns)
                for name, split in self.items()
            }
        )

    def filter(self, function, input_columns=None):
        return _DatasetDict({name: split.filter(function, input_columns) for name, split in self.items()})

    def rename_column(self, old: str, new: str):
        return _DatasetDict({name: split.rename_column(old, new) for name, split in self.items()})


DatasetDict = _DatasetDict  # what `from datasets import DatasetDict` gives the examples that build one


def _pair(rng: random.Random) -> tuple[str, str, int]:
    first = [rng.choice(_WORDS) for _ in range(rng.randint(4, 10))]
    label = rng.randint(0, 1)
    if label:  # a paraphrase: the same words, two swapped, one replaced
        second = list(first)
        i, j = rng.randrange(len(second)), rng.randrange(len(second))
        second[i], second[j] = second[j], second[i]
        second[rng.randrange(len(second))] = rng.choice(_WORDS)
    else:
        second = [rng.choice(_WORDS) for _ in range(rng.randint(4, 10))]
    return " ".join(first), " ".join(second), label


def offline_mrpc() -> _DatasetDict:
    """MRPC-shaped sentence pairs, the same on every process and every run."""
    rng = random.Random(0)
    splits = {}
    for name, size in _SIZES.items():
        rows = [_pair(rng) for _ in range(size)]
        splits[name] = _Split(
            {
                "sentence1": [r[0] for r in rows],
                "sentence2": [r[1] for r in rows],
                "label": [r[2] for r in rows],
                "idx": list(range(size)),
            }
        )
    return _DatasetDict(splits)


_TEXT_SIZES = {"train": 500, "validation": 30}  # the causal-LM example selects the first 500 training lines


def offline_wikitext() -> _DatasetDict:
    """wikitext-shaped lines (one in five empty, as wikitext has them), the same on every process and run."""
    rng = random.Random(1)
    splits = {}
    for name, size in _TEXT_SIZES.items():
        lines = [
            "" if rng.random() < 0.2 else " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 12)))
            for _ in range(size)
        ]
        splits[name] = _Split({"text": lines})
    return _DatasetDict(splits)


def offline_causal_tokenizer() -> BertTokenizer:
    """The built-in vocabulary's tokenizer with an end-of-sequence token, giving only ``input_ids``."""
    return BertTokenizer(vocab=_vocab(), eos_token="[SEP]", model_input_names=["input_ids"])


_RECORD: dict = {"train_losses": [], "metrics": [], "models_built": 0}
_LAST_MODEL: dict = {}
_HELD_GROUPS: list = []
_ESCAPED: list = []
_previous_excepthook = sys.excepthook


def _excepthook(kind, value, tb):
    _ESCAPED.append(kind)
    _previous_excepthook(kind, value, tb)


sys.excepthook = _excepthook


def _hold_process_group() -> None:
    if os.environ.get("OFFLINE_EXIT_WITHOUT_TEARDOWN") != "1" or _HELD_GROUPS:
        return
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        _HELD_GROUPS.append(torch.distributed.group.WORLD)


def _on_forward(module, args, kwargs, output):
    if module.training and getattr(output, "loss", None) is not None:
        _RECORD["train_losses"].append(round(float(output.loss.detach()), 6))


def tiny_bert(num_labels: int = 2) -> BertForSequenceClassification:
    """A 2-layer, 32-wide BERT classifier, initialised from the current torch seed."""
    config = BertConfig(
        vocab_size=len(_vocab()),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        num_labels=num_labels,
    )
    return _recorded(BertForSequenceClassification(config))


def tiny_causal_lm() -> LlamaForCausalLM:
    """A 2-layer, 32-wide Llama causal LM, initialised from the current torch seed."""
    config = LlamaConfig(
        vocab_size=len(_vocab()),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return _recorded(LlamaForCausalLM(config))


def _recorded(model):
    """``model``, whose training losses and weight changes the record will hold."""
    _hold_process_group()
    model.register_forward_hook(_on_forward, with_kwargs=True)
    _RECORD["models_built"] += 1
    _LAST_MODEL["model"] = model
    _LAST_MODEL["initial"] = [p.detach().clone() for p in model.parameters()]
    return model


class _GlueMrpcMetric:
    """GLUE/MRPC's metric: accuracy and F1 of the positive class, over every batch added since compute."""

    def __init__(self):
        self._predictions: list[int] = []
        self._references: list[int] = []

    def add_batch(self, predictions, references):
        self._predictions += [int(p) for p in predictions]
        self._references += [int(r) for r in references]

    def compute(self, predictions=None, references=None) -> dict:
        if predictions is not None or references is not None:
            self.add_batch(predictions=predictions, references=references)
        pairs = list(zip(self._predictions, self._references, strict=True))
        self._predictions, self._references = [], []
        tp = sum(1 for p, r in pairs if p == 1 and r == 1)
        fp = sum(1 for p, r in pairs if p == 1 and r == 0)
        fn = sum(1 for p, r in pairs if p == 0 and r == 1)
        accuracy = sum(1 for p, r in pairs if p == r) / len(pairs)
        f1 = 2 * tp / (2 * tp + fp + fn) if tp else 0.0
        result = {"accuracy": accuracy, "f1": f1}
        _RECORD["metrics"].append({**result, "n": len(pairs)})
        return result


def offline_metric() -> _GlueMrpcMetric:
    return _GlueMrpcMetric()


def _weight_digest() -> dict:
    model = _LAST_MODEL.get("model")
    if model is None:
        return {}
    generator = torch.Generator().manual_seed(1234)
    projection, norm_sq = 0.0, 0.0
    for p, p0 in zip(model.parameters(), _LAST_MODEL["initial"], strict=True):
        delta = p.detach().to("cpu", torch.float64) - p0.to("cpu", torch.float64)
        direction = torch.randn(delta.shape, generator=generator, dtype=torch.float64)
        projection += float((delta * direction).sum())
        norm_sq += float((delta * delta).sum())
    return {"delta_projection": projection, "delta_norm": norm_sq**0.5}


@atexit.register  # registered before the library's own handlers (imported later), so it runs after them
def _at_exit():
    folder = os.environ.get("OFFLINE_RECORD_DIR")
    if folder:
        rank = os.environ.get("RANK", "0")
        with open(os.path.join(folder, f"record-rank{rank}.json"), "w") as f:
            json.dump({**_RECORD, **_weight_digest()}, f)
    if _HELD_GROUPS:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1 if _ESCAPED else 0)
