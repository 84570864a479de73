"""The suite's tiers, defined once (`tests/conftest.py` selects them; docs/development.md says
when to run which):

* ``make test-fast`` (``--fast``): every test not marked ``slow`` (end-to-end: a program in its own
  process, a search, an export) and no forward or training pass at paper size;
* ``make test`` (the README's command, CI's): everything but the paper-size cases outside
  `PAPER_IN_MAKE_TEST`;
* ``make test-all`` (``--all``): everything, every preset at paper size.

A test parametrized over presets takes them through `presets`, which marks each paper-size
preset ``paper`` (only ``--all`` runs it) or, for the named subset, ``paper_subset`` (``make test``
runs it, ``--fast`` does not).
"""

import pytest

# The paper-size presets `make test` keeps: one position-only encoding on the separable path and
# the content encoding (its folded serving form, its largest weights). Every other paper-size
# preset's encoding runs at small size in every tier; its paper-size exports in `make test-all`.
PAPER_IN_MAKE_TEST = ("sa_quadratic", "sa_content_plus_learned_bias")


def is_paper_size(preset: str) -> bool:
    """The paper's attention classifiers (6 blocks, hidden 400); ResNet18 is the paper's too, but
    small enough for every tier."""
    return not preset.endswith("_small") and preset != "resnet18"


def presets(names):
    """``names`` as ``pytest.param``s with their tier's mark."""
    return [pytest.param(name, marks=pytest.mark.paper_subset if name in PAPER_IN_MAKE_TEST else pytest.mark.paper)
            if is_paper_size(name) else name for name in names]
