"""Degenerate Gaussian heads during training: re-initialize them (``--reset_degenerate_heads``)
or prune them (``--prune_degenerate_heads``), carrying the optimizer's state over to the pruned
model (`transfer_optimizer_state`); what either draws at random can follow from a seed alone
(`seeded_draws`)."""

from __future__ import annotations

import contextlib
import random

import sa_conv
from keras import ops
from sa_conv import heads as heads_lib
from sa_conv.errors import ConfigError


def check_gaussian_heads(model, config) -> None:
    """Raises ConfigError when ``config`` asks to reset or prune degenerate heads and ``model``'s
    heads are not Gaussian (no quadratic encoding)."""
    flag = ("--reset_degenerate_heads" if config.reset_degenerate_heads
            else "--prune_degenerate_heads" if config.prune_degenerate_heads else None)
    if flag is None:
        return
    blocks = sa_conv.attention_blocks(model)
    if not blocks or any(b.attention.position_encoding.gaussian() is None for b in blocks):
        encoding = blocks[0].attention.encoding if blocks else None
        raise ConfigError(
            f"{flag} needs a model whose heads are Gaussian (a quadratic encoding); "
            f"{config.model} with encoding {encoding!r} has none.")


@contextlib.contextmanager
def seeded_draws(seed: int):
    """Python's ``random`` seeded with ``seed`` inside the block, and as it was before after it.
    Keras draws the seeds of unseeded initializers and seed generators from it (a re-initialized
    head's center and spread, a pruned model's dropout streams): these then follow from ``seed``
    alone, not from every draw the process made before, which a resumed run (its model rebuilt,
    its earlier epochs not run) makes otherwise than the uninterrupted one."""
    state = random.getstate()
    random.seed(seed)
    try:
        yield
    finally:
        random.setstate(state)


def reset_degenerate_heads(model, record: dict, log=print) -> None:
    """Re-initializes ``model``'s degenerate heads (`sa_conv.degenerate_heads`) and records them
    in ``record["reset_heads"]``."""
    found = sa_conv.degenerate_heads(model)
    record["reset_heads"] = {str(k): v for k, v in found.items()}
    if found:
        sa_conv.reset_heads(model, found)
        log("Re-initialized degenerate heads (block: heads): " + ", ".join(f"{k}: {v}" for k, v in found.items()))


def heads_to_prune(model, log=print) -> dict[int, list[int]]:
    """``model``'s degenerate heads per block, keeping at least one head in every block (its
    first, which ``log`` reports)."""
    found = sa_conv.degenerate_heads(model)
    counts = heads_lib.heads_per_block(model)
    for block, heads in found.items():
        if len(heads) == counts[block]:
            log(f"Block {block}: all {counts[block]} heads are degenerate; head {heads[0]} is kept.")
            heads.pop(0)
    return {block: heads for block, heads in found.items() if heads}


def transfer_optimizer_state(old_optimizer, old_model, new_optimizer, take) -> None:
    """Copies ``old_optimizer``'s step and momentums into ``new_optimizer`` (built for the pruned
    model), keeping the momentum slices of the kept heads (``take``, `sa_conv.heads.head_slicer`):
    training goes on as if the pruned heads' weights had never existed."""
    shadowed = {}  # id(optimizer variable) -> the model variable it shadows
    inner = getattr(old_optimizer, "inner_optimizer", old_optimizer)
    for variable, momentum in zip(old_model.trainable_variables, getattr(inner, "momentums", [])):
        shadowed[id(momentum)] = variable
    for old, new in zip(old_optimizer.variables, new_optimizer.variables):
        value = ops.convert_to_numpy(old)
        if tuple(new.shape) != value.shape:
            value = take(shadowed[id(old)], value, new.shape)
        new.assign(value)
