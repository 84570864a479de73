"""`TrainConfig`: every setting of a training run, the single source of the trainer's flags.

`trainers.cli` defines one absl flag per field (same name, default and help), a
``--config_file`` (JSON or YAML) may set any of them, and flags given on the command line win.
The resolved configuration is written to ``model_dir/config.json``.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from trainers import cli
from sa_conv.attention_init import ATTENTION_INITS
from sa_conv.config import PRESETS, get_config
from trainers.data import DATASETS, get_source
from sa_conv.encodings import get_encoding
from sa_conv.errors import ConfigError, SaConvError
from trainers import augmentation, footprint
from trainers.optimizers import MOMENTUM_FORMS, OPTIMIZERS
from trainers.recipes import RECIPES
from trainers.schedule import SCHEDULES

REMAT = ("none", "blocks", "auto")
STRATEGIES = ("auto", "mirrored", "multi_worker", "one_device", "tpu")
PIXEL_STATISTICS = ("data", "reference")
PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16", "auto")
# Fields of sa_conv.ModelConfig that the trainer exposes as flags (None = the preset's value).
MODEL_OVERRIDES = (
    "encoding", "num_layers", "num_heads", "hidden_size", "mlp_size", "dropout", "attention_dropout",
    "attention_init", "locality_strength", "locality_distance", "stochastic_depth",
)

_field = cli.config_field


# Largest --image_size: a 1024x1024 image is a 512x512 attention grid after 2x2 pooling, far past
# what any preset trains in memory (docs/training.md: resolution).
MAX_IMAGE_SIZE = 1024


@dataclasses.dataclass
class TrainConfig:
    recipe: str = _field(
        "paper",
        "Named defaults of the training settings (trainers.recipes): paper (the paper's SGD, weight decay and "
        "pad-crop-flip) or small_data (AdamW, label smoothing, stochastic depth, a moving average of the "
        "weights, pad-crop-flip: docs/training.md). A config file and flags "
        "override any of them.", tuple(RECIPES))
    model: str = _field("sa_quadratic_small", "Model preset.", tuple(PRESETS))
    encoding: Optional[str] = _field(None, "Override the preset's positional encoding.")
    num_layers: Optional[int] = _field(None, "Override the preset's number of transformer blocks.")
    num_heads: Optional[int] = _field(None, "Override the preset's attention heads.")
    hidden_size: Optional[int] = _field(None, "Override the preset's hidden size.")
    mlp_size: Optional[int] = _field(None, "Override the preset's MLP size.")
    dropout: Optional[float] = _field(None, "Override the preset's dropout.")
    attention_dropout: Optional[float] = _field(None, "Override the preset's attention dropout.")
    stochastic_depth: Optional[float] = _field(
        None, "Drop rate of the last block's residual branches in training, per example (stochastic depth; "
        "earlier blocks' rates fall linearly to 0 at the first). Default: the preset's (0).")
    attention_init: Optional[str] = _field(
        None, "How attention starts (default: the preset's; random for all but sa_gated*): random, convolutional "
        "(each head at one shift of the KxK grid, Theorem 1; position-only encodings and gated) or mimetic "
        "(content attention's query-key products near a scaled identity).", ATTENTION_INITS)
    locality_strength: Optional[float] = _field(
        None, "Locality strength (alpha) of --attention_init=convolutional: how sharply each head starts on its "
        "shift (default 1, ConViT's).")
    locality_distance: Optional[float] = _field(
        None, "Spacing in grid pixels of --attention_init=convolutional's shifts (default 1: the 3x3 neighbourhood; "
        "2 starts the heads twice as far apart).")
    dataset: str = _field(
        "cifar10",
        f"Data source: one of {', '.join(DATASETS)} (tfds:NAME: any tfds image-classification dataset; "
        "folder:PATH: one subfolder per class, optional train/ validation/ test/). The model's classes and "
        "normalization come from the data, its image size too unless --image_size is given.",
    )
    data_dir: Optional[str] = _field(
        None, "For cifar10/cifar100: the official python-format directory or .tar.gz, else a tfds data_dir."
    )
    image_size: Optional[int] = _field(
        None,
        "Side of the square images the model sees (default: the dataset's own; 32 for folder:PATH). Images are "
        "resized (shorter side) and cropped: center crop to evaluate, random crop and flip to train. The attention "
        "grid is image_size / pooling width; attention dropout above 0 makes training take the dense "
        "(N^2 memory) attention path.",
    )
    pixel_statistics: str = _field(
        "data",
        "The normalization the model applies: data (per-channel mean and std of the training split) or "
        "reference (the constants of the reference implementation's train.py, mean (0.4914, 0.4822, 0.4465), "
        "std (0.2023, 0.1994, 0.2010): its std is below CIFAR-10's measured ~0.25, so its inputs are about "
        "1.2x wider; use it to train as the reference does).",
        PIXEL_STATISTICS,
    )
    validation_size: Optional[int] = _field(
        None, "Training images held out for validation (default 10%: 5,000 of CIFAR-10); unused where the data has its "
        "own validation split (a folder's validation/)."
    )
    epochs: int = _field(300, "Training epochs.")
    global_batch_size: int = _field(100, "Global batch size, split across replicas.")
    eval_batch_size: int = _field(500, "Global batch size for validation and test.")
    optimizer: str = _field(
        "sgd",
        "sgd (with --momentum; --weight_decay is L2 added to the gradient, as PyTorch's SGD) or adamw "
        "(keras.optimizers.AdamW; --weight_decay is decoupled, w -= lr * weight_decay * w, as PyTorch's "
        "AdamW).", tuple(OPTIMIZERS))
    learning_rate: float = _field(0.1, "Peak learning rate.")
    momentum: float = _field(0.9, "SGD momentum.")
    momentum_form: str = _field(
        "keras",
        "How SGD applies momentum: keras (m = mu m - lr g; w += m) or pytorch (b = mu b + g; w -= lr b, as "
        "torch.optim.SGD and the reference's train.py). The same at a constant learning rate; they differ "
        "where it changes, most after --lr_update=epoch's warm-up epoch at lr 0 (trainers.optimizers).",
        MOMENTUM_FORMS,
    )
    weight_decay: float = _field(
        1e-4,
        "Weight decay (as --optimizer says) on every variable but those the model "
        "declares (sa_conv.no_weight_decay: the attention centers and spreads, as the reference implementation) "
        "and those named in --no_weight_decay.",
    )
    no_weight_decay: str = _field(
        "",
        "Comma-separated short variable names without weight decay, besides those the model declares (the "
        "attention centers and spreads). BERT's convention adds gamma,beta,bias.",
    )
    warmup_ratio: float = _field(0.05, "Fraction of all steps with linear learning-rate warm-up.")
    lr_update: str = _field(
        "step",
        "When the learning rate follows the schedule: every step, or once per epoch (its value at the "
        "epoch's first step, as the reference's train.py; its warm-up then starts at lr 0 for a whole epoch).",
        ("step", "epoch"),
    )
    lr_schedule: str = _field("cosine", "Per-step schedule after warm-up.", SCHEDULES)
    lr_milestones: str = _field("80,150,250", "Epochs at which the step schedule divides the lr.")
    lr_decay_factor: float = _field(10.0, "Divisor of the lr at each milestone (step schedule).")
    label_smoothing: float = _field(0.0, "Label smoothing of the cross-entropy.")
    augmentation: str = _field(
        "pad_crop_flip",
        "Comma-separated training augmentations (trainers.augmentation), seeded: pad_crop_flip (the paper's "
        "pad by 4, random crop, flip), rand_augment, random_erasing (per example, in that order after "
        "pad_crop_flip), mixup, cutmix (per batch, mixing the labels; with both, a coin picks one per batch).")
    rand_augment_ops: int = _field(2, "Operations RandAugment applies to each image.")
    rand_augment_factor: float = _field(0.5, "Strength of RandAugment's operations, in [0, 1].")
    random_erasing: float = _field(0.25, "Probability that random_erasing erases a rectangle of an image.")
    mixup_alpha: float = _field(0.8, "MixUp's weights follow Beta(alpha, alpha).")
    cutmix_alpha: float = _field(1.0, "CutMix's mixing weights follow Beta(alpha, alpha); alpha in (0, 1].")
    ema_momentum: Optional[float] = _field(
        None,
        "Keep an exponential moving average of the weights and of the normalizations' moving statistics "
        "(keras optimizer use_ema) with this momentum; validation, the test, the saved models and snapshots use "
        "the average. Unset or 0: off.")
    seed: int = _field(0, "Seed of initialization, data split, shuffling and augmentation.")
    mixed_precision: str = _field(
        "float32",
        "Keras dtype policy. auto: mixed_bfloat16 on CPUs with AVX512_BF16 or AMX and on GPUs of compute "
        "capability 8.0+, float32 elsewhere (logged, and recorded in config.json).", PRECISIONS)
    jit_compile: Optional[bool] = _field(
        None,
        "Compile the forward and backward pass with XLA. Unset: off, except for content-based "
        "encodings under --remat=none whose step's activations exceed --memory_budget_gb: XLA's buffer "
        "reuse keeps their per-example (batch, heads, N, N) attention tensors in less memory. Elsewhere "
        "steps trained faster without it on AVX-512 CPUs (benchmarks/results/throughput_xla.json, "
        "throughput_bfloat16.json; docs/performance.md).",
    )
    reset_degenerate_heads: bool = _field(
        False,
        "After every epoch, re-initialize the center and spread of Gaussian heads whose attention is no "
        "longer localized (sa_conv.degenerate_heads: precision below 1e-5 or condition number above 1000).",
    )
    prune_degenerate_heads: bool = _field(
        False,
        "After every epoch, remove the Gaussian heads whose attention is no longer localized (same "
        "criteria; sa_conv.prune_heads): the model shrinks, training goes on with the rest, and the "
        "per-block head counts are recorded so a resumed run restores the pruned architecture.",
    )
    keep_freed_memory: Optional[bool] = _field(
        None,
        "Keep memory freed by a training step in the process (glibc mallopt) instead of returning it "
        "to the OS and faulting it in again at the next step: faster steps on CPU for a higher peak "
        "RSS (freed blocks stay and fragment). Unset: on, except when transformer blocks are "
        "rematerialized (--remat), where memory is what the run is short of and the large tensors come "
        "from TensorFlow's oneDNN pool anyway (benchmarks/results/malloc.json, remat_allocator.json). "
        "No effect without glibc.",
    )
    remat: str = _field(
        "auto",
        "Rematerialize transformer blocks in training (sa_conv.TransformerBlock remat: the backward pass "
        "recomputes each block's activations from its input; same gradients, one more forward pass per "
        "block). auto: when the estimated activation memory of a step (trainers.footprint) exceeds "
        "--memory_budget_gb. Measured: benchmarks/results/remat_allocator.json.",
        REMAT,
    )
    memory_budget_gb: float = _field(
        4.0,
        "Activation memory per replica above which --remat=auto rematerializes. The default turns remat on "
        "for the paper presets at batch 100 (estimated 9.5 GB of activations, 13.6 GB with content) and off "
        "for the _small presets (0.5-2.1 GB). Under --remat=none, content-based attention above it compiles "
        "with XLA (--jit_compile's default).",
    )
    steps_per_execution: int = _field(1, "Training steps run per tf.function call.")
    strategy: str = _field("auto", "tf.distribute strategy.", STRATEGIES)
    cpu_devices: int = _field(
        1, "Split the CPU into this many logical devices (replicas of a CPU MirroredStrategy)."
    )
    model_dir: str = _field("runs/default", "Output directory; a rerun with the same one resumes.")
    init_from: Optional[str] = _field(
        None,
        "Start from the weights of this .keras model (an earlier run's model.keras, or one written by "
        "sa-conv-import-reference from a reference checkpoint) instead of a fresh initialization. The "
        "architecture and normalization must be the run's own (for an imported reference model: "
        "--pixel_statistics=reference). The optimizer starts fresh. Ignored when resuming from model_dir.",
    )
    max_steps: Optional[int] = _field(None, "Stop after this many optimizer steps (smoke runs).")
    keep_checkpoints: int = _field(2, "Epoch checkpoints kept for resuming.")
    attention_summaries_every: int = _field(
        0, "Write attention maps and centers to TensorBoard (logs/attention) every N epochs; 0: off."
    )
    snapshot_every: int = _field(
        0, "Also keep the model as snapshots/epoch_<E>.keras at the start (E=000), every N epochs and at "
        "the end, for learning curves and for how attention changes in training; 0: off."
    )

    def model_overrides(self) -> dict:
        return {name: getattr(self, name) for name in MODEL_OVERRIDES if getattr(self, name) is not None}

    def weight_decay_exclusions(self) -> tuple[str, ...]:
        return tuple(name.strip() for name in self.no_weight_decay.split(",") if name.strip())

    def milestone_epochs(self) -> tuple[int, ...]:
        try:
            epochs = tuple(int(m) for m in self.lr_milestones.split(",") if m.strip())
        except ValueError:
            epochs = None
        if epochs is None or list(epochs) != sorted(epochs) or any(e < 0 for e in epochs):
            raise ConfigError(
                f"--lr_milestones must be comma-separated increasing epochs, got {self.lr_milestones!r}."
            )
        return epochs

    def validate(self) -> None:
        """Raises ConfigError for values no run can use: the preset with its overrides as
        `sa_conv.get_config` checks them (the fields the data decides, and data paths, when loading)."""
        for f in dataclasses.fields(self):
            choices = f.metadata.get("choices")
            value = getattr(self, f.name)
            if choices and value is not None and value not in choices:
                raise ConfigError(f"--{f.name}={value!r} is not one of: {', '.join(choices)}.")
        if self.encoding is not None:
            try:
                spec = get_encoding(self.encoding)
            except ValueError as exc:
                raise ConfigError(f"--encoding: {exc}") from None
            if spec.serves_only:
                raise ConfigError(f"--encoding={self.encoding} serves a trained model's copy "
                                  "(sa_conv.freeze_for_inference) and does not train: train the encoding it freezes.")
        for name in ("epochs", "global_batch_size", "eval_batch_size", "steps_per_execution",
                     "cpu_devices", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name} must be a positive integer, got {getattr(self, name)}.")
        for name in ("attention_summaries_every", "snapshot_every", "seed"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{name} must be >= 0, got {getattr(self, name)}.")
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError(f"--max_steps must be positive, got {self.max_steps}.")
        if self.learning_rate <= 0:
            raise ConfigError(f"--learning_rate must be positive, got {self.learning_rate}.")
        if self.lr_decay_factor <= 0:
            raise ConfigError(f"--lr_decay_factor must be positive, got {self.lr_decay_factor}.")
        for name, low, high in (("momentum", 0, 1), ("warmup_ratio", 0, 1), ("label_smoothing", 0, 1)):
            if not low <= getattr(self, name) < high:
                raise ConfigError(f"--{name} must be in [{low}, {high}), got {getattr(self, name)}.")
        if self.image_size is not None and not 1 <= self.image_size <= MAX_IMAGE_SIZE:
            raise ConfigError(f"--image_size must be in [1, {MAX_IMAGE_SIZE}], got {self.image_size}.")
        if self.memory_budget_gb <= 0:
            raise ConfigError(f"--memory_budget_gb must be positive, got {self.memory_budget_gb}.")
        if self.weight_decay < 0:
            raise ConfigError(f"--weight_decay must be >= 0, got {self.weight_decay}.")
        if self.validation_size is not None and self.validation_size < 1:
            raise ConfigError(
                f"--validation_size must be positive, got {self.validation_size}: model selection "
                "needs a validation split (the test split is only for the final evaluation)."
            )
        augmentation.parse(self.augmentation)
        if self.rand_augment_ops < 1 or not 0 <= self.rand_augment_factor <= 1:
            raise ConfigError(f"--rand_augment_ops must be positive and --rand_augment_factor in [0, 1], got "
                              f"{self.rand_augment_ops} and {self.rand_augment_factor}.")
        if not 0 <= self.random_erasing <= 1:
            raise ConfigError(f"--random_erasing is a probability, got {self.random_erasing}.")
        if self.mixup_alpha <= 0 or not 0 < self.cutmix_alpha <= 1:
            raise ConfigError(f"--mixup_alpha must be positive and --cutmix_alpha in (0, 1] (keras.layers.CutMix), "
                              f"got {self.mixup_alpha} and {self.cutmix_alpha}.")
        if self.ema_momentum is not None and not 0 <= self.ema_momentum < 1:
            raise ConfigError(f"--ema_momentum must be in [0, 1) (0: off), got {self.ema_momentum}.")
        if self.ema_momentum and self.prune_degenerate_heads:
            raise ConfigError("--prune_degenerate_heads changes the model's variables, which --ema_momentum "
                              "averages; choose one.")
        if self.reset_degenerate_heads and self.prune_degenerate_heads:
            raise ConfigError(
                "--reset_degenerate_heads and --prune_degenerate_heads both act on degenerate heads; "
                "choose one."
            )
        self.milestone_epochs()
        try:
            get_source(self.dataset)
        except SaConvError as exc:
            raise ConfigError(f"--dataset: {exc}") from None
        try:
            get_config(self.model, **self.model_overrides())
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def default_jit_compile(model_config, replica_batch: int, memory_budget_gb: float) -> bool:
    """XLA when ``--jit_compile`` is unset: only where it is what keeps a step in memory, for
    encodings whose logits depend on the input (per-example ``(batch, heads, N, N)`` tensors,
    which XLA's buffer reuse holds in less memory) whose blocks are not rematerialized and whose
    ``replica_batch`` step's estimated activations exceed ``memory_budget_gb``. Elsewhere steps trained
    faster without XLA on AVX-512 CPUs, the content presets' most (see `TrainConfig.jit_compile`)."""
    content = model_config.is_attention and not get_encoding(model_config.encoding).position_only
    return content and not model_config.remat and (
        footprint.over_budget(model_config, replica_batch, memory_budget_gb) is not None)


def default_keep_freed_memory(model_config) -> bool:
    """``--keep_freed_memory`` when unset: off when blocks are rematerialized (see its help)."""
    return not model_config.remat


def make_config(file_values: dict | None = None, overrides: dict | None = None) -> TrainConfig:
    """Defaults, then the ``--recipe``'s (`trainers.recipes`), then the config file's values, then
    ``overrides`` (e.g. flags set on the command line); type-checked and validated."""
    values = {**(file_values or {}), **(overrides or {})}
    recipe = values.get("recipe") or TrainConfig.recipe
    if recipe not in RECIPES:
        raise ConfigError(f"--recipe={recipe!r} is not one of: {', '.join(RECIPES)}.")
    return cli.make(TrainConfig, {**RECIPES[recipe], **values})


def read_config_file(path: str) -> dict:
    """The `TrainConfig` settings of a JSON or YAML file (see `trainers.cli.read_config_file`)."""
    return cli.read_config_file(path, TrainConfig)
