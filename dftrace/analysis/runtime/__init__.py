"""Where and with what the stages run: executors (embedded threads or Dask), the
optional dependencies, the heap policy of the commands and the C kernels. Imports
nothing from the stages."""
