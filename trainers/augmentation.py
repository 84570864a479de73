"""``--augmentation``: the training images' augmentations, from Keras's own layers, seeded.

Each augmentation is one class in `AUGMENTATIONS`. Two stages, in this order:

* per example, on ``(H, W, C)`` uint8 images: ``pad_crop_flip`` first (the paper's pad by 4,
  random crop and horizontal flip, `trainers.data.augment`; on image files, the random crop and
  flip of `trainers.data.resize_and_crop`), then the others in the order listed:
  ``rand_augment`` (`keras.layers.RandAugment`), ``random_erasing`` (`keras.layers.RandomErasing`);
* per batch, on the batched images with one-hot labels: ``mixup`` (`keras.layers.MixUp`) and
  ``cutmix`` (`keras.layers.CutMix`); with both, each batch takes one of them, chosen by a coin
  (as DeiT's and timm's recipes), and its labels become the mixed ones.

Every random draw is stateless: the paper's crop and flip draw from the example's seed (the
stream `trainers.data.make_dataset` hands out, one pair per example and epoch), the other layers
from seeds folded from it (`SeedStream`), the batch stage from a stream of its own. So an
epoch's augmented images follow from the run's seed and the epoch alone, in any number of
parallel calls, and a resumed run sees what the uninterrupted one did.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from sa_conv.errors import ConfigError

#: The images' value range, as the layers are told: raw pixels.
VALUE_RANGE = (0, 255)


class SeedStream(keras.random.SeedGenerator):
    """A stateless stand-in for a layer's `keras.random.SeedGenerator`: its ``k``-th draw is
    ``fold_in(seed, k)``. Built inside a traced ``tf.data`` function, it gives every draw of
    every layer its own seed, all of them functions of ``seed`` (a shape-(2,) integer tensor).
    Skips ``SeedGenerator.__init__`` on purpose: it owns no state variable."""

    def __init__(self, seed, start: int = 0):  # pylint: disable=super-init-not-called
        self._seed, self._count = seed, start

    def next(self, ordered=True):
        self._count += 1
        return tf.random.experimental.stateless_fold_in(self._seed, self._count)


class Augmentation:
    """One augmentation. ``per_batch``: whether it acts on batches (and mixes labels)."""

    name = ""
    per_batch = False

    def __init__(self, config):
        self.layer = self.make_layer(config)

    def make_layer(self, config):
        return None

    def apply(self, images, labels, seeds: SeedStream):
        """``(images, labels)`` augmented: ``images`` float32 ``(batch, H, W, C)`` in [0, 255];
        ``labels`` one-hot ``(batch, classes)`` in the batch stage (mixed there), None per example."""
        transformation = self.layer.get_random_transformation(images, training=True, seed=seeds)
        images = self.layer.transform_images(images, transformation, training=True)
        if self.per_batch:
            labels = self.layer.transform_labels(labels, transformation, training=True)
        return images, labels


class PadCropFlip(Augmentation):
    """The paper's: applied by `trainers.data.make_dataset` itself (see the module doc)."""

    name = "pad_crop_flip"


class RandAugment(Augmentation):
    """`keras.layers.RandAugment` (Cubuk et al., 2020): ``--rand_augment_ops`` operations of
    strength ``--rand_augment_factor``, drawn per example."""

    name = "rand_augment"

    def make_layer(self, config):
        return keras.layers.RandAugment(value_range=VALUE_RANGE, num_ops=config.rand_augment_ops,
                                        factor=config.rand_augment_factor)

    def apply(self, images, labels, seeds):
        # RandAugment draws from its own generator, whatever seed it is given (Keras 3.15): its
        # ``generator``, the attribute Keras's data layers draw from, becomes the stream.
        self.layer.generator = seeds
        return super().apply(images, labels, seeds)


class RandomErasing(Augmentation):
    """`keras.layers.RandomErasing` (Zhong et al., 2020): with probability ``--random_erasing``,
    a random rectangle of the example becomes noise."""

    name = "random_erasing"

    def make_layer(self, config):
        # A pair: a single factor p would erase with a probability drawn from U(0, p), p / 2 on average.
        probability = config.random_erasing
        return keras.layers.RandomErasing(factor=(probability, probability), value_range=VALUE_RANGE)


