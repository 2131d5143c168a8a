"""What a rank executes: a function with arguments, or a notebook cell's code in a namespace.

Both kinds are run the same way by the worker entry (``payload.run(rank)``). Fork needs no
pickling: the payload is already in the child's memory. For spawn, ``check_picklable`` proves
before any process starts that the payload can travel (naming the offending object when it
cannot), and the source of notebook cells travels with it so that tracebacks show its lines.

    payload = FunctionPayload(train, args=(model,))
    info = check_picklable(payload)      # PayloadError naming e.g. "args[0].lock"
"""

from __future__ import annotations

import io
import linecache
import os
import types
from dataclasses import dataclass
from typing import Any

import cloudpickle

from ..availability import imported_module
from .errors import PayloadError

# names IPython puts in the user namespace that never travel to the workers
_IPYTHON_NAMES = {"In", "Out", "get_ipython", "exit", "quit", "open", "display"}


class FunctionPayload:
    """``function(*args, **kwargs)`` on every rank; the return value travels back."""

    kind = "function"

    def __init__(self, function: Any, args: tuple = (), kwargs: dict | None = None) -> None:
        if not callable(function):
            raise TypeError(f"notebook_launcher needs a function to run, got {type(function).__name__}")
        self.function = function
        self.args = tuple(args)
        self.kwargs = dict(kwargs or {})
        self.sources: dict[str, list[str]] = {}  # notebook cells' source lines, filled for spawn

    def describe(self) -> str:
        return getattr(self.function, "__qualname__", None) or repr(self.function)

    def parts(self) -> list[tuple[str, Any]]:
        """(label, object) pairs to check, in the words an error should use."""
        out: list[tuple[str, Any]] = [(f"the function {self.describe()!r}", self.function)]
        out += [(f"args[{i}]", a) for i, a in enumerate(self.args)]
        out += [(f"kwargs[{k!r}]", v) for k, v in self.kwargs.items()]
        return out

    def run(self, rank: int) -> Any:
        register_sources(self.sources)
        return self.function(*self.args, **self.kwargs)

    def unsendable(self, rank: int, value: Any, error: BaseException) -> str:
        """Why rank ``rank``'s return value cannot travel back, in the user's words."""
        return (
            f"rank {rank} returned a {type(value).__name__} that cannot be sent back to the notebook "
            f"({type(error).__name__}: {_first_line(error)}); return plain data, tensors or a state_dict instead"
        )


class _ModuleRef:
    """A module in the notebook namespace, sent by name and re-imported in the worker."""

    def __init__(self, name: str) -> None:
        self.name = name


