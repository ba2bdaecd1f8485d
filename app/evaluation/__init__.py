"""Grading retrieval: a golden set run through the serving chain, scored, compared with a baseline, reported.

The parts, each depending only on the ones above it:

- `scoring/`: the measures (`metrics`), their one registry of names, labels and formats (`measures`), their
  statistics (`stats`) and the TREC run/qrels export (`trec`).
- `report/`: the one typed report (`model`: `Report` and its records, pydantic, camelCase JSON).
- `golden/`: the golden set (cases, BEIR import, query language, the audit) and how it is built
  (`golden/authoring/`: query-log sampling, generated questions, judgments, labelling pools).
- `run/`: every case through the chain (`runner`), the fingerprint of what was run (`fingerprint`), and the
  report built from a run (`build`, pure) with its segments and paraphrase groups (`segments`).
- `compare/`: a report against its baseline (`comparison`), which baseline (`baselines`), the gate (`gate`).
- `tune/`: replaying recorded runs over settings grids (`replay`, `grid`), held-out splits (`holdout`).
- `render/`: the report as Markdown (`markdown`) and HTML (`html`), the tuning report (`tune`), and the
  report files (`files`, written with `app.files.atomic_write_text`).
- `session`: one evaluation run (start-up, `sieve eval`, the API), wiring the parts together.
"""
