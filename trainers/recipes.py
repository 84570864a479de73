"""``--recipe``: named defaults of the training settings, beneath a config file and the flags.

* ``paper``: the trainer's own defaults, the paper's recipe (SGD 0.1, momentum 0.9, L2 weight
  decay 1e-4, cosine after a 5% warm-up, the pad-crop-flip augmentation).
* ``small_data``: the recipe of the models that made attention competitive on small datasets
  (DeiT, CCT, ConViT): AdamW with decoupled weight decay, spared on biases
  and normalizations, label smoothing, stochastic depth and a moving average of the weights. Its
  learning rate, weight decay, stochastic depth and label smoothing are the point that
  `sa-conv-tune`'s search (spaces ``small_data`` and ``small_data_resnet``: the same eight points,
  20 epochs on cifar10-mini's validation split) ranked first for both ``sa_quadratic_small`` and
  ``resnet20`` (benchmarks/results/small_data_search.json). Its augmentation is the paper's
  pad-crop-flip: of the field's (RandAugment, random erasing, MixUp, CutMix added), and of both
  without MixUp and CutMix, it has the best validation accuracy averaged over the two models at
  240 epochs (benchmarks/results/small_data_ablation.json); ``--augmentation`` adds the others.
"""

RECIPES: dict[str, dict] = {
    "paper": {},
    "small_data": {
        "optimizer": "adamw",
        "learning_rate": 1.1e-3,
        "weight_decay": 0.045,
        "no_weight_decay": "gamma,beta,bias",
        "label_smoothing": 0.1,
        "augmentation": "pad_crop_flip",
        "rand_augment_factor": 0.1,
        "stochastic_depth": 0.1,
        "ema_momentum": 0.999,
    },
}
