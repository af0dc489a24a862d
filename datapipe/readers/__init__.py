"""Readers: every source type, from files or generators to document records (datapipe.schema)."""
