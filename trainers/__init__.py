"""Programs over the `sa_conv` library: training, search, visualization, the demo.

Importing this package or any of its modules changes nothing outside it: a program configures its
process (logs, oneDNN, allocator, seed, logging filters) in its entry point (`trainers.process`).
"""
