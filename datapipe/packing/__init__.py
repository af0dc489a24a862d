"""Packing: which documents each curriculum phase takes (curriculum.py), best-fit packing into
sequences (bfd.py), the tokenized corpus they come from (corpus.py), and the shard writer (writer.py)."""
