"""Former names, one mechanism: what was renamed or moved (encodings, presets, constants, classes,
modules) keeps working for one release, and its first use warns, naming the current name.

A `FormerNames` maps the former names of one kind of thing to their current names. It is a
read-only `Mapping` (``ENCODING_ALIASES``, ``PRESET_ALIASES``) and `resolve` gives the current
name of a name, with a `DeprecationWarning` the first time each former name is used in a process.
`module_getattr` serves former attribute names of a module (its ``__getattr__``), and
`moved_module` turns the stub left at a module's former path into the module itself.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Mapping

__all__ = ["FormerNames", "MODULES", "module_getattr", "moved_module"]


class FormerNames(Mapping):
    """Former names of one ``kind`` of thing (``"encoding"``, ``"preset"``, ...), each mapped to
    its current name."""

    def __init__(self, kind: str, names: Mapping[str, str] | None = None):
        self.kind = kind
        self._names = dict(names or {})
        self._warned: set[str] = set()

    def __getitem__(self, name):
        return self._names[name]

    def __iter__(self):
        return iter(self._names)

    def __len__(self):
        return len(self._names)

    def __repr__(self):
        return f"FormerNames({self.kind!r}, {self._names!r})"

    def add(self, former: str, current: str) -> None:
        """Registers ``former`` as a former name of ``current`` (registries call it)."""
        self._names[former] = current

    def remove(self, former: str) -> None:
        del self._names[former]
        self._warned.discard(former)

    def resolve(self, name: str, stacklevel: int = 1) -> str:
        """The current name of ``name``: itself, or for a former name its current one, with a
        DeprecationWarning the first time (``stacklevel`` counts from the caller of `resolve`)."""
        current = self._names.get(name)
        if current is None:
            return name
        if name not in self._warned:
            self._warned.add(name)
            warnings.warn(f"{name} is deprecated: the {self.kind} is now named {current}.", DeprecationWarning,
                          stacklevel=stacklevel + 1)
        return current

    def forget_warnings(self) -> None:
        """Lets every former name warn again (tests that check the warning)."""
        self._warned.clear()


def module_getattr(module_name: str, names: FormerNames, namespace: dict):
    """A module ``__getattr__`` that serves the former attribute ``names`` of the module from its
    ``namespace`` (its ``globals()``), warning at the caller."""

    def __getattr__(name):
        if name in names:
            return namespace[names.resolve(name, stacklevel=2)]
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}")

    return __getattr__


MODULES = FormerNames("module", {
    # Moved to the programs' side: they serve the trainer, the export and the benchmarks, not the layers.
    "sa_conv.data": "trainers.data",
    "sa_conv.image_files": "trainers.image_files",
    "sa_conv.cli": "trainers.cli",
    "sa_conv.files": "trainers.files",
    "sa_conv.footprint": "trainers.footprint",
})
"""Modules moved out of the library, by former import path."""


def moved_module(name: str) -> None:
    """Makes the stub being imported as ``name`` (a key of `MODULES`) the moved module itself:
    ``import sa_conv.data`` gives ``trainers.data``, and warns once."""
    module = importlib.import_module(MODULES.resolve(name, stacklevel=3))
    sys.modules[name] = module
