"""torch.compile from prepare(): compiled training gives eager's weights (1 and 2 gloo processes),
regional compilation gives the whole model's outputs, compiler failures fall back to eager with a
warning (a backend that raises, no C++ compiler for inductor), bad input is a clear error, and the
launch config's dynamo_config reaches the ranks."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from accel_nb.accelerator import Accelerator
from accel_nb.compile.apply import compile_regions, find_repeated_blocks, has_compiled_regions
from accel_nb.compile.options import CompileOptions, TorchDynamoPlugin, resolve_compile_options
from accel_nb.state import _reset_all_states
from accel_nb.utils import set_seed
from tests.dist_helpers import run_ranks
from tests.test_training_equivalence import (
    _assert_close,
    _assert_different,
    _data,
    _model,
    _train_plain,
    _weights,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.usefixtures("fresh_state")  # tests/conftest.py: one process, fresh state


class Block(nn.Module):
    """A small residual MLP block: the repeated class of BlockNet."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1, self.fc2 = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


class BlockNet(nn.Module):
    """Input layer, 3 repeated blocks in a ModuleList, output layer (regression on _data)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(6, 16)
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.out = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def _block_net() -> BlockNet:
    set_seed(0)
    return BlockNet()


GRAPHS: list[int] = []  # nodes of each graph counting_aot_eager compiled in this process


def counting_aot_eager(gm, example_inputs):
    """torch's aot_eager backend, counting the graphs it gets (a compile that compiles nothing fails the tests)."""
    GRAPHS.append(len(gm.graph.nodes))
    return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)


def failing_backend(gm, example_inputs):  # a real compiler failure: the backend itself raises
    raise RuntimeError("this backend cannot compile anything")


def _train_compiled(batch_size, options, accumulation=1, block_model=False, epochs=2, n=64):
    """The training-core loop with prepare(compile=...); runs on however many ranks the environment describes."""
    torch._dynamo.reset()
    GRAPHS.clear()
    acc = Accelerator(gradient_accumulation_steps=accumulation, compile=options)
    model = _block_net() if block_model else _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, opt, dl = acc.prepare(model, opt, DataLoader(_data(n), batch_size=batch_size))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(epochs):
            for x, y in dl:
                with acc.accumulate(model):
                    acc.backward(torch.nn.functional.mse_loss(model(x), y))
                    opt.step()
                    opt.zero_grad()
    plain = acc.unwrap_model(model, keep_torch_compile=False)
    return {
        "w": _weights(plain),
        "type": type(model).__name__,
        "plain_type": type(plain).__name__,
        "regions": has_compiled_regions(plain),
        "graphs": len(GRAPHS),
        "warnings": [str(w.message) for w in caught if "torch.compile" in str(w.message)],
    }


def _train_plain_blocks(batch_size, epochs=2, n=64):
    model = _block_net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for _ in range(epochs):
        for x, y in DataLoader(_data(n), batch_size=batch_size):
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    return _weights(model)


# -- equivalence -------------------------------------------------------------------------------------


@pytest.mark.multiproc
def test_two_compiled_processes_end_with_the_weights_of_eager_training():
    two = run_ranks(_train_compiled, 2, args=(4, CompileOptions(backend=counting_aot_eager)))
    # compiled inside the DDP wrapper (dynamo skips DDP's forward, and nn.Sequential's with it)
    assert two[0]["type"] == "DistributedDataParallel" and two[0]["plain_type"] == "Sequential"
    assert two[0]["graphs"] >= 1 and two[0]["warnings"] == []  # it compiled: no fallback
    _assert_close(two[0]["w"], two[1]["w"])
    _assert_close(two[0]["w"], _train_plain(8))
    _assert_different(two[0]["w"], _train_plain(4))


@pytest.mark.multiproc
def test_two_compiled_processes_with_accumulation_and_regional_blocks():
    options = CompileOptions(backend=counting_aot_eager, regional=True)
    two = run_ranks(_train_compiled, 2, args=(2, options, 2, True))
    assert two[0]["type"] == "DistributedDataParallel" and two[0]["regions"]  # blocks compiled in place
    assert two[0]["graphs"] >= 1  # one block graph, reused by the three blocks (more when dynamo recompiles)
    _assert_close(two[0]["w"], two[1]["w"])
    _assert_close(two[0]["w"], _train_plain_blocks(8))  # 2 ranks x batch 2 x 2 accumulated steps


