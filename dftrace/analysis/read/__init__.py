"""Stage 1: trace files into decoded partitions (sources, decoding, the profiler's
documents, Parquet) and what the metadata says of each process. Imports nothing
from the later stages."""
