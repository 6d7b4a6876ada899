"""Small programs that show dftrace at work (``dftrace demo`` runs ``toy_training``)."""
