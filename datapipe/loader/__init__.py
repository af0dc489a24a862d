"""The loader: datapipe.stream reads shards for a trainer (stream.py); which samples a rank reads
and in what order (schedule.py); fetching (fetch.py), locating (shardindex.py) and decoding
(decode.py, batches.py) them; reference.py is the plain decoder that defines a sample; the
PyTorch adapter (torch_data.py). It reads the format in datapipe.shardformat and never imports
the writer."""
