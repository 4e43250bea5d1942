"""trainbench: reproducible benchmarks of distributed deep-learning training set-ups."""

__version__ = "0.1.0"
