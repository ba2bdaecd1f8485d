"""Access scope: principals, the access metadata of documents, and who may read what (`scope`)."""
