"""The suite's tiers, defined once (`tests/conftest.py` selects them; docs/development.md says
when to run which):

* ``make test-fast`` (``--fast``): every test not marked ``slow`` (end-to-end: a program in its own
  process, a search, an export) and no forward or training pass at paper size;
* ``make test`` (the README's command, CI's): everything but the paper-size cases outside the
  subset each test names (`PAPER_IN_MAKE_TEST` by default, `GOLDEN_PAPER_IN_MAKE_TEST`, or none:
  its one-block or small twins);
* ``make test-all`` (``--all``): everything, every preset at paper size.

`KERNEL_SENSITIVE` names the files ``make test-kernels`` runs on the kernel set ``make test`` does
not use in CI.

A test parametrized over presets takes them through `presets`, which marks each paper-size
preset ``paper`` (only ``--all`` runs it) or, for the named subset, ``paper_subset`` (``make test``
runs it, ``--fast`` does not).
"""

import pytest

# The paper-size presets `make test` keeps: one position-only encoding on the separable path and
# the content encoding (its largest weights). Every other paper-size
# preset's encoding runs at small size in every tier; its paper-size exports in `make test-all`.
PAPER_IN_MAKE_TEST = ("sa_quadratic", "sa_content_plus_learned_bias")
# The golden recordings keep the position-only one at paper size in `make test`, for the part that
# depends on size (`golden.in_part`: forward, one step's gradients, the float32 serving fold, all a
# paper-size preset records); the other paper presets' parts, in `make test-all`.
GOLDEN_PAPER_IN_MAKE_TEST = ("sa_quadratic",)
# The files whose results depend on TensorFlow's kernel set (another order of summation): layers,
# encodings, Theorem 1, the serving copy and the golden recordings held to float tolerances.
KERNEL_SENSITIVE = ("test_layers", "test_fast_attention", "test_conversion", "test_keras_native",
                    "test_sinusoidal", "test_mlp_encoding", "test_heads", "test_reference", "test_remat",
                    "test_optimizers", "test_separable", "test_seeded_dropout", "test_serving", "test_golden",
                    "test_attention_init", "test_gated")


def is_paper_size(preset: str) -> bool:
    """The paper's attention classifiers (6 blocks, hidden 400); the CIFAR ResNets (ResNet18 is the
    paper's too) are small enough for every tier. Asks the preset's config, as `golden.gradient_dtype`
    does (imported here, not at the top: the Makefile runs this module for its file list)."""
    import sa_conv

    return sa_conv.get_config(preset).is_attention and not preset.endswith("_small")


def presets(names, in_make_test=PAPER_IN_MAKE_TEST):
    """``names`` as ``pytest.param``s with their tier's mark: the paper-size ones of
    ``in_make_test`` (a subset of `PAPER_IN_MAKE_TEST`) in ``make test``, the others in ``--all``."""
    assert set(in_make_test) <= set(PAPER_IN_MAKE_TEST)
    return [pytest.param(name, marks=pytest.mark.paper_subset if name in in_make_test else pytest.mark.paper)
            if is_paper_size(name) else name for name in names]


if __name__ == "__main__":  # the Makefile's list of `KERNEL_SENSITIVE` files
    print(" ".join(f"tests/{name}.py" for name in KERNEL_SENSITIVE))
