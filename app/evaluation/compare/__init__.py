"""A report against its baseline: the comparison, which baseline, and the gate."""