class CellPayload:
    """A cell's source executed on every rank in (a copy of) the notebook's namespace.

    ``return_names`` are read from the namespace of rank ``return_rank`` after the code ran.
    """

    kind = "cell"

    def __init__(
        self,
        source: str,
        namespace: dict[str, Any],
        filename: str = "<accelerate-cell>",
        return_names: tuple[str, ...] = (),
        return_rank: int = 0,
    ) -> None:
        self.source = source
        self.namespace = namespace
        self.filename = filename
        self.return_names = tuple(return_names)
        self.return_rank = return_rank
        self.skipped: dict[str, str] = {}  # name -> why it could not be sent (spawn only)
        self.tensor_bytes = 0  # bytes of tensors in the namespace sent to spawned ranks
        self.sources: dict[str, list[str]] = {}  # notebook cells' source lines, filled for spawn
        split_last_expression(source, filename)  # a SyntaxError now, before any process starts

    def describe(self) -> str:
        return self.filename

    def parts(self) -> list[tuple[str, Any]]:
        return []  # the namespace is filtered name by name (see prepare_for_spawn)

    def prepare_for_spawn(self) -> None:
        """Replace modules by references and drop names that cannot be pickled (remembered in ``skipped``)."""
        ns: dict[str, Any] = {}
        for name, value in self.namespace.items():
            if name in _IPYTHON_NAMES or (name.startswith("_") and name not in ("__name__", "__doc__")):
                continue
            if isinstance(value, types.ModuleType):
                ns[name] = _ModuleRef(value.__name__)
            else:
                ns[name] = value
        try:
            self.tensor_bytes = _probe(ns)
        except Exception:
            for name in list(ns):
                if name == "__name__":
                    continue
                try:
                    _probe(ns[name])
                except Exception as exc:  # noqa: BLE001 - any pickling failure means "skip it"
                    self.skipped[name] = f"{type(ns[name]).__name__}: {_first_line(exc)}"
                    del ns[name]
            self.tensor_bytes = _probe(ns)
        self.namespace = ns

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def _materialise_namespace(self) -> dict[str, Any]:
        import importlib

        ns = self.namespace
        for name, value in list(ns.items()):
            if isinstance(value, _ModuleRef):
                try:
                    ns[name] = importlib.import_module(value.name)
                except Exception as exc:  # noqa: BLE001
                    self.skipped[name] = f"module {value.name} cannot be imported here: {_first_line(exc)}"
                    del ns[name]
        # functions defined in the notebook read their globals from the cell's namespace
        for name, value in list(ns.items()):
            if (
                isinstance(value, types.FunctionType)
                and value.__module__ == "__main__"
                and value.__globals__ is not ns
            ):
                fn = types.FunctionType(
                    value.__code__, ns, value.__name__, value.__defaults__, value.__closure__
                )
                fn.__kwdefaults__ = value.__kwdefaults__
                fn.__qualname__ = value.__qualname__
                fn.__dict__.update(value.__dict__)
                fn.__module__ = "__main__"
                ns[name] = fn
        ns.setdefault("__name__", "__main__")
        ns.setdefault("__builtins__", __builtins__)
        return ns

    def run(self, rank: int) -> Any:
        register_sources(self.sources)
        register_sources({self.filename: self.source.splitlines(keepends=True)})
        ns = self._materialise_namespace()
        body, last = split_last_expression(self.source, self.filename)
        try:
            exec(body, ns)
            if last is not None:  # like a notebook cell: show the value of a final expression
                value = eval(last, ns)
                if value is not None:
                    print(repr(value), flush=True)
        except NameError as exc:
            missing = getattr(exc, "name", None)
            if missing in self.skipped:
                raise NameError(
                    f"name {missing!r} was not sent to the workers because it cannot be pickled "
                    f"({self.skipped[missing]}); create it inside the cell, or use start_method='fork'"
                ) from exc
            raise
        if rank != self.return_rank or not self.return_names:
            return None
        missing = [n for n in self.return_names if n not in ns]
        if missing:
            raise NameError(
                f"--return asked for {', '.join(missing)} but the cell did not define {'it' if len(missing) == 1 else 'them'} on rank {rank}"
            )
        return {n: ns[n] for n in self.return_names}

    def unsendable(self, rank: int, value: Any, error: BaseException) -> str:
        """Which ``--return`` name cannot travel back to the notebook, and why."""
        for name, item in (value or {}).items():
            try:
                _probe(item)
            except Exception as exc:  # noqa: BLE001 - any pickling failure names this item
                return (
                    f"--return {name}: rank {rank}'s {name} is a {type(item).__module__}.{type(item).__qualname__} "
                    f"that cannot be sent back to the notebook ({_first_line(exc)}); return plain data, tensors "
                    "or a state_dict instead"
                )
        return f"rank {rank}'s --return values cannot be sent back to the notebook ({_first_line(error)})"


def notebook_sources() -> dict[str, list[str]]:
    """Source lines of code that exists only in this process (notebook cells kept in ``linecache``)."""
    out: dict[str, list[str]] = {}
    for filename, entry in list(linecache.cache.items()):
        if len(entry) == 4 and entry[1] is None and entry[2] and not os.path.exists(filename):
            out[filename] = list(entry[2])
    return out


def register_sources(sources: dict[str, list[str]]) -> None:
    """Make ``sources`` known to ``linecache`` (so tracebacks in this rank show notebook lines)."""
    for filename, lines in sources.items():
        linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)


def split_last_expression(source: str, filename: str) -> tuple[Any, Any]:
    """(code of every statement, code of the final expression or None), line numbers kept."""
    import ast

    tree = ast.parse(source, filename, "exec")
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
        return compile(tree, filename, "exec"), compile(last, filename, "eval")
    return compile(tree, filename, "exec"), None


# ---------------------------------------------------------------------------- pickling checks
def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


class _NullSink:
    def __init__(self) -> None:
        self.size = 0

    def write(self, data: Any) -> int:
        n = len(data)
        self.size += n
        return n


def _tensor_placeholder() -> None:
    return None


