"""Per-step learning-rate schedules: the one place the schedule is defined.

Both schedules share a linear warm-up: ``lr(step) = base * (step + 1) / warmup_steps`` for
``step < warmup_steps``, so the first step already trains (the reference code stepped its
schedule per epoch and spent the whole first epoch at lr 0), and the last warm-up step reaches
``base``.
"""

import math

import keras
from keras import ops

SCHEDULES = ("cosine", "step")


class _Warmup(keras.optimizers.schedules.LearningRateSchedule):
    def __init__(self, base_learning_rate, total_steps, warmup_steps=0):
        if total_steps < 1:
            raise ValueError(f"total_steps must be positive, got {total_steps}.")
        if not 0 <= warmup_steps <= total_steps:
            raise ValueError(f"warmup_steps must be in [0, total_steps={total_steps}], got {warmup_steps}.")
        self.base_learning_rate = float(base_learning_rate)
        self.total_steps = int(total_steps)
        self.warmup_steps = int(warmup_steps)

    def _after_warmup(self, step):
        raise NotImplementedError

    def __call__(self, step):
        step = ops.cast(step, "float32")
        warm = self.base_learning_rate * (step + 1.0) / max(self.warmup_steps, 1)
        return ops.where(step < self.warmup_steps, warm, self._after_warmup(step))

    def get_config(self):
        return {
            "base_learning_rate": self.base_learning_rate,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
        }


@keras.saving.register_keras_serializable(package="sa_conv")
class WarmupCosineDecay(_Warmup):
    """Linear warm-up, then cosine decay from ``base`` at ``warmup_steps`` to 0 at ``total_steps``.

    ``lr(step) = base / 2 * (1 + cos(pi * (step - warmup) / (total - warmup)))``.
    """

    def _after_warmup(self, step):
        span = max(self.total_steps - self.warmup_steps, 1)
        progress = ops.clip((step - self.warmup_steps) / span, 0.0, 1.0)
        return 0.5 * self.base_learning_rate * (1.0 + ops.cos(math.pi * progress))


@keras.saving.register_keras_serializable(package="sa_conv")
class WarmupStepDecay(_Warmup):
    """Linear warm-up, then ``base / decay_factor ** k`` after the k-th milestone (in steps)."""

    def __init__(self, base_learning_rate, total_steps, warmup_steps=0, milestones=(), decay_factor=10.0):
        super().__init__(base_learning_rate, total_steps, warmup_steps)
        self.milestones = tuple(int(m) for m in milestones)
        if list(self.milestones) != sorted(self.milestones):
            raise ValueError(f"milestones must be increasing, got {self.milestones}.")
        if decay_factor <= 0:
            raise ValueError(f"decay_factor must be positive, got {decay_factor}.")
        self.decay_factor = float(decay_factor)

    def _after_warmup(self, step):
        passed = sum(ops.cast(step >= m, "float32") for m in self.milestones) if self.milestones else 0.0
        return self.base_learning_rate * ops.power(1.0 / self.decay_factor, passed)

    def get_config(self):
        return {**super().get_config(), "milestones": self.milestones, "decay_factor": self.decay_factor}


class Piecewise(keras.optimizers.schedules.LearningRateSchedule):
    """``schedule`` held constant over blocks of ``steps_per_update`` steps (its value at each
    block's first step): the reference's ``train.py`` evaluates its schedule once per epoch, at
    that epoch's first global step, with the raw warm-up ``lr = base * step / warmup_steps``."""

    def __init__(self, schedule, steps_per_update):
        self.schedule = schedule
        self.steps_per_update = int(steps_per_update)

    def __call__(self, step):
        start = ops.floor(ops.cast(step, "float32") / self.steps_per_update) * self.steps_per_update
        if isinstance(self.schedule, _Warmup) and self.schedule.warmup_steps:
            warmup = self.schedule.warmup_steps
            warm = self.schedule.base_learning_rate * start / warmup
            return ops.where(start < warmup, warm, self.schedule(start))
        return self.schedule(start)

    def get_config(self):
        return {"schedule": keras.optimizers.schedules.serialize(self.schedule),
                "steps_per_update": self.steps_per_update}


def make_schedule(
    kind, base_learning_rate, total_steps, warmup_ratio=0.0, milestone_steps=(), decay_factor=10.0,
    steps_per_update=1,
):
    """The schedule ``kind`` (one of `SCHEDULES`) over ``total_steps`` optimizer steps, with
    ``round(warmup_ratio * total_steps)`` warm-up steps; with ``steps_per_update > 1``, updated
    once per that many steps as the reference does per epoch (`Piecewise`)."""
    if not 0.0 <= warmup_ratio < 1.0:
        raise ValueError(f"warmup_ratio must be in [0, 1), got {warmup_ratio}.")
    warmup = int(round(warmup_ratio * total_steps))
    if kind == "cosine":
        schedule = WarmupCosineDecay(base_learning_rate, total_steps, warmup)
    elif kind == "step":
        schedule = WarmupStepDecay(base_learning_rate, total_steps, warmup, milestone_steps, decay_factor)
    else:
        raise ValueError(f"Unknown lr_schedule {kind!r}; choose one of {', '.join(SCHEDULES)}.")
    return Piecewise(schedule, steps_per_update) if steps_per_update > 1 else schedule
