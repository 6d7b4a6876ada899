"""Stage 3: the answers, one module per question, computed from the combined partials;
``summary`` gathers them into a ``Summary``. Imports from ``reduce``, ``read`` and
``runtime`` only."""
