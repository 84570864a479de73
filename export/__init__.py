"""Export programs over the `sa_conv` library (SavedModel, TFLite, ONNX; the reference importer).
Importing it changes nothing outside it: the programs configure their process in their entry
point (`trainers.process`)."""