def test_regional_and_whole_model_compilation_give_eager_outputs_and_gradients():
    x = torch.randn(5, 6)
    results = {}
    for name, options in (
        ("eager", None),
        ("whole", CompileOptions(backend="aot_eager")),
        ("regional", CompileOptions(backend="aot_eager", regional=True)),
        ("named", CompileOptions(backend="aot_eager", regional=True, block_class="Block")),
    ):
        torch._dynamo.reset()
        _reset_all_states()
        model = Accelerator(cpu=True, compile=options).prepare(_block_net())
        out = model(x)
        out.sum().backward()
        plain = Accelerator().unwrap_model(model, keep_torch_compile=False)
        results[name] = (out.detach(), {k: p.grad.clone() for k, p in plain.named_parameters()}, model)
    eager_out, eager_grads, _ = results["eager"]
    for name in ("whole", "regional", "named"):
        out, grads, model = results[name]
        assert torch.allclose(out, eager_out, atol=1e-6), name
        assert grads.keys() == eager_grads.keys()  # regional keeps plain parameter names
        assert all(torch.allclose(grads[k], eager_grads[k], atol=1e-6) for k in grads), name
    assert type(results["whole"][2]).__name__ == "OptimizedModule"
    regional = results["regional"][2]
    assert isinstance(regional, BlockNet) and has_compiled_regions(regional)
    assert [b._compiled_call_impl is not None for b in regional.blocks] == [True, True, True]
    assert regional.inp._compiled_call_impl is None  # only the blocks are compiled


def test_regional_compilation_compiles_torchs_own_block_classes_once():
    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(
                nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True) for _ in range(3)
            )

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    set_seed(0)
    model, x = Encoder(), torch.randn(2, 4, 8)
    expected = model(x)
    GRAPHS.clear()
    compiled = Accelerator(
        cpu=True, compile=CompileOptions(backend=counting_aot_eager, regional=True)
    ).prepare(model)
    assert torch.allclose(compiled(x), expected, atol=1e-5)
    # block.compile() alone would hand dynamo a frame of torch.nn, which it skips: nothing compiled
    assert 0 < len(GRAPHS) < 3  # fewer graphs than layers: the same code, reused (one recompile here)


def test_find_repeated_blocks_picks_the_largest_repeated_class():
    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Linear(1, 1)

    net = BlockNet()
    net.heads = nn.ModuleList(Tiny() for _ in range(5))  # more instances, fewer parameters
    assert [type(b).__name__ for b in find_repeated_blocks(net)] == ["Block"] * 3
    assert find_repeated_blocks(net, Tiny) == list(net.heads)
    assert find_repeated_blocks(nn.Linear(2, 2)) == []
    same = compile_regions(net, backend="eager")  # the reference's spelling: keyword compile options
    assert same is net and all(b._compiled_call_impl is not None for b in net.blocks)


def test_unwrap_model_gives_the_plain_module_and_keeps_the_prepared_one_compiled():
    model = nn.Linear(3, 2)
    prepared = Accelerator(cpu=True, compile=CompileOptions(backend="eager")).prepare(model)
    acc = Accelerator()
    assert acc.unwrap_model(prepared, keep_torch_compile=False) is model
    kept = acc.unwrap_model(prepared)
    assert kept is prepared and kept._orig_mod is model


# -- fallback ----------------------------------------------------------------------------------------


def test_a_backend_that_raises_falls_back_to_eager_with_one_warning_and_trains_on():
    result = _train_compiled(8, CompileOptions(backend=failing_backend))
    assert len(result["warnings"]) == 1, result["warnings"]  # once per model, not once per step
    message = result["warnings"][0]
    assert "failed for Sequential" in message and "this backend cannot compile anything" in message
    assert "runs eagerly" in message and "compile=False" in message
    _assert_close(result["w"], _train_plain(8))


