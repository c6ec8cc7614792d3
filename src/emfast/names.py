"""Objects the user may give by name (augmentations, targets), with a suggestion when a name is mistyped."""
from __future__ import annotations

import difflib
from typing import Dict, Iterable, List


def instantiate(items, registry: Dict[str, type], base: type, kind: str) -> List:
    """Turn one item or a list of items (objects of ``base``, or names in ``registry``) into objects.

    Names get default parameters. Raises ValueError for an unknown name, naming the closest known one, and
    TypeError for an item that is neither.
    """
    if isinstance(items, (str, base)) or not isinstance(items, Iterable):
        items = [items]  # a single item; a non-item gets its TypeError below
    resolved = []
    for item in items:
        if isinstance(item, str):
            if item not in registry:
                close = difflib.get_close_matches(item, registry, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ValueError(f"unknown {kind} {item!r}{hint} (known: {', '.join(sorted(registry))})")
            item = registry[item]()
        if not isinstance(item, base):
            raise TypeError(f"{kind}s must be names or {base.__name__} objects, got {item!r}")
        resolved.append(item)
    return resolved
