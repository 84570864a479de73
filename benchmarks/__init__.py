"""Benchmarks of the `sa_conv` library and its programs. Importing it changes nothing outside it:
each benchmark configures its process in its entry point (`trainers.process`), as the programs it
measures do, and records that configuration in its JSON."""
