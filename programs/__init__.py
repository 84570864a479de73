"""The programs that neither train nor export: ``demo`` (``make demo``: train a small model on
CIFAR-10, export and plot it), ``visualize`` (``sa-conv-visualize``: attention figures of a
trained model) and ``import_reference`` (``sa-conv-import-reference``: a checkpoint of the
reference PyTorch implementation as a ``.keras`` model). Training is in `trainers`, export in
`export`."""
