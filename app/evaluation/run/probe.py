"""The leak probe: every case of a run again as every other evaluation principal, each answer checked for
chunks the probing principal may not read (`access.access_leaks`, the independent rule over the stored
metadata). A filter that works for the principal a case names but not for another is caught here; a leak
found is a zero-tolerance failure of the gate (`leak_probe`).

Cost: one retrieval per (case, other principal): cases x (principals - 1) for cases that run as one of
them, cases x principals for the others, batched like the run (`BATCH_SIZE` queries per embedding and store
call). No scoring, no trace analysis: only the returned chunks are read. A run with no evaluation principal
has no probe.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import date

from app.access.scope import Principal
from app.evaluation.golden.principals import others
from app.evaluation.report.model import LeakProbe
from app.evaluation.run.access import access_leaks
from app.evaluation.run.runner import BATCH_SIZE, CaseResult, Evaluation, KnownIds
from app.retrieval.chain import RetrievalChain, RetrievalRequest
from app.retrieval.types import RetrievalResult


def probe_runs(
    cases: list[CaseResult], defined: Mapping[str, Principal]
) -> list[tuple[CaseResult, Principal]]:
    """The (case, probing principal) pairs of the probe, in case order then configured principal order:
    every case that ran, as every evaluation principal other than its own."""
    return [(item, p) for item in cases if item.error is None for p in others(item.principal, defined)]


def leak_probe(
    chain: RetrievalChain,
    evaluation: Evaluation,
    defined: Mapping[str, Principal],
    known: KnownIds,
    today: date | None = None,
) -> LeakProbe | None:
    """Run the probe (`probe_runs`) through `chain`, as of each case's date (else `today`); None without
    evaluation principals. A retrieval that raises is an error of the probe, named with its case and
    principal: the gate fails on it as on a leak, since the probe could not check that answer."""
    if not defined:
        return None
    t0 = time.perf_counter()
    runs = probe_runs(evaluation.cases, defined)
    by_day: dict[date, list[tuple[CaseResult, Principal]]] = {}
    for item, principal in runs:
        by_day.setdefault(item.as_of or today or date.today(), []).append((item, principal))
    probe = LeakProbe(principals=list(defined), runs=len(runs))
    for day, pairs in by_day.items():
        for start in range(0, len(pairs), BATCH_SIZE):
            batch = pairs[start : start + BATCH_SIZE]
            requests = [RetrievalRequest(i.case.query, i.k, i.case.knowledge_tag, p) for i, p in batch]
            try:
                outcomes: list[RetrievalResult | Exception] = chain.retrieve_many(requests, today=day)
            except Exception as exc:  # the batch's shared part failed: no answer of it could be checked
                outcomes = [exc] * len(batch)
            for (item, principal), outcome in zip(batch, outcomes, strict=True):
                if isinstance(outcome, BaseException):
                    probe.errors.append(
                        f"case {item.case.id} as {principal.name}: {type(outcome).__name__}: {outcome}"
                    )
                    continue
                probe.leaks.extend(
                    access_leaks(item.case.id, principal, outcome.documents, known.scope_of, probe=True)
                )
    probe.duration_ms = round((time.perf_counter() - t0) * 1000, 1)
    return probe
