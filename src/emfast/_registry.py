"""The one registry of what a user may give by name: augmentations, targets, samplers, volume formats
(``emfast.open(format=...)``) and transfer backends (``device=...``).

A class joins with the :func:`register` decorator where it is defined; the loader and configs look names up here
alike, so a class that registers is accepted everywhere at once.
"""
from __future__ import annotations

import difflib
from typing import Callable, Dict, Iterable, List, TypeVar

#: The class attribute that holds each kind's registered name (a target's ``name`` is its output field, which
#: the user may change, so targets register under their ``kind``; a transfer backend's ``name`` is per device,
#: ``cuda:0``, so backends register under the ``kind`` that ``device=`` names).
KEY_ATTRIBUTE = {"augmentation": "name", "target": "kind", "sampler": "name", "format": "name", "backend": "kind"}

_CLASSES: Dict[str, Dict[str, type]] = {kind: {} for kind in KEY_ATTRIBUTE}

T = TypeVar("T", bound=type)


def register(kind: str) -> Callable[[T], T]:
    """Class decorator: make the class available by its name (``KEY_ATTRIBUTE[kind]``) as a ``kind``.

    Raises
    ------
    ValueError
        For an unknown kind, or a name another class already took.
    """
    if kind not in _CLASSES:
        raise ValueError(f"unknown registry kind {kind!r}; kinds: {', '.join(_CLASSES)}")

    def decorate(cls: T) -> T:
        name = getattr(cls, KEY_ATTRIBUTE[kind])
        taken = _CLASSES[kind].get(name)
        if taken is not None and taken is not cls:
            raise ValueError(f"{kind} name {name!r} is taken by {taken.__module__}.{taken.__qualname__}")
        _CLASSES[kind][name] = cls
        return cls

    return decorate


def registered(kind: str) -> Dict[str, type]:
    """Name -> class of every registered ``kind``, sorted by name."""
    return dict(sorted(_CLASSES[kind].items()))


def lookup(kind: str, name: str) -> type:
    """The class registered as ``name``; ValueError naming the closest known name for a mistyped one."""
    classes = _CLASSES[kind]
    if name not in classes:
        close = difflib.get_close_matches(name, classes, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown {kind} {name!r}{hint} (known: {', '.join(sorted(classes))})")
    return classes[name]


def instantiate(items, kind: str, base: type) -> List:
    """Turn one item or a list of items (objects of ``base``, or registered names) into objects.

    Names get default parameters. Raises ValueError for an unknown name, naming the closest known one, and
    TypeError for an item that is neither.
    """
    if isinstance(items, (str, base)) or not isinstance(items, Iterable):
        items = [items]  # a single item; a non-item gets its TypeError below
    resolved = []
    for item in items:
        if isinstance(item, str):
            item = lookup(kind, item)()
        if not isinstance(item, base):
            raise TypeError(f"{kind}s must be names or {base.__name__} objects, got {item!r}")
        resolved.append(item)
    return resolved
