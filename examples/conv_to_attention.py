"""Theorem 1 in action: convert a Conv2D into multi-head self-attention, print the error for a
few alphas, and draw each head's attention for one query pixel (like the paper's Figure 1).

    .venv/bin/python examples/conv_to_attention.py --output=conv_as_attention.png
"""

import argparse

import keras
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from keras import ops  # noqa: E402

from sa_conv import conversion  # noqa: E402


def main(output="conv_as_attention.png", kernel_size=3, grid=9, alphas=(1, 2, 4, 8, 16, 40)):
    keras.utils.set_random_seed(0)
    conv = keras.layers.Conv2D(8, kernel_size, padding="same", bias_initializer="random_normal")
    x = np.random.default_rng(0).normal(size=(1, grid, grid, 4)).astype(np.float32)
    expected = ops.convert_to_numpy(conv(x))
    print(f"Conv2D {kernel_size}x{kernel_size}, 4 -> 8 channels, on a {grid}x{grid} input")
    errors = {}
    for alpha in alphas:
        layer = conversion.conv_to_attention(conv, alpha=alpha)
        errors[alpha] = float(np.abs(ops.convert_to_numpy(layer(x)) - expected).max())
        print(f"  alpha = {alpha:5.1f}: max |attention - conv| = {errors[alpha]:.3e}")

    layer = conversion.conv_to_attention(conv)
    _, probs = layer.attention(x, return_attention_scores=True)
    query = (grid // 2) * grid + grid // 2
    maps = ops.convert_to_numpy(probs)[0, :, query].reshape(-1, grid, grid)
    k = kernel_size
    fig, axes = plt.subplots(k, k, figsize=(2.0 * k, 2.0 * k))
    centers = conversion.shifts(k).astype(int)
    for h, ax in enumerate(np.asarray(axes).reshape(-1)):
        ax.imshow(maps[h], cmap="Reds", vmin=0, vmax=1)
        ax.scatter([grid // 2], [grid // 2], marker="s", s=60, facecolors="none", edgecolors="black")
        ax.set_title(f"head {h}: shift {tuple(centers[h].tolist())}", fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(f"{k * k} heads reproducing a {k}x{k} convolution\n(query pixel: black square)", fontsize=10)
    fig.tight_layout()
    fig.savefig(output, dpi=100)
    print(f"Attention maps of the {k * k} heads for the center query: {output}")
    return errors


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="conv_as_attention.png")
    parser.add_argument("--kernel_size", type=int, default=3)
    args = parser.parse_args()
    main(args.output, args.kernel_size)
