"""Writes the reference-parity fixtures of ``tests/fixtures/reference/`` from the reference
implementation (GitHub ``epfml/attention-cnn``, PyTorch).

    python -m tools.make_reference_fixtures --reference_dir=PATH [--output_dir=tests/fixtures/reference]

(from the repository root, in any interpreter with torch and NumPy: it imports `epfml_reference`
from there)

``PATH`` is a local clone of the reference repository: its ``models`` package is imported from
there, never copied into this project. Its ``models/bert_utils.py`` is not in the repository
(only used for pretrained downloads): create a stub with ``cached_path = None``,
``WEIGHTS_NAME = CONFIG_NAME = ""``. Needs torch (``pip install .[reference]``).

For each variant of `epfml_reference.ENCODING_FLAGS` (``quadratic``, ``quadratic_full``,
``learned``, ``content_plus_learned_bias``) it builds the reference's ``BertImage`` at the small size (3 layers, 9 heads, hidden 64,
MLP 128, 2x2 pooling) with a fixed seed, and writes ``<encoding>.npz`` holding:

* ``state/<key>``: the state dict (``R``, the 125 MB Gaussian offset table, left out: the import
  recomputes what it derives from the config). Weights are rounded to bfloat16-representable
  float32 values (exact float32 numbers whose low bytes are zero) so the files compress; the
  reference's outputs are computed with the rounded weights. LayerNorm scales and offsets get
  noise, so a swapped or ignored LayerNorm cannot pass.
* ``config``: the reference's config (JSON), ``images``: 8 uint8 images ``(8, 32, 32, 3)``,
  ``logits``: the reference's eval-mode logits ``(8, 10)`` for them (normalized as its
  ``train.py`` does), ``probabilities``: layer 0's attention probabilities in the reference's
  layout, for the query pixels whose row and column are in ``query_positions`` (a 4x4 subgrid,
  to keep the files small): ``(4, 4, heads, H, W)``, or with content ``(2, 4, 4, heads, H, W)``
  for the first 2 images.
* ``labels``, ``train_learning_rates``, ``trained_logits``: the eval-mode logits after one step
  of the reference's optimizer per learning rate on those images and labels (`train_steps`).
"""

import argparse
import json
import os
import sys

import numpy as np

import epfml_reference  # standard library only: this process has no Keras

QUERY_POSITIONS = np.array([0, 5, 10, 15])
# A step at lr 0 first: PyTorch's momentum buffer still takes its gradient (trainers.optimizers).
TRAIN_LEARNING_RATES = (0.0, 0.1, 0.05)


def to_bfloat16_grid(array):
    """``array`` rounded to the nearest float32 whose low 16 bits are zero."""
    bits = np.ascontiguousarray(array, np.float32).view(np.uint32)
    rounded = ((bits.astype(np.uint64) + 0x8000) & 0xFFFF0000).astype(np.uint32)
    return rounded.view(np.float32)


def make_fixture(models, torch, encoding, seed=0):
    config = epfml_reference.reference_config(encoding)
    torch.manual_seed(seed)
    model = models.BertImage(config, num_classes=10).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "LayerNorm" in name:
                parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))
            parameter.copy_(torch.from_numpy(to_bfloat16_grid(parameter.numpy())))
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (8, 32, 32, 3), dtype=np.uint8)
    x = (images.astype(np.float32) / 255.0 - np.array(epfml_reference.PIXEL_MEAN, np.float32)) / np.array(epfml_reference.PIXEL_STD, np.float32)
    captured = []
    attention = model.encoder.layer[0].attention.self
    # The probabilities are the input of the attention's dropout (identity in eval mode).
    hook = attention.dropout.register_forward_hook(lambda module, inputs, output: captured.append(inputs[0]))
    with torch.no_grad():
        logits = model(torch.from_numpy(x).permute(0, 3, 1, 2).contiguous())
    hook.remove()
    # Copies: the training steps below change the parameters in place.
    state = {f"state/{k}": v.numpy().copy() for k, v in model.state_dict().items() if not k.endswith(".R")}
    probabilities = captured[0].numpy()
    if probabilities.ndim == 6:  # content: per image
        probabilities = probabilities[:2]
    q = QUERY_POSITIONS
    probabilities = probabilities[..., q[:, None], q[None, :], :, :, :]
    labels = rng.integers(0, 10, len(images))
    trained_logits = train_steps(model, torch, torch.from_numpy(x).permute(0, 3, 1, 2).contiguous(), labels)
    return dict(state, config=np.array(json.dumps(config)), images=images, logits=logits.numpy(),
                probabilities=probabilities, query_positions=q, labels=labels,
                train_learning_rates=np.array(TRAIN_LEARNING_RATES), trained_logits=trained_logits)


def train_steps(model, torch, x, labels):
    """The reference train.py's optimizer (SGD, momentum 0.9, weight decay 1e-4 on all but the
    Gaussian centers and spreads) for one step per learning rate of `TRAIN_LEARNING_RATES` on
    the fixture's images, in eval mode (no dropout: the steps are deterministic); returns the
    eval-mode logits after them."""
    optimizer = epfml_reference.reference_sgd(model, torch)
    targets = torch.from_numpy(labels.astype(np.int64))
    for lr in TRAIN_LEARNING_RATES:
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), targets).backward()
        optimizer.step()
    with torch.no_grad():
        return model(x).numpy()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference_dir", required=True)
    parser.add_argument("--output_dir", default=os.path.join(os.path.dirname(os.path.dirname(__file__)),
                                                             "tests", "fixtures", "reference"))
    args = parser.parse_args()
    import torch

    sys.path.insert(0, os.path.abspath(args.reference_dir))
    import models

    os.makedirs(args.output_dir, exist_ok=True)
    for encoding in epfml_reference.ENCODING_FLAGS:
        fixture = make_fixture(models, torch, encoding)
        path = os.path.join(args.output_dir, f"{encoding}.npz")
        np.savez_compressed(path, **fixture)
        print(f"{path}: {os.path.getsize(path) / 1e6:.2f} MB, logits {fixture['logits'][0, :3]}")


if __name__ == "__main__":
    main()