class _ProbePickler(cloudpickle.Pickler):
    """cloudpickle that skips tensor data (fast) and adds up the bytes of the tensors it met."""

    def __init__(self, file: Any) -> None:
        super().__init__(file, protocol=cloudpickle.DEFAULT_PROTOCOL)
        self.tensor_bytes = 0
        torch = imported_module("torch")
        self._tensor_type = torch.Tensor if torch is not None else None

    def reducer_override(self, obj: Any) -> Any:
        if self._tensor_type is not None and isinstance(obj, self._tensor_type):
            try:
                self.tensor_bytes += obj.element_size() * obj.nelement()
            except Exception:
                pass
            return (_tensor_placeholder, ())
        return super().reducer_override(obj)


def _probe(obj: Any) -> int:
    """Pickle ``obj`` into nothing; return the tensor bytes it carries. Raises when it cannot be pickled."""
    pickler = _ProbePickler(_NullSink())
    pickler.dump(obj)
    return pickler.tensor_bytes


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _children(label: str, obj: Any) -> list[tuple[str, Any]]:
    if isinstance(obj, types.FunctionType):
        out: list[tuple[str, Any]] = []
        if obj.__closure__:
            for var, cell in zip(obj.__code__.co_freevars, obj.__closure__):
                try:
                    out.append((f"the variable {var!r} captured by {label}", cell.cell_contents))
                except ValueError:
                    pass
        for name in sorted(_code_names(obj.__code__)):
            if name in obj.__globals__ and not isinstance(obj.__globals__[name], types.ModuleType):
                out.append((f"the global {name!r} used by {label}", obj.__globals__[name]))
        for i, default in enumerate(obj.__defaults__ or ()):
            out.append((f"default argument {i} of {label}", default))
        for k, default in (obj.__kwdefaults__ or {}).items():
            out.append((f"default argument {k!r} of {label}", default))
        return out
    if isinstance(obj, types.MethodType):
        return [(f"{label}.__self__", obj.__self__), (f"{label}.__func__", obj.__func__)]
    if isinstance(obj, dict):
        return [(f"{label}[{k!r}]", v) for k, v in obj.items()]
    if isinstance(obj, (list, tuple)):
        return [(f"{label}[{i}]", v) for i, v in enumerate(obj)]
    if isinstance(obj, (set, frozenset)):
        return [(f"an element of {label}", v) for v in obj]
    if (
        hasattr(obj, "__dict__")
        and isinstance(getattr(obj, "__dict__", None), dict)
        and not isinstance(obj, type)
    ):
        return [(f"{label}.{k}", v) for k, v in vars(obj).items()]
    return []


def find_unpicklable(label: str, obj: Any, depth: int = 0) -> tuple[str, Any, BaseException] | None:
    """Walk into ``obj`` (containers, attributes, closures, globals) to the innermost unpicklable part."""
    try:
        _probe(obj)
        return None
    except Exception as exc:  # noqa: BLE001
        error: BaseException = exc
    if depth < 6:
        for sub_label, child in _children(label, obj):
            if child is obj:
                continue
            found = find_unpicklable(sub_label, child, depth + 1)
            if found is not None:
                return found
    return label, obj, error


@dataclass
class PayloadCheck:
    """What ``check_picklable`` learned: the tensor bytes that every rank will copy."""

    tensor_bytes: int = 0


def check_picklable(payload: Any) -> PayloadCheck:
    """Raise ``PayloadError`` naming the object that cannot be sent to a worker; else report tensor bytes."""
    check = PayloadCheck()
    try:
        check.tensor_bytes = _probe(payload.parts())
        return check
    except Exception:  # noqa: BLE001 - find out which part, below
        pass
    for label, obj in payload.parts():
        found = find_unpicklable(label, obj)
        if found is not None:
            where, bad, error = found
            raise PayloadError(
                f"cannot send {where} to the worker processes: it is a {type(bad).__module__}.{type(bad).__qualname__} "
                f"that cannot be pickled ({_first_line(error)}). Create it inside the function instead, or pass "
                "something picklable (data, paths, configs)."
            ) from None
    raise PayloadError(
        "the launch payload cannot be pickled"
    )  # pragma: no cover - parts pickle alone but not together


def dumps_payload(payload: Any) -> bytes:
    """The bytes a spawned worker loads (cloudpickle: notebook functions and classes travel by value)."""
    buf = io.BytesIO()
    cloudpickle.Pickler(buf, protocol=cloudpickle.DEFAULT_PROTOCOL).dump(payload)
    return buf.getvalue()
