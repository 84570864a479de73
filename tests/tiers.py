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
# The low-precision exports keep the position-only one at paper size; the content encoding's run
# at small size there (the same folded serving form and export code), at paper size in `make
# test-all`: where bfloat16 is emulated (no AVX512_BF16), its paper-size bfloat16 export alone
# takes minutes.
PAPER_EXPORTS_IN_MAKE_TEST = ("sa_quadratic",)


def is_paper_size(preset: str) -> bool:
    """The paper's attention classifiers (6 blocks, hidden 400); ResNet18 is the paper's too, but
    small enough for every tier."""
    return not preset.endswith("_small") and preset != "resnet18"


def presets(names, in_make_test=PAPER_IN_MAKE_TEST):
    """``names`` as ``pytest.param``s with their tier's mark: the paper-size ones of
    ``in_make_test`` (a subset of `PAPER_IN_MAKE_TEST`) in ``make test``, the others in ``--all``."""
    assert set(in_make_test) <= set(PAPER_IN_MAKE_TEST)
    return [pytest.param(name, marks=pytest.mark.paper_subset if name in in_make_test else pytest.mark.paper)
            if is_paper_size(name) else name for name in names]
