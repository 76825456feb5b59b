"""One registry for every plug-in kind: policies, graders, task sources and adapters are found by name.

A name is looked up among the kind's built-ins, then those registered in this process (a test's toy
adapter), then the entry points that installed packages declare in the kind's group
(``kvbench.policies``, ``kvbench.graders``, ``kvbench.task_sources``, ``kvbench.adapters``), so that a
package adds a plug-in without an edit to kvbench; it cannot take a built-in's name. A built-in named as
``"module:attr"`` is imported on first use, as an entry point is.
"""

from __future__ import annotations

import pkgutil
from collections.abc import Callable, Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Generic, TypeVar

from kvbench.errors import UnknownNameError

T = TypeVar("T")


class Registry(Generic[T]):
    """The plug-ins of one kind, by name."""

    def __init__(
        self,
        kind: str,
        group: str,
        builtins: Mapping[str, T | str] | Callable[[], Mapping[str, T | str]],
        adopt: Callable[[Any, str], T] = lambda loaded, target: loaded,
        *,
        also_known: tuple[str, ...] = (),
    ) -> None:
        """``builtins``: name -> plug-in or ``"module:attr"`` (or a function giving them, for a scan);
        ``adopt(loaded, target)`` turns what a ``"module:attr"`` or an entry point loads into the kind's
        plug-in, refusing what is not one; ``also_known``: names the error lists beside the plug-ins (a
        task's ``grader: probe``, which no grader serves)."""
        self.kind, self.group, self.also_known = kind, group, also_known
        self._builtins, self._adopt = builtins, adopt
        self.registered: dict[str, T] = {}  # by name; a test patches it

    def builtins(self) -> Mapping[str, T | str]:
        return self._builtins() if callable(self._builtins) else self._builtins

    def entry_points(self) -> dict[str, EntryPoint]:
        """The installed packages' entry points of this kind, read each time (a package installed while
        kvbench runs, or a test's, is seen)."""
        return {ep.name: ep for ep in entry_points(group=self.group)}

    def register(self, name: str, plugin: T) -> None:
        """Make ``plugin`` available by ``name`` in this process."""
        self.registered[name] = plugin

    def names(self) -> list[str]:
        return sorted({*self.builtins(), *self.registered, *self.entry_points()})

    def __contains__(self, name: object) -> bool:
        return name in self.names()

    def get(self, name: str) -> T:
        """The plug-in called ``name``; an unknown name is refused with the known ones."""
        found = self.builtins().get(name)
        if isinstance(found, str):
            return self._adopt(pkgutil.resolve_name(found), found)
        if found is not None:
            return found
        if name in self.registered:
            return self.registered[name]
        entry = self.entry_points().get(name)
        if entry is None:
            raise self.unknown(name)
        return self._adopt(entry.load(), entry.value)

    def unknown(self, name: str) -> UnknownNameError:
        """The one error for a name of this kind that nothing registers: the closest ones, then every one."""
        return UnknownNameError(self.kind, name, [*self.names(), *self.also_known])
