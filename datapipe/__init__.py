"""datapipe: pre-training data for multimodal LLMs, from sources to packed WebDataset shards.

Importing the package loads no heavy dependency; Ray loads only in datapipe.runner.
"""
from datapipe.stream import Stream, stream

__version__ = "0.1.0"
__all__ = ["Stream", "stream", "__version__"]
