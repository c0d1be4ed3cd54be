"""Exceptions and warnings of a worker process, carried to the loader.

An exception raised in a worker reaches the loader's ``next()`` as itself
(same class, same message, same attributes) whenever it survives pickling,
with a note that names the worker and holds the worker's traceback. One
that does not survive (its class cannot be rebuilt from its arguments) is
raised as torch's DataLoader raises a worker's exception: its class built
from a message holding the traceback, else a RuntimeError. Warnings a
worker issues while it makes a batch are issued again in the loader's
process, where its filters (``-W error``, ``catch_warnings``) apply.
"""

from __future__ import annotations

import pickle
import traceback
import warnings
from dataclasses import dataclass
from typing import Any, NoReturn

# Registries of the warnings re-issued here, by the file that issued them
# in the worker: "default" filters show each once, as they would have there.
_REGISTRIES: dict[str, dict[Any, Any]] = {}


@dataclass
class Failure:
    """An exception raised in a worker, ready to be raised again."""

    where: str
    text: str  # the worker's traceback, formatted
    pickled: bytes | None  # the exception itself, when it pickles faithfully
    cls: type[BaseException] | None  # its class, when the class pickles
    message: str
    name: str  # its class's name

    @staticmethod
    def capture(error: BaseException, where: str) -> Failure:
        text = "".join(traceback.format_exception(error))
        pickled = None
        try:
            data = pickle.dumps(error, protocol=5)
            copy = pickle.loads(data)
            if type(copy) is type(error) and str(copy) == str(error):
                pickled = data
        except Exception:  # noqa: BLE001 - any failure means: send it as text
            pickled = None
        cls: type[BaseException] | None = type(error)
        try:
            pickle.loads(pickle.dumps(cls))
        except Exception:  # noqa: BLE001
            cls = None
        return Failure(where, text, pickled, cls, str(error), type(error).__name__)

    def reraise(self) -> NoReturn:
        note = f"raised in {self.where}; its traceback there:\n{self.text}"
        if self.pickled is not None:
            error = pickle.loads(self.pickled)
            assert isinstance(error, BaseException)
            error.add_note(note)
            raise error
        message = f"Caught {self.name} in {self.where}.\n"
        message += f"Original {self.text}"
        if self.cls is not None:
            try:
                rebuilt = self.cls(message)
            except Exception:  # noqa: BLE001 - a class that takes no message
                rebuilt = None
            if rebuilt is not None:
                raise rebuilt
        raise RuntimeError(message)


@dataclass
class Caught:
    """One warning a worker issued."""

    message: Any  # the Warning instance, or its text when it does not pickle
    category: type[Warning]
    filename: str
    lineno: int

    def reissue(self) -> None:
        registry = _REGISTRIES.setdefault(self.filename, {})
        warnings.warn_explicit(
            self.message, self.category, self.filename, self.lineno, registry=registry
        )


def caught_warnings(records: list[warnings.WarningMessage]) -> list[Caught]:
    """`records` (from ``warnings.catch_warnings(record=True)``) in a form
    that pickles."""
    out = []
    for w in records:
        message: Any = w.message
        category = w.category
        try:
            pickle.loads(pickle.dumps((message, category)))
        except Exception:  # noqa: BLE001
            message, category = str(message), UserWarning
        out.append(Caught(message, category, w.filename, w.lineno))
    return out
