"""``--recipe``: named defaults of the training settings, beneath a config file and the flags.

* ``paper``: the trainer's own defaults, the paper's recipe (SGD 0.1, momentum 0.9, L2 weight
  decay 1e-4, cosine after a 5% warm-up, the pad-crop-flip augmentation).
* ``small_data``: the recipe of the models that made attention competitive on small datasets
  (DeiT, CCT, ConViT): AdamW with decoupled weight decay, spared on biases
  and normalizations, label smoothing, RandAugment and random erasing per image, MixUp or CutMix
  per batch, stochastic depth and a moving average of the weights.
"""

RECIPES: dict[str, dict] = {
    "paper": {},
    "small_data": {
        "optimizer": "adamw",
        "learning_rate": 5e-4,
        "weight_decay": 0.05,
        "no_weight_decay": "gamma,beta,bias",
        "label_smoothing": 0.1,
        "augmentation": "pad_crop_flip,rand_augment,random_erasing,mixup,cutmix",
        "stochastic_depth": 0.1,
        "ema_momentum": 0.999,
    },
}
