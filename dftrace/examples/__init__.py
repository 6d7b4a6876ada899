"""Small programs that show dftrace at work (``dftrace demo`` runs ``toy_training``), and
the sample runs the documentation reads (``dftrace demo --write-samples``: ``sample_runs``)."""
