"""Stage 2: each partition reduced to the tables of a ``Partial`` that combine across
partitions, the step model and the interval sweeps, and the index of partials
already computed. Imports only from ``read`` and ``runtime``."""
