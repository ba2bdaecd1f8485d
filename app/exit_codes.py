"""The one exit-code table of the `sieve` command, for every subcommand and for `sieve serve`.

- 0 OK: success; for `eval` and `serve --evaluate`, every gate check held.
- 1 GATE_FAILED: an evaluation gate check failed (`sieve eval`; `sieve serve` with `fail_on_gate: true`).
- 2 BAD_INPUT: configuration, files, golden set, baseline report, BEIR or TREC files; also `sieve serve`
  with `fail_on_invalid_golden_set: true` and a broken golden set.
- 3 UNAVAILABLE: the service could not start (a model could not load, the store is unreachable); also
  `sieve serve` forced to exit because its shutdown took longer than `rag.server.shutdown_seconds`.
- 4 STORE_DAMAGED: `sieve store check` found the index unlike the document record, or the store failing a
  read or write probe; `sieve store rebuild` refusing to drop documents the record lacks.
- 130 INTERRUPTED: stopped with Ctrl-C.
"""

from __future__ import annotations

OK = 0
GATE_FAILED = 1
BAD_INPUT = 2
UNAVAILABLE = 3
STORE_DAMAGED = 4
INTERRUPTED = 130

TABLE: dict[int, str] = {
    OK: "success (every gate check held)",
    GATE_FAILED: "an evaluation gate check failed",
    BAD_INPUT: "bad input: configuration, files, golden set, baseline report",
    UNAVAILABLE: "the service could not start (model or store unavailable)",
    STORE_DAMAGED: "the index does not match the document record, or the store fails a probe",
    INTERRUPTED: "interrupted",
}
