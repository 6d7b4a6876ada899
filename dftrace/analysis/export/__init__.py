"""Traces written back out: Chrome JSON, pfw and Parquet, ``convert`` and ``merge``
(in memory for a loaded table, streamed for files of any size)."""
