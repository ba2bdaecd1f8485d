"""Grading retrieval: a golden set run through the serving chain, scored, compared with a baseline, reported.

The parts, each depending only on the ones above it:

- `golden/`: the golden set (cases, BEIR import, the audit) and how it is built (`golden/build/`: query-log
  sampling, generated questions, judgments, labelling pools).
- `scoring/`: the measures (`metrics`), their statistics (`stats`) and the TREC run/qrels export (`trec`).
- `run/`: every case through the chain (`runner`), and the fingerprint of what was run (`fingerprint`).
- `report/`: the one typed report (`model`), built once from a run (`build`), with its segments.
- `compare/`: a report against its baseline (`comparison`), which baseline (`baselines`), the gate (`gate`).
- `tune/`: replaying recorded runs over settings grids (`replay`, `grid`), held-out splits (`holdout`).
- `render/`: the report as Markdown and HTML, and the tuning report.
- `startup`: the service's start-up evaluation, wiring the parts together.
"""
