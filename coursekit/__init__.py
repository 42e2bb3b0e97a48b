"""coursekit: parallel and distributed training of neural networks, run live."""

__version__ = "0.1.0"
