"""The report: one typed model, built once from a run, read by every renderer and by comparisons."""
