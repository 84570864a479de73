"""sa-conv: self-attention over images, after Cordonnier, Loukas & Jaggi (ICLR 2020)."""

from setuptools import find_packages, setup

TENSORFLOW_VERSION = "2.21.0"

LAYERS = ["keras>=3.15,<3.16", "numpy"]
TRAIN = [
    "tensorflow-datasets>=4.9,<5",
    "importlib_resources",  # tensorflow-datasets 4.9.10 imports it on Python 3.11
    "absl-py",
    "pyyaml",
    "ai-edge-litert",  # sa-conv-export runs the TFLite files it writes in LiteRT
]
SEARCH = [
    "keras-tuner==1.4.8",
    "tensorboard",  # keras-tuner fails every trial without it
    "scipy",  # keras-tuner's Bayesian tuner
    "scikit-learn",  # keras-tuner's Bayesian tuner
]
PLOTS = ["matplotlib"]
# The studies' summaries and the pages' tables (benchmarks/, tools/performance_tables.py).
BENCHMARKS = ["pandas", "tabulate"]

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
    py_modules=["epfml_reference"],  # what sa-conv knows of the reference (standard library only)
    # The layers and models: Keras and NumPy, on any Keras backend. Training, search, plots and
    # the backend are extras (`make` installs all of them; see README "Install").
    install_requires=LAYERS,
    extras_require={
        # TensorFlow comes from exactly one of "cpu" or "gpu": both distributions write the same
        # `tensorflow` package.
        "cpu": [f"tensorflow-cpu=={TENSORFLOW_VERSION}"],
        "gpu": [f"tensorflow[and-cuda]=={TENSORFLOW_VERSION}"],
        "train": TRAIN,  # sa-conv-train, sa-conv-export, the data pipeline (with "cpu" or "gpu")
        "search": TRAIN + SEARCH,  # sa-conv-tune
        "plots": PLOTS,  # sa_conv.plotting, sa-conv-visualize
        "benchmarks": TRAIN + SEARCH + PLOTS + BENCHMARKS,  # the studies and the pages made from them
        "onnx": ["tf2onnx", "onnxruntime"],
        # Running TFLite files (the export's check of them, the serving benchmark): LiteRT.
        "tflite": ["ai-edge-litert"],
        # `sa-conv-export --formats=...,openvino`: OpenVINO's IR, and its int8 version by NNCF.
        "openvino": ["openvino", "nncf"],
        # Reading the reference implementation's PyTorch checkpoints and YAML configs.
        "reference": ["torch", "pyyaml"],
        "all": TRAIN + SEARCH + PLOTS,
        # No nncf here: it pulls scikit-learn, which the layers-only test venv must not have.
        "test": ["pytest", "pytest-xdist", "pytest-random-order", "hypothesis", "tf2onnx", "onnxruntime", "openvino",
                 "ai-edge-litert"],
    },
    entry_points={
        "console_scripts": [
            "sa-conv-train=programs.launch:train",
            "sa-conv-tune=programs.launch:tune",
            "sa-conv-study=programs.launch:study",
            "sa-conv-export=programs.launch:export",
            "sa-conv-visualize=programs.launch:visualize",
            "sa-conv-import-reference=programs.launch:import_reference",
        ],
    },
)
