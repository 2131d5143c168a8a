"""Every public name of the reference's ``accelerate.utils`` and of each of its submodules, read from the
installed reference at test time, imports from the same dotted path under ``accel_nb`` -- or is listed
in ``accel_nb/commands/migrate_data.py`` (and in docs/migration.md) as deliberately left out, with the reason."""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import os
import pkgutil
import types
import typing
import warnings

import pytest

pytest.importorskip("accelerate")
import accelerate.utils  # noqa: E402

from accel_nb.commands.migrate_data import LEFT_OUT  # noqa: E402  (one home: the `migrate --check` data)

DOCS = os.path.join(os.path.dirname(__file__), "..", "docs", "migration.md")


def _submodules() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(accelerate.utils.__path__))


def _public_names(module: types.ModuleType, short: str) -> list[str]:
    """Names the reference defines in ``module``: its constants, or its functions and classes."""
    if short == "constants":
        return sorted(n for n in dir(module) if n.isupper())
    return sorted(
        n
        for n, v in vars(module).items()
        if not n.startswith("_")
        and callable(v)
        and not isinstance(v, types.ModuleType)
        and getattr(v, "__module__", None) == module.__name__
    )


def _left_out(short: str, name: str | None = None) -> bool:
    return short in LEFT_OUT or (name is not None and f"{short}.{name}" in LEFT_OUT)


@pytest.mark.parametrize("short", _submodules())
def test_each_reference_utils_submodule_path_imports_the_same_names(short):
    try:
        ref = importlib.import_module(f"accelerate.utils.{short}")
    except ImportError:  # an optional dependency of the reference (rich) is missing here
        assert short in LEFT_OUT, f"accelerate.utils.{short} does not import here and is not in LEFT_OUT"
        return
    names = _public_names(ref, short)
    if short in LEFT_OUT:
        with pytest.raises(ImportError):
            importlib.import_module(f"accel_nb.utils.{short}")
        return
    ours = importlib.import_module(f"accel_nb.utils.{short}")
    first_line = ours.__doc__.strip().splitlines()[0]
    assert first_line.startswith(f"Shim at the reference's ``accelerate.utils.{short}`` path"), first_line
    missing = [n for n in names if not _left_out(short, n) and not hasattr(ours, n)]
    assert not missing, f"accel_nb.utils.{short} lacks {missing}"
    stale = [n for n in names if f"{short}.{n}" in LEFT_OUT and hasattr(ours, n)]
    assert not stale, f"LEFT_OUT lists {stale} but accel_nb.utils.{short} has them now"
    for name in names:
        if hasattr(ours, name) and short != "constants":
            assert inspect.isclass(getattr(ours, name)) == inspect.isclass(getattr(ref, name)), name
        elif hasattr(ours, name):
            assert getattr(ours, name) == getattr(ref, name), f"constants.{name} differs from the reference's"


def test_every_name_of_reference_utils_imports_from_accel_nb_utils():
    import accel_nb.utils as ours

    submodules = set(_submodules())
    missing = []
    for name in dir(accelerate.utils):
        value = getattr(accelerate.utils, name)
        if name.startswith("_") or isinstance(value, types.ModuleType):
            continue
        home = getattr(value, "__module__", None) if callable(value) else None
        short = home.rsplit(".", 1)[-1] if home and home.startswith("accelerate.utils.") else None
        if short is None and name.isupper():
            short = "constants"
        if short in submodules and _left_out(short, name):
            continue
        if name in LEFT_OUT:
            continue
        if not hasattr(ours, name):
            missing.append(name)
    assert not missing, f"accel_nb.utils lacks {missing}"


def test_every_left_out_entry_is_in_the_migration_docs():
    text = open(DOCS, encoding="utf-8").read()
    absent = [key for key in LEFT_OUT if f"`{key.rsplit('.', 1)[-1]}`" not in text]
    assert not absent, f"docs/migration.md does not name {absent}"


def test_each_left_out_entry_names_something_the_reference_has():
    for key in LEFT_OUT:
        short, _, name = key.partition(".")
        if not name:
            if short in _submodules():
                continue
            assert hasattr(accelerate.utils, short), f"LEFT_OUT: accelerate.utils has no {short}"
            continue
        path = _module_path(short)
        if path not in REFERENCE_MODULES:
            assert f"accelerate.utils.{short}" in _submodules_paths(), (
                f"LEFT_OUT: {key} names no reference module"
            )
            continue  # a utils submodule that does not import here (rich)
        assert name in _reference_names(path), f"LEFT_OUT: {path} has no public {name}"


