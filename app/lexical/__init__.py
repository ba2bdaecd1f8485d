"""The BM25 index beside the store: the analyzer and the index (`index`), its files on disk (`files`), and
its sync with the store's change log (`sync`)."""
