"""The console scripts (``sa-conv-train``, ``-tune``, ``-study``, ``-export``, ``-visualize``,
``-import-reference``): each configures the process (`trainers.process.configure`) before its
program, and with it TensorFlow, is imported. They live above every program they start."""

from trainers import process


def train():
    process.configure()
    from trainers import train as program

    program.run()


def tune():
    process.configure()
    from trainers import tune as program

    program.run()


def study():
    process.configure()
    from trainers import study as program

    program.run()


def visualize():
    process.configure()
    from programs import visualize as program

    program.run()


def export():
    process.configure()
    from export import export as program

    program.run()


def import_reference():
    process.configure()
    from programs import import_reference as program

    program.run()