def test_the_utils_package_is_discovered_by_the_build():
    import tomllib

    with open(os.path.join(os.path.dirname(__file__), "..", "pyproject.toml"), "rb") as f:
        find = tomllib.load(f)["tool"]["setuptools"]["packages"]["find"]
    from setuptools import find_packages

    found = find_packages(os.path.join(os.path.dirname(__file__), ".."), include=find["include"])
    assert "accel_nb.utils" in found


def test_utils_stays_light_and_keeps_its_own_helpers():
    import subprocess
    import sys

    code = (
        "import sys, accel_nb.utils as u; u.set_seed(1); "
        "print(sorted(m for m in ('torch', 'IPython', 'accel_nb.availability') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    # set_seed imports torch itself; the lazy names do not pull IPython or the availability checks
    assert out.strip() == "['torch']"
    import accel_nb.ops
    import accel_nb.utils

    assert accel_nb.utils.gather is accel_nb.ops.gather
    from accel_nb.utils.operations import gather

    assert gather is accel_nb.ops.gather


@pytest.mark.parametrize(
    "name,args",
    [
        ("is_bnb_available", ()),
        ("is_bnb_available", ("0.1",)),
        ("is_bnb_available", ("99.0",)),
        ("is_8bit_bnb_available", ()),
        ("is_4bit_bnb_available", ()),
        ("is_torchao_available", ()),
        ("is_deepspeed_available", ()),
    ],
)
def test_quantization_and_deepspeed_gates_answer_as_the_reference(name, args):
    import accelerate.utils.imports as ref

    import accel_nb.utils.imports as ours

    assert getattr(ours, name)(*args) == getattr(ref, name)(*args)


@pytest.mark.parametrize("rich", ["1", "0"])
def test_every_top_level_name_of_the_reference_imports_from_accel_nb(rich, monkeypatch):
    import accelerate

    import accel_nb

    monkeypatch.setenv("ACCELERATE_ENABLE_RICH", rich)
    names = [
        n
        for n, v in vars(accelerate).items()
        if not n.startswith("_") and not isinstance(v, types.ModuleType)
    ]
    missing = [n for n in names if not hasattr(accel_nb, n)]
    assert not missing, f"accel_nb lacks the reference's top-level {missing}"
    for name in ("FullyShardedDataParallelPlugin", "is_rich_available"):
        assert getattr(accel_nb, name) is getattr(accel_nb.utils, name)
    assert accel_nb.is_rich_available() == accelerate.is_rich_available()


# -- every public module of the reference, with the names it has because it imports them -----------------
# (accelerate.commands and accelerate.test_utils are the reference's own command line and test helpers)


def _walk_reference() -> dict[str, types.ModuleType | None]:
    found: dict[str, types.ModuleType | None] = {}
    for info in pkgutil.walk_packages(accelerate.__path__, "accelerate."):
        parts = info.name.split(".")
        if any(p.startswith("_") for p in parts) or parts[1] in ("commands", "test_utils"):
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # accelerate.memory_utils warns that it moved
            try:
                found[info.name] = importlib.import_module(info.name)
            except ImportError:  # an optional dependency of the reference (rich) is missing here
                found[info.name] = None
    return found


REFERENCE_MODULES = _walk_reference()


def _submodules_paths() -> set[str]:
    return {f"accelerate.utils.{s}" for s in _submodules()}


def _key(path: str) -> str:
    """LEFT_OUT's key of a reference module: its name under ``accelerate.utils`` or ``accelerate``."""
    return path.removeprefix("accelerate.").removeprefix("utils.")


def _module_path(key: str) -> str:
    utils = f"accelerate.utils.{key}"
    return utils if utils in REFERENCE_MODULES else f"accelerate.{key}"


def _assigned(module: types.ModuleType) -> set[str]:
    """Names a module's own source assigns at its top level (where a constant is defined)."""
    with open(module.__file__, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    names: set[str] = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


@functools.cache
def _reference_names(path: str) -> dict[str, object]:
    """dir() of the reference's module: its and its imports' functions and classes (defined in accelerate)
    and UPPERCASE constants; not modules, private names or typing's names."""
    module = REFERENCE_MODULES[path]
    names = {}
    for name in dir(module):
        value = getattr(module, name)
        if name.startswith("_") or isinstance(value, types.ModuleType):
            continue
        if callable(value):
            if (getattr(value, "__module__", None) or "").startswith("accelerate"):
                names[name] = value
        elif name.isupper() and getattr(typing, name, object()) is not value:
            names[name] = value
    return names


@functools.cache
def _constant_homes() -> dict[str, list[str]]:
    homes: dict[str, list[str]] = {}
    for path, module in REFERENCE_MODULES.items():
        for name in _assigned(module) if module is not None else ():
            homes.setdefault(name, []).append(path)
    return homes


def _home(path: str, name: str, value: object) -> str:
    """The reference module that defines ``name`` (``path`` itself unless the module imports it)."""
    if callable(value):
        home = value.__module__
        return home if home in REFERENCE_MODULES else path  # defined in accelerate.commands: as if here
    for home in _constant_homes().get(name, []):
        if getattr(REFERENCE_MODULES[home], name, None) is value:
            return home
    return path


def _same_constant(mine: object, theirs: object) -> bool:
    """Equal values; for a table of classes (LOGGER_TYPE_TO_CLASS), the same keys and classes of the same name."""
    if isinstance(theirs, dict) and theirs and all(inspect.isclass(v) for v in theirs.values()):
        return isinstance(mine, dict) and {k: v.__name__ for k, v in mine.items()} == {
            k: v.__name__ for k, v in theirs.items()
        }
    return mine == theirs


def _is_left_out(path: str, name: str | None = None) -> bool:
    key = _key(path)
    return key in LEFT_OUT or (name is not None and f"{key}.{name}" in LEFT_OUT)


def test_the_left_out_keys_of_utils_and_of_the_top_level_do_not_collide():
    top = {_key(p) for p in REFERENCE_MODULES if p.count(".") == 1}
    assert not top & set(_submodules())


@pytest.mark.parametrize("path", sorted(REFERENCE_MODULES))
def test_every_name_of_every_reference_module_imports_from_the_same_accel_nb_path(path):
    ours_path = "accel_nb" + path.removeprefix("accelerate")
    if REFERENCE_MODULES[path] is None or _is_left_out(path):
        assert _is_left_out(path), f"{path} does not import here and is not in LEFT_OUT"
        with pytest.raises(ImportError):
            importlib.import_module(ours_path)
        return
    ours = importlib.import_module(ours_path)
    missing, differ, stale, split = [], [], [], []
    for name, value in _reference_names(path).items():
        home = _home(path, name, value)
        if _is_left_out(path, name) or (home != path and _is_left_out(home, name)):
            if f"{_key(path)}.{name}" in LEFT_OUT and hasattr(ours, name):
                stale.append(name)
            continue
        if not hasattr(ours, name):
            missing.append(name)
            continue
        mine = getattr(ours, name)
        if callable(value) and inspect.isclass(mine) != inspect.isclass(value):
            differ.append(name)
        elif not callable(value) and not _same_constant(mine, value):
            differ.append(name)
        if home != path:  # the one implementation: the same object as at the reference's home path
            at_home = importlib.import_module("accel_nb" + home.removeprefix("accelerate"))
            if getattr(at_home, name) is not mine:
                split.append(f"{name} (from {home})")
    assert not missing, (
        f"{ours_path} lacks {missing}: add each to accel_nb/reexports.py (a name the reference's module imports) "
        "or to LEFT_OUT in accel_nb/commands/migrate_data.py with the reason (and docs/migration.md)"
    )
    assert not stale, f"LEFT_OUT lists {stale} of {path} but {ours_path} has them now"
    assert not differ, (
        f"{ours_path}: {differ} are not what the reference's names are (class vs function, value)"
    )
    assert not split, f"{ours_path}: {split} are not the object at the home path"


def test_the_reexport_table_names_only_what_the_reference_modules_have():
    from accel_nb.reexports import reexports

    for path, module in REFERENCE_MODULES.items():
        if module is None:
            continue
        extra = set(reexports("accel_nb" + path.removeprefix("accelerate"))) - set(dir(module))
        assert not extra, f"accel_nb/reexports.py gives {path} names the reference's module lacks: {extra}"
