"""Every exception Conveyor raises survives a pickle and a copy whole: a process pool hands a handler's exception
back pickled, and a program passes errors between processes."""

from __future__ import annotations

import copy
import importlib
import pickle
import pkgutil
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest

import conveyor
from conveyor import ConveyorError, QueueFull, Retry
from conveyor._errors import Unauthenticated, UnreadableResult, UnstorableText
from conveyor.http._parse import BadRequest
from conveyor.pipeline.enqueue import BadRows

# One of each class that takes other arguments than a message, with attributes of its own.
_MADE: list[ConveyorError] = [
    QueueFull("emails", 1_000, 900, 2.5),
    Retry(30, "the API asked for it"),
    Retry(),
    conveyor.Reject("bad input"),
    Unauthenticated("token expired", "expired"),
    UnstorableText("jobs_insert", UnicodeEncodeError("latin-1", "\u20ac", 0, 1, "not in the encoding")),
    UnreadableResult("0190-job", "not JSON"),
    BadRequest("not a number", "priority"),
    BadRows(5, 10, [(1, "k", "no payload")]),
]


def _every_error_class() -> list[type[ConveyorError]]:
    for module in pkgutil.walk_packages(conveyor.__path__, "conveyor."):
        if module.name == "conveyor.__main__" or (
            ".pipeline." in module.name and module.name.rpartition(".")[2] not in ("enqueue", "errors")
        ):
            continue  # runs the CLI; the pipeline's other modules import PySpark at import
        importlib.import_module(module.name)
    found: list[type[ConveyorError]] = []
    todo: list[type[ConveyorError]] = [ConveyorError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return [cls for cls in dict.fromkeys(found) if cls.__module__.startswith("conveyor")]


def _made(cls: type[ConveyorError]) -> ConveyorError:
    made = [exc for exc in _MADE if type(exc) is cls]
    if made:
        return made[0]
    own_init = [k for k in cls.__mro__ if k.__module__.startswith("conveyor") and "__init__" in vars(k)]
    assert not own_init, f"add an instance of {cls} to _MADE"
    return cls("what went wrong")


def _same(a: BaseException, b: BaseException) -> None:
    assert (type(b), str(b), b.args, vars(b)) == (type(a), str(a), a.args, vars(a))


@pytest.mark.parametrize("cls", _every_error_class(), ids=lambda cls: cls.__name__)
def test_every_error_pickles_and_copies_whole(cls: type[ConveyorError]) -> None:
    # Before: QueueFull failed to unpickle (TypeError: missing arguments), Retry raised ConfigurationError (its
    # message taken for a delay), BadRows and UnstorableText failed (TypeError).
    exc = _made(cls)
    _same(exc, pickle.loads(pickle.dumps(exc)))
    _same(exc, copy.deepcopy(exc))
    _same(exc, copy.copy(exc))


def _raise(exc: BaseException) -> Any:
    raise exc


def test_a_handlers_error_comes_back_from_a_process_pool_whole() -> None:
    with ProcessPoolExecutor(1) as pool:
        for exc in (QueueFull("emails", 1_000, 900, 2.5), Retry(30, "later")):
            with pytest.raises(type(exc)) as raised:
                pool.submit(_raise, exc).result(30)
            _same(exc, raised.value)
    assert (raised.value.delay, raised.value.reason) == (30.0, "later")  # type: ignore[attr-defined]
