"""sa-conv: self-attention over images, after Cordonnier, Loukas & Jaggi (ICLR 2020)."""

from setuptools import find_packages, setup

TENSORFLOW_VERSION = "2.21.0"

setup(
    name="sa-conv",
    version="0.2.0",
    description=(
        "Keras 3 / TensorFlow multi-head self-attention over 2-D feature maps with relative "
        "positional encodings, reproducing 'On the Relationship between Self-Attention and "
        "Convolutional Layers'."
    ),
    python_requires=">=3.10",
    packages=find_packages(include=["sa_conv", "sa_conv.*", "trainers", "trainers.*", "export", "export.*", "programs", "programs.*"]),
    # TensorFlow comes from exactly one of the extras "cpu" or "gpu" (see README): both
    # distributions write the same `tensorflow` package, so the core names neither.
    install_requires=[
        "keras>=3.15,<3.16",
        "tensorflow-datasets>=4.9,<5",
        "importlib_resources",  # tensorflow-datasets 4.9.10 imports it on Python 3.11
        "keras-tuner==1.4.8",
        "tensorboard",  # keras-tuner fails every trial without it
        "scipy",  # keras-tuner's Bayesian tuner
        "scikit-learn",  # keras-tuner's Bayesian tuner
        "absl-py",
        "numpy",
        "matplotlib",
        "pyyaml",
    ],
    extras_require={
        "cpu": [f"tensorflow-cpu=={TENSORFLOW_VERSION}"],
        "gpu": [f"tensorflow[and-cuda]=={TENSORFLOW_VERSION}"],
        "onnx": ["tf2onnx", "onnxruntime"],
        # Reading the reference implementation's PyTorch checkpoints (sa-conv-import-reference).
        "reference": ["torch"],
        "test": ["pytest", "pytest-xdist", "pytest-random-order", "hypothesis", "tf2onnx", "onnxruntime"],
    },
    entry_points={
        "console_scripts": [
            "sa-conv-train=trainers.launch:train",
            "sa-conv-tune=trainers.launch:tune",
            "sa-conv-export=trainers.launch:export",
            "sa-conv-visualize=trainers.launch:visualize",
            "sa-conv-import-reference=trainers.launch:import_reference",
        ],
    },
)
