"""A Keras callback that writes attention figures as TensorBoard image summaries, so one sees the
heads move during training (trainer flag ``--attention_summaries_every=N``)."""

from __future__ import annotations

import os

import keras
import numpy as np
import tensorflow as tf

import sa_conv
from sa_conv import heads, inspection, plotting


class AttentionSummaries(keras.callbacks.Callback):
    """Every ``every`` epochs, writes to ``log_dir`` the attention maps of the query pixel
    (layers x heads, averaged over ``images``) and, for Gaussian (quadratic) encodings, the centers of
    attention, as image summaries ``attention/maps`` and ``attention/centers``; for gated
    encodings, each head's gate (its weight on positional attention) as scalars
    ``attention/gate/block_<i>/head_<h>``.

    Args:
      images: uint8 ``(n, H, W, C)`` (the model's input size), e.g. a few validation images.
      log_dir: TensorBoard directory (e.g. ``model_dir/logs/attention``).
      every: period in epochs.
      query: ``(row, col)`` on the attention grid; default the center.
    """

    def __init__(self, images, log_dir, every=1, query=None):
        super().__init__()
        if every < 1:
            raise ValueError(f"every must be positive, got {every}.")
        self.images = np.asarray(images)
        self.every = int(every)
        self.query = query
        self.log_dir = log_dir
        self._writer = None

    def _figures(self):
        grid, pooling = sa_conv.attention_grid(self.model)
        query = self.query or (grid[0] // 2, grid[1] // 2)
        probabilities = plotting.model_attention(self.model, self.images)
        maps = np.stack([inspection.query_maps(p, grid, query).mean(0) for p in probabilities])
        figures = {"attention/maps": plotting.attention_grid_figure(maps, query, self.images[0], pooling)}
        if plotting.has_centers(self.model):
            figures["attention/centers"] = plotting.centers_figure(self.model, query)
        return figures

    def on_epoch_end(self, epoch, logs=None):
        if (epoch + 1) % self.every:
            return
        if self._writer is None:
            os.makedirs(self.log_dir, exist_ok=True)
            self._writer = tf.summary.create_file_writer(self.log_dir)
        with self._writer.as_default(step=epoch + 1):
            for name, fig in self._figures().items():
                image = tf.io.decode_png(plotting.figure_png(fig), channels=4)
                tf.summary.image(name, image[None], step=epoch + 1)
            for block, gates in enumerate(heads.head_gates(self.model)):
                for head, gate in enumerate(() if gates is None else gates):
                    tf.summary.scalar(f"attention/gate/block_{block}/head_{head}", gate, step=epoch + 1)
        self._writer.flush()
