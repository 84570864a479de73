"""The SavedModel's signatures (`build_archive`); the module doc of `export.export` describes them."""

from __future__ import annotations

import keras
import tensorflow as tf

import sa_conv
from trainers import data as data_lib
from trainers import image_files

DEFAULT_MAX_IMAGE_PIXELS = 4096 * 4096
DEFAULT_MAX_BATCH_SIZE = 256


def _after(checks, fn):
    """``fn()`` run after each of ``checks`` (functions making assertion ops), in order."""
    if not checks:
        return fn()
    with tf.control_dependencies([checks[0]()]):
        return _after(checks[1:], fn)


def build_archive(model: keras.Model, class_names, max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
                  max_batch_size: int = DEFAULT_MAX_BATCH_SIZE) -> keras.export.ExportArchive:
    """An ExportArchive with the signatures described in the module docstring. Requests with
    more than ``max_batch_size`` images, or an encoded image of more than ``max_image_pixels``
    pixels (read from its header, before decoding), fail with InvalidArgumentError."""
    height, width, channels = model.inputs[0].shape[1:]
    names = tf.constant([str(n) for n in class_names])
    archive = keras.export.ExportArchive()
    archive.track(model)

    def check_batch(size):
        tf.debugging.assert_positive(size, message="empty batch: send at least one image")
        tf.debugging.assert_less_equal(
            tf.cast(size, tf.int64), tf.constant(max_batch_size, tf.int64),
            message=f"batch larger than max_batch_size={max_batch_size} images (set at export with --max_batch_size)")

    def outputs(images):
        check_batch(tf.shape(images)[0])
        logits = tf.cast(model(images, training=False), tf.float32)
        probabilities = tf.nn.softmax(logits, axis=-1)
        classes = tf.argmax(probabilities, axis=-1, output_type=tf.int64)
        return {"probabilities": probabilities, "classes": classes, "class_names": tf.gather(names, classes)}

    def decode(blob):
        # Each check runs before the next step: nothing is decoded before its size is known, and the
        # decoder is training's own (`image_files.decode`), so an image gives the pixels it trained on.
        size = image_files.encoded_size(blob)
        limit = tf.constant(max_image_pixels, tf.int64)
        longer, shorter = tf.reduce_max(size), tf.maximum(tf.reduce_min(size), 1)
        # Resizing the shorter side to the input's makes a long thin image long: bound that too. Its
        # longer side as `resize_and_crop` rounds it; sizes divided, not multiplied, so no header overflows.
        resized = tf.maximum(tf.constant(height, tf.int64), (2 * longer * height + shorter) // (2 * shorter))
        checks = [  # in this order, each after the one before: the first that fails names the problem
            lambda: tf.debugging.assert_positive(size, message="image_bytes holds an empty image"),
            lambda: tf.debugging.assert_less_equal(
                size[0], limit // tf.maximum(size[1], 1),
                message=f"image larger than max_image_pixels={max_image_pixels} (set at export with "
                        "--max_image_pixels)"),
            lambda: tf.debugging.assert_less_equal(
                resized, limit // height,
                message=f"image too elongated: its shorter side resized to {height} pixels would make it larger "
                        f"than max_image_pixels={max_image_pixels}")]
        image = _after(checks, lambda: image_files.decode(blob, channels, from_bytes=True))
        # As the model was evaluated: shorter side to the input size, then the center crop.
        return data_lib.resize_and_crop(image, height)

    image_spec = tf.TensorSpec((None, height, width, channels), tf.uint8, name="images")
    archive.add_endpoint("serving_default", lambda images: outputs(images), input_signature=[image_spec])

    def predict_encoded(image_bytes):
        check_batch(tf.size(image_bytes))
        images = tf.map_fn(decode, image_bytes, fn_output_signature=tf.TensorSpec((height, width, channels), tf.uint8))
        return outputs(images)

    archive.add_endpoint(
        "predict_encoded", predict_encoded, input_signature=[tf.TensorSpec((None,), tf.string, name="image_bytes")]
    )
    if sa_conv.attention_blocks(model):
        (gh, gw), _ = sa_conv.attention_grid(model)

        def attention_maps(images, query_pixel):
            check_batch(tf.shape(images)[0])
            tf.debugging.assert_less(query_pixel, tf.constant([gh, gw], tf.int32),
                                     message=f"query_pixel must be (row, col) inside the {gh}x{gw} attention grid")
            tf.debugging.assert_non_negative(query_pixel, message="query_pixel must be non-negative")
            query = query_pixel[0] * gw + query_pixel[1]
            per_layer = sa_conv.attention_probabilities(model, images)
            rows = [tf.gather(p, query, axis=2) for p in per_layer]  # (b, heads_l, N) per layer
            most = max(r.shape[1] for r in rows)  # pruned layers have fewer heads: zero-padded
            maps = tf.stack([tf.pad(r, [[0, 0], [0, most - r.shape[1]], [0, 0]]) for r in rows], axis=1)
            return {"attention": tf.reshape(maps, (-1, len(per_layer), most, gh, gw))}

        archive.add_endpoint(
            "attention_maps", attention_maps,
            input_signature=[image_spec, tf.TensorSpec((2,), tf.int32, name="query_pixel")],
        )
    return archive
