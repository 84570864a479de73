"""The console scripts (``sa-conv-train``, ``-tune``, ``-export``, ``-visualize``,
``-import-reference``): each configures the process (`trainers.process.configure`) before its
program, and with it TensorFlow, is imported."""

import importlib

from trainers import process


def _launch(module: str) -> None:
    process.configure()
    importlib.import_module(module).run()


def train():
    _launch("trainers.train")


def tune():
    _launch("trainers.tune")


def visualize():
    _launch("programs.visualize")


def export():
    _launch("export.export")


def import_reference():
    _launch("programs.import_reference")
