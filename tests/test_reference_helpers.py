"""Small helpers of the reference that code written for it imports, with the reference's meaning
(checked side by side where the reference is installed)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from accel_nb.utils import get_model_tp_size


def _models():
    plain = torch.nn.Linear(2, 2)
    old_style = torch.nn.Linear(2, 2)
    old_style.tp_size = 2  # transformers 4 keeps the degree on the model
    new_style = torch.nn.Linear(2, 2)
    new_style.tp_size = None  # transformers 5 leaves a None stub and moves the degree to the config
    new_style.config = SimpleNamespace(distributed_config=SimpleNamespace(tp_size=4))
    from_json = torch.nn.Linear(2, 2)
    from_json.config = SimpleNamespace(distributed_config={"tp_size": 8})
    return [plain, old_style, new_style, from_json]


def test_get_model_tp_size_reads_both_transformers_generations():
    assert [get_model_tp_size(m) for m in _models()] == [None, 2, 4, 8]


def test_get_model_tp_size_matches_the_reference():
    reference = pytest.importorskip("accelerate.utils")
    assert [get_model_tp_size(m) for m in _models()] == [reference.get_model_tp_size(m) for m in _models()]


SCRIPT_ARGS = [  # (arguments, whether a flag lacks its value)
    (
        ["--model_name_or_path", "bert", "--do_train", "False", "--epochs", "3", "--learning_rate", "5e-5"],
        False,
    ),
    (["--max_steps", "50.5", "--name", "x", "--flag", "True"], False),
    ([], False),
    (["--model", "bert", "--do_train", "--epochs", "3"], True),
    (["--epochs", "3", "--do_predict"], True),  # the last one
]


@pytest.mark.parametrize("args, refused", SCRIPT_ARGS)
def test_script_arguments_become_typed_values_as_in_the_reference(args, refused):
    from accel_nb.utils.launch import _convert_nargs_to_dict

    def outcome(convert):
        try:
            converted = convert(args)
        except ValueError as exc:
            return "store_true" in str(exc)
        return [(k, v, type(v)) for k, v in converted.items()]

    ours = outcome(_convert_nargs_to_dict)
    assert (ours is True) == refused
    if args[:2] == ["--max_steps", "50.5"]:
        assert ours == [("max_steps", 50.5, float), ("name", "x", str), ("flag", True, bool)]
    reference = pytest.importorskip("accelerate.utils.launch")
    assert ours == outcome(reference._convert_nargs_to_dict)


def test_recursively_apply_refuses_other_types_in_the_references_words_with_a_note():
    from accel_nb.utils import recursively_apply

    with pytest.raises(TypeError) as ours:
        recursively_apply(torch.tensor, (torch.tensor(1), 1), error_on_other_type=True)
    assert ours.value.__notes__ == ["Use gather_object / broadcast_object_list for arbitrary Python objects."]
    reference = pytest.importorskip("accelerate.utils")
    with pytest.raises(TypeError) as theirs:
        reference.recursively_apply(torch.tensor, (torch.tensor(1), 1), error_on_other_type=True)
    assert str(ours.value) == str(theirs.value)


def test_skipped_environment_entries_are_logged_on_the_references_logger_path():
    import logging

    from accel_nb.utils.environment import convert_dict_to_env_variables

    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logger = logging.getLogger("accel_nb.utils.environment")
    logger.addHandler(handler)
    try:
        assert convert_dict_to_env_variables({"A": "1", "B": "<x"}) == ["A=1\n"]
    finally:
        logger.removeHandler(handler)
    assert [r.getMessage() for r in records] == [
        "WARNING: Skipping B=<x as it contains forbidden characters or missing values."
    ]


def test_a_wrong_shape_is_refused_in_the_references_words_with_the_path_in_a_note():
    from accel_nb.utils import set_module_tensor_to_device

    model = torch.nn.Sequential(torch.nn.Linear(3, 4))
    with pytest.raises(ValueError) as ours:
        set_module_tensor_to_device(model, "0.weight", "cpu", value=torch.zeros(2, 2))
    assert "'0.weight': pass a tensor of the module's shape" in ours.value.__notes__[0]
    reference = pytest.importorskip("accelerate.utils")
    with pytest.raises(ValueError) as theirs:
        reference.set_module_tensor_to_device(model, "0.weight", "cpu", value=torch.zeros(2, 2))
    assert str(ours.value) == str(theirs.value)


def test_the_bitsandbytes_multi_backend_gate_answers_as_the_reference():
    from unittest import mock

    import accel_nb.accelerator
    from accel_nb.utils.imports import is_bitsandbytes_multi_backend_available

    reference = pytest.importorskip("accelerate.utils.imports")
    assert is_bitsandbytes_multi_backend_available() == reference.is_bitsandbytes_multi_backend_available()
    # code written for the reference patches it where the reference's Accelerator module imports it
    with mock.patch("accel_nb.accelerator.is_bitsandbytes_multi_backend_available", return_value=False):
        assert accel_nb.accelerator.is_bitsandbytes_multi_backend_available() is False


def test_a_quantized_model_on_the_cpu_needs_the_references_gate():
    from unittest import mock

    from accel_nb.accelerator.device_maps import quantized_model_stays

    model = torch.nn.Linear(2, 2)
    model.is_loaded_in_8bit = True
    model.hf_device_map = {"": "cpu"}
    with mock.patch("accel_nb.accelerator.is_bitsandbytes_multi_backend_available", return_value=True):
        assert quantized_model_stays(model, torch.device("cpu"))  # bitsandbytes runs on the CPU: it stays
    with mock.patch("accel_nb.accelerator.is_bitsandbytes_multi_backend_available", return_value=False):
        with pytest.raises(
            ValueError, match="CPU or disk offload"
        ):  # the reference's refusal, where it refuses
            quantized_model_stays(model, torch.device("cpu"))
