"""`SingleProcessPlugin`: the default plugin, one process on one device."""

from __future__ import annotations

from olingo.booster.plugin.base import Plugin


class SingleProcessPlugin(Plugin):
    """One process on one device (CUDA when available, else CPU). The default."""