class MixUp(Augmentation):
    """`keras.layers.MixUp` (Zhang et al., 2018): pairs of examples and their labels mixed at a
    ``Beta(--mixup_alpha, --mixup_alpha)`` weight."""

    name, per_batch = "mixup", True

    def make_layer(self, config):
        return keras.layers.MixUp(alpha=config.mixup_alpha)


class CutMix(Augmentation):
    """`keras.layers.CutMix` (Yun et al., 2019): a rectangle of another example pasted in, the
    labels mixed by the drawn weight ``lambda ~ Beta(--cutmix_alpha, --cutmix_alpha)``, of which
    the rectangle covers ``1 - lambda`` of the area up to its rounding to whole pixels."""

    name, per_batch = "cutmix", True

    def make_layer(self, config):
        # A pair: a single factor a would draw the Beta's alpha itself from U(0, a).
        return keras.layers.CutMix(factor=(config.cutmix_alpha, config.cutmix_alpha))


AUGMENTATIONS = {cls.name: cls for cls in (PadCropFlip, RandAugment, RandomErasing, MixUp, CutMix)}
PAPER = ("pad_crop_flip",)


def parse(text: str) -> tuple[str, ...]:
    """The names of a comma-separated ``--augmentation``; ConfigError naming an unknown or
    repeated one."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in AUGMENTATIONS]
    if unknown:
        raise ConfigError(f"--augmentation: unknown {', '.join(unknown)}; choose from {', '.join(AUGMENTATIONS)}.")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ConfigError(f"--augmentation lists {', '.join(repeated)} more than once.")
    return names


class Pipeline:
    """The augmentations of ``config.augmentation`` for a model of ``num_classes`` classes, in
    the stages of the module doc; what `trainers.data.make_dataset` asks of its
    ``augmentation``: ``crops``, ``example`` and ``batch``."""

    def __init__(self, config, num_classes: int):
        self.names = parse(config.augmentation)
        self.crops = PadCropFlip.name in self.names
        chosen = [AUGMENTATIONS[name](config) for name in self.names if name != PadCropFlip.name]
        self.per_example = [a for a in chosen if not a.per_batch]
        self.per_batch = [a for a in chosen if a.per_batch]
        self.num_classes = num_classes

    @property
    def mixes(self) -> bool:
        """Whether training labels are one-hot, mixed (``float32 (batch, classes)``)."""
        return bool(self.per_batch)

    def example(self, image, seed):
        """One cropped uint8 image ``(H, W, C)`` through the per-example augmentations after
        ``pad_crop_flip``, from its seed; uint8 again (rounded)."""
        if not self.per_example:
            return image
        # Draws 1, 2, ... of the example's seed: the crop and flip took the seed itself.
        # A batch of one: the layers' transforms work on batches (their __call__ adds the axis).
        seeds, images = SeedStream(seed), tf.cast(image, tf.float32)[None]
        for augmentation in self.per_example:
            images, _ = augmentation.apply(images, None, seeds)
        return tf.cast(tf.clip_by_value(tf.round(images[0]), *VALUE_RANGE), tf.uint8)

    def batch(self, images, labels, seed):
        """A batch (``images`` ``(batch, H, W, C)``, int ``labels`` ``(batch,)``) through the batch
        stage: float32 images and one-hot float32 labels ``(batch, classes)``, mixed by one of the
        per-batch augmentations (a coin picks between two)."""
        seeds = SeedStream(seed)
        images, labels = tf.cast(images, tf.float32), tf.one_hot(labels, self.num_classes)
        if len(self.per_batch) == 1:
            return self.per_batch[0].apply(images, labels, seeds)
        first = tf.random.stateless_uniform((), seeds.next()) < 0.5
        return tf.cond(first, lambda: self.per_batch[0].apply(images, labels, seeds),
                       lambda: self.per_batch[1].apply(images, labels, seeds))
