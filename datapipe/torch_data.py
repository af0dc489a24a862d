"""Moved to datapipe.loader.torch_data; this name works for one more release."""
import warnings

from datapipe.loader.torch_data import StreamDataset, collate_packed, packed_batch

warnings.warn("datapipe.torch_data moved to datapipe.loader.torch_data; import it from there",
              DeprecationWarning, stacklevel=2)
__all__ = ["StreamDataset", "collate_packed", "packed_batch"]