@pytest.mark.multiproc
def test_the_fallback_under_ddp_and_regional_blocks_trains_like_eager():
    whole, regional = run_ranks(
        lambda: (
            _train_compiled(4, CompileOptions(backend=failing_backend)),
            _train_compiled(4, CompileOptions(backend=failing_backend, regional=True), 1, True),
        ),
        2,
    )[0]
    assert len(whole["warnings"]) == 1 and "failed for Sequential" in whole["warnings"][0]
    assert len(regional["warnings"]) == 1 and "BlockNet (its Block blocks)" in regional["warnings"][0]
    _assert_close(whole["w"], _train_plain(8))
    _assert_close(regional["w"], _train_plain_blocks(8))


def test_fallback_false_raises_the_compiler_failure_with_a_note():
    from torch._dynamo.exc import BackendCompilerFailed

    model = Accelerator(cpu=True, compile=CompileOptions(backend=failing_backend, fallback=False)).prepare(
        nn.Linear(3, 2)
    )
    with pytest.raises(BackendCompilerFailed) as info:
        model(torch.randn(2, 3))
    assert any("fallback=False" in note for note in info.value.__notes__)


def test_fullgraph_makes_a_graph_break_an_error_that_says_so():
    class Breaks(nn.Module):
        def forward(self, x):
            torch._dynamo.graph_break()
            return x * 2

    model = Accelerator(cpu=True, compile=CompileOptions(backend="eager", fullgraph=True)).prepare(Breaks())
    with pytest.raises(Exception) as info:
        model(torch.randn(2))
    assert any(
        "fullgraph=True makes a graph break an error" in n for n in getattr(info.value, "__notes__", [])
    )
    torch._dynamo.reset()
    _reset_all_states()
    tolerant = Accelerator(cpu=True, compile=CompileOptions(backend="eager")).prepare(Breaks())
    assert torch.equal(tolerant(torch.ones(2)), torch.full((2,), 2.0))  # fullgraph=False: split, no error


_INDUCTOR_SCRIPT = textwrap.dedent(
    """
    import warnings, torch
    from accel_nb import Accelerator, CompileOptions
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    model.load_state_dict(eager.state_dict())
    acc = Accelerator(cpu=True, compile=CompileOptions(backend="inductor"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    x = torch.randn(4, 5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            acc.backward(model(x).pow(2).mean()); opt.step(); opt.zero_grad()
            eager(x).pow(2).mean().backward(); eager_opt.step(); eager_opt.zero_grad()
    for w in caught:
        if "torch.compile" in str(w.message):
            print("WARNING:", w.message)
    plain = acc.unwrap_model(model, keep_torch_compile=False)
    same = all(torch.allclose(a, b, atol=1e-5) for a, b in zip(plain.parameters(), eager.parameters()))
    print("SAME", same)
    """
)


