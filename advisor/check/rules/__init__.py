"""Every rule, registered by importing its module; ``RULES`` is the table sorted by id."""

from ..registry import REGISTRY, Rule
from . import data, process, saving, training  # noqa: F401  (importing registers the rules)

RULES: dict[str, Rule] = dict(sorted(REGISTRY.items()))
