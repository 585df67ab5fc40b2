"""Damaged parameter trees for the tests of the models' key checks."""

from __future__ import annotations


def rename(tree, path, new_name):
    """``tree`` with the entry at ``path`` (a tuple of keys) moved to ``new_name`` (a typo);
    ``new_name=None`` adds an extra key ``"extra"`` beside it instead. Changes ``tree`` in place
    and returns it."""
    *parents, last = path
    parent = tree
    for key in parents:
        parent = parent[key]
    if new_name is None:
        parent["extra"] = parent[last]
    else:
        parent[new_name] = parent.pop(last)
    return tree
