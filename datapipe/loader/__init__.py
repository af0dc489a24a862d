"""The loader: datapipe.stream reads shards for a trainer.

    stream.py      Stream and stream(): the pipeline from spans to samples or batches, resumable
    options.py     StreamOptions, checked once
    schedule.py    which samples a (rank, worker) reads, in what order: phases, passes, shuffle windows
    fetch.py       a shard's bytes: mapped, read into pooled memory, or downloaded (and cached)
    shardindex.py  where a shard's members lie: its index file, or a walk over its tar headers
    decode.py      a span's samples from those places (arrays as views of the shard)
    positions.py   position ids of a span's samples, all rows at once
    batches.py     batches of consecutive samples (strided views of the shard where it can)
    reference.py   the plain decoder (tarfile, np.load) that defines a sample; read_shard(s)
    torch_data.py  the PyTorch adapter (StreamDataset)

It reads the format in datapipe.shardformat and never imports the writer.
"""
