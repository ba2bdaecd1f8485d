"""Running every golden case through the retrieval chain, and the fingerprint of the run."""