def _run_inductor_script(tmp_path, **env):
    full = dict(
        os.environ,
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
        TORCHINDUCTOR_COMPILE_THREADS="1",
        PYTHONPATH=ROOT,
        **env,
    )
    out = subprocess.run(
        [sys.executable, "-c", _INDUCTOR_SCRIPT], env=full, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_inductor_compiles_a_tiny_model_that_trains_like_eager(tmp_path):
    stdout = _run_inductor_script(tmp_path)  # the real inductor: C++ code built with this machine's compiler
    assert "SAME True" in stdout and "WARNING" not in stdout
    assert any(name.endswith(".so") for _, _, files in os.walk(tmp_path / "inductor") for name in files)


def test_inductor_without_a_cpp_compiler_falls_back_with_a_warning(tmp_path):
    stdout = _run_inductor_script(tmp_path, CXX=str(tmp_path / "no-such-c++"))
    assert "SAME True" in stdout
    assert stdout.count("WARNING:") == 1 and "InvalidCxxCompiler" in stdout and "runs eagerly" in stdout


# -- bad input ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"compile": CompileOptions(backend="turbo")}, ValueError, "backend 'turbo' is not available"),
        ({"compile": True, "dynamo_backend": "eager"}, ValueError, "only one of compile and dynamo_backend"),
        ({"dynamo_backend": "eager", "dynamo_plugin": TorchDynamoPlugin()}, ValueError, "only one of"),
        ({"compile": "yes"}, TypeError, "must be True, False or a CompileOptions"),
        ({"dynamo_plugin": {"backend": "eager"}}, TypeError, "must be a TorchDynamoPlugin"),
        ({"dynamo_backend": "nvprims_nvfuser"}, ValueError, "not available in this torch"),
    ],
)
def test_bad_compile_arguments_are_clear_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        Accelerator(cpu=True, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"backend": "eager", "mode": "max-autotune"}, "mode='max-autotune' is for the inductor backend"),
        ({"mode": "fastest"}, "not a torch.compile mode"),
        ({"mode": "max-autotune", "options": {"max_autotune": True}}, "cannot be given together"),
        ({"block_class": "Block"}, "pass regional=True"),
        ({"backend": "no"}, "pass compile=False"),
        ({"fullgraph": "yes"}, "fullgraph must be True or False"),
    ],
)
def test_bad_compile_options_are_clear_errors(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        CompileOptions(**kwargs)


def test_regional_compilation_of_a_class_the_model_lacks_is_an_error():
    acc = Accelerator(
        cpu=True, compile=CompileOptions(backend="eager", regional=True, block_class="GPT2Block")
    )
    with pytest.raises(ValueError, match="BlockNet contains no GPT2Block module"):
        acc.prepare(_block_net())


def test_regional_compilation_of_a_model_without_repeated_blocks_compiles_it_whole_with_a_warning():
    acc = Accelerator(cpu=True, compile=CompileOptions(backend="eager", regional=True))
    with pytest.warns(UserWarning, match="no block class repeated.*the whole model is compiled"):
        model = acc.prepare(nn.Linear(2, 2))
    assert type(model).__name__ == "OptimizedModule"


def test_a_model_compiled_by_the_user_is_not_compiled_again():
    mine = torch.compile(nn.Linear(2, 2), backend="eager")
    with pytest.warns(UserWarning, match="compiled already"):
        assert Accelerator(cpu=True, compile=CompileOptions(backend="eager")).prepare(mine) is mine


# -- where the settings come from ---------------------------------------------------------------------


def test_the_reference_spellings_and_the_launch_environment(fresh_state):
    assert resolve_compile_options(compile=True) == CompileOptions()
    assert resolve_compile_options(dynamo_backend="EAGER") == CompileOptions(backend="eager")
    plugin = TorchDynamoPlugin(backend="inductor", mode="reduce-overhead", use_regional_compilation=True)
    assert resolve_compile_options(dynamo_plugin=plugin) == CompileOptions(
        mode="reduce-overhead", regional=True
    )
    assert resolve_compile_options(dynamo_plugin=TorchDynamoPlugin(backend="eager", disable=True)) is None
    from accelerate.utils import TorchDynamoPlugin as ReferencePlugin

    assert resolve_compile_options(dynamo_plugin=ReferencePlugin(backend="aot_eager")).backend == "aot_eager"
    assert resolve_compile_options() is None  # nothing asked, nothing in the environment
    fresh_state.setenv("ACCELERATE_DYNAMO_BACKEND", "EAGER")  # a script launched by the reference's launcher
    fresh_state.setenv("ACCEL_NB_DYNAMO_USE_REGIONAL_COMPILATION", "true")
    assert resolve_compile_options() == CompileOptions(backend="eager", regional=True)
    assert resolve_compile_options(compile=False) is None  # the argument wins over the launch config
    fresh_state.setenv("ACCEL_NB_DYNAMO_USE_FULLGRAPH", "maybe")
    with pytest.raises(ValueError, match="ACCEL_NB_DYNAMO_USE_FULLGRAPH='maybe' must be true or false"):
        resolve_compile_options()


def test_the_config_reaches_the_magic_launch_options():
    from accel_nb.config import LaunchConfig
    from accel_nb.notebook.magic_flags import launch_options, parse_accelerate_line

    cfg = LaunchConfig(dynamo_backend="aot_eager", dynamo_use_regional_compilation=True).validate()
    env = launch_options(parse_accelerate_line("-n 2 --cpu"), cfg).env
    assert (
        env["ACCEL_NB_DYNAMO_BACKEND"] == "aot_eager"
        and env["ACCEL_NB_DYNAMO_USE_REGIONAL_COMPILATION"] == "true"
    )


_LAUNCHED_SCRIPT = textwrap.dedent(
    """
    import torch
    from accel_nb import Accelerator
    acc = Accelerator()
    model = acc.prepare(torch.nn.Linear(4, 4))
    opts = acc.compile_options
    inner = type(model.module).__name__
    print(f"rank {acc.process_index}: {type(model).__name__}({inner}) backend={opts.backend} regional={opts.regional}")
    """
)


@pytest.mark.multiproc
def test_accel_nb_launch_applies_the_config_files_dynamo_backend(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "distributed_type: MULTI_CPU\nnum_processes: 2\nuse_cpu: true\n"
        "dynamo_config:\n  dynamo_backend: AOT_EAGER\n  dynamo_mode: default\n"
    )
    script = tmp_path / "train.py"
    script.write_text(_LAUNCHED_SCRIPT)
    env = {k: v for k, v in os.environ.items() if "DYNAMO" not in k}
    out = subprocess.run(
        [sys.executable, "-m", "accel_nb.commands", "launch", "--config_file", str(cfg), str(script)],
        env=dict(env, PYTHONPATH=ROOT),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    for rank in (0, 1):
        assert (
            f"rank {rank}: DistributedDataParallel(OptimizedModule) backend=aot_eager regional=False"
            in out.stdout
        )
    assert "torch.compile backend=aot_eager" in out.stderr  # the launch line says so


def _train_fsdp_compiled(batch_size, options, epochs=2):
    """FSDP (blocks sharded with fully_shard) and compile together; full weights gathered on the main process."""
    from accel_nb.fsdp import FSDPOptions

    torch._dynamo.reset()
    GRAPHS.clear()
    acc = Accelerator(fsdp=FSDPOptions(auto_wrap_classes=["Block"]), compile=options)
    model = _block_net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, opt, dl = acc.prepare(model, opt, DataLoader(_data(64), batch_size=batch_size))
    for _ in range(epochs):
        for x, y in dl:
            acc.backward(torch.nn.functional.mse_loss(model(x), y))
            opt.step()
            opt.zero_grad()
    weights = {k: v.detach().cpu().numpy().copy() for k, v in acc.get_state_dict(model).items()}
    return {"w": weights, "graphs": len(GRAPHS), "type": type(model).__name__}


@pytest.mark.multiproc
@pytest.mark.parametrize("regional", [False, True], ids=["whole-in-place", "regional"])
def test_compile_with_fsdp_ends_with_the_weights_of_plain_training(regional):
    out = run_ranks(
        _train_fsdp_compiled, 2, args=(4, CompileOptions(backend=counting_aot_eager, regional=regional))
    )
    assert out[0]["type"] == "FSDPBlockNet"  # compiled in place: the prepared model stays the sharded module
    assert out[0]["graphs"] >= 1
    _assert_close(out[0]["w"], _train_plain_blocks(8))


@pytest.mark.multiproc
def test_the_example_trains_compiled_from_notebook_launcher_like_eager():
    from accel_nb import notebook_launcher
    from examples.compile_blocks import train

    compiled = notebook_launcher(
        train,
        args=(CompileOptions(backend="aot_eager", regional=True),),
        num_processes=2,
        cpu=True,
        progress="text",
    )
    eager = notebook_launcher(train, args=(False,), num_processes=2, cpu=True, progress="text")
    assert (
        compiled[0]["regional"] and compiled[0]["compiled_blocks"] == 4 and eager[0]["compiled_blocks"] == 0
    )
    assert compiled[0]["losses"] == compiled[1]["losses"]  # reduced over the ranks
    assert compiled[0]["losses"][-1] < compiled[0]["losses"][0]  # it learns
    assert torch.allclose(torch.tensor(compiled[0]["losses"]), torch.tensor(eager[0]["losses"]), atol=1e-4)
