"""The golden-set audit: what in the golden set itself makes its verdicts less trustworthy.

- `checks`: the findings and the coverage, pure functions over the golden set, the index view and the query
  vectors (`audit_golden_set`);
- `index`: the index as the audit sees it (`IndexView`) and the ids a case names (`case_refs`);
- `source`: what the audit reads (the store, the embedder, the previous report) and what an evaluation calls
  (`run_audit`, `audit_section`, `attach_audit`).

Its text (`sieve golden check`, the report's "Golden-set audit" section) is app/evaluation/render/audit.py.
"""
