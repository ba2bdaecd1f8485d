"""The labelling desk behind the labelling page, which the HTTP API (`/api/label/*`) and `sieve label` share:
where the page reads and writes (`LabelFiles`), and the state of one app (`LabelDesk`): the files, the
judgments log and the pools of candidates (golden/authoring/pool.py), with each case as the page shows it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from app.evaluation.golden.authoring.judgments import (
    NO_ANSWER,
    Judgment,
    JudgmentLog,
    latest_by_rater,
    read_drafts_lenient,
)
from app.evaluation.golden.authoring.pool import (
    BASELINE,
    CURRENT,
    Pool,
    PoolQuery,
    Ranked,
    baseline_report,
    build_pools,
    highlight,
    read_json,
    read_queue_lenient,
    report_rankings,
    variant_settings,
)
from app.evaluation.golden.cases import GoldenCase, case_relevance_key, chunk_evidence, load_golden_set

if TYPE_CHECKING:
    from app.service import Sieve
    from app.settings import Settings

log = logging.getLogger(__name__)

# unreadable lines shown per file in the answers' `fileProblems` (all are skipped; the log names the first)
MAX_SHOWN_PROBLEMS = 20


@dataclass(frozen=True)
class LabelFiles:
    """Where the labelling page reads and writes; `who` is the rater name the page suggests."""

    golden_set: Path
    drafts: Path
    judgments: Path
    queue: Path
    who: str | None = None

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> LabelFiles:
        label = settings.rag.label
        values: dict[str, Any] = {
            "golden_set": Path(settings.rag.evaluate.resource_location),
            "drafts": Path(label.drafts),
            "judgments": Path(label.judgments),
            "queue": Path(label.queue),
        }
        values.update({k: Path(v) if k != "who" else v for k, v in overrides.items() if v is not None})
        return cls(**values)


@dataclass(frozen=True)
class LabelCase:
    case: GoldenCase
    kind: Literal["golden", "draft"]


class LabelDesk:
    """The labelling state of one app: the files, the judgments log (one lock for every append), and the
    pools, computed once per (case, query, tag, K) and kept until `refresh`. The golden set, the drafts, the
    queue and the judgments are read again at every request: they change under the page's feet (an export,
    another rater, `sieve golden pool`)."""

    def __init__(self, files: LabelFiles) -> None:
        self.files = files
        self.log = JudgmentLog(files.judgments)
        self._pools: dict[tuple[str, str, str | None, int], Pool] = {}
        self._chains: dict[str, Any] | None = None
        self._known: Any = None
        self.baseline_path: str | None = None  # the report the baseline variant came from
        self._lock = threading.Lock()
        self._problems: dict[str, list[str]] = {}
        self._problems_lock = threading.Lock()  # apart: `queued` reads the queue under `_lock` too

    # -- reading the files ---------------------------------------------------------------------------

    def problems(self) -> list[str]:
        """The lines of the drafts, queue and judgments files that could not be read the last time each
        was (`file:line: problem`), at most `MAX_SHOWN_PROBLEMS` of each file."""
        with self._problems_lock:
            return [p for found in self._problems.values() for p in found[:MAX_SHOWN_PROBLEMS]]

    def _note(self, kind: str, problems: list[str]) -> None:
        with self._problems_lock:
            before = self._problems.get(kind, [])
            self._problems[kind] = problems
        if problems and problems != before:
            log.warning(
                "label: %d line(s) of the %s file skipped, the others read; first: %s",
                len(problems),
                kind,
                problems[0],
            )

    def cases(self) -> list[LabelCase]:
        """The golden set's cases, then the drafts not in it (a draft already in it was promoted). A drafts
        line that is not a case is skipped and kept in `problems`."""
        golden = load_golden_set(self.files.golden_set)
        ids = {c.id for c in golden.cases}
        drafts, problems = read_drafts_lenient(self.files.drafts)
        self._note("drafts", problems)
        return [LabelCase(c, "draft" if c.draft else "golden") for c in golden.cases] + [
            LabelCase(c, "draft") for c in drafts if c.id not in ids
        ]

    def queued(self) -> dict[str, list[Ranked]]:
        out: dict[str, list[Ranked]] = {}
        entries, problems = read_queue_lenient(self.files.queue)
        self._note("queue", problems)
        for entry in entries:
            bucket = out.setdefault(entry.case_id, [])
            for ranked in entry.ids:
                if ranked not in bucket:
                    bucket.append(ranked)
        return out

    # -- pools ---------------------------------------------------------------------------------------

    def pools(self, sieve: Sieve, cases: list[LabelCase], refresh: bool = False) -> dict[str, Pool]:
        """Each case's pool, computing those not cached (all of them in one batch per variant)."""
        k_default = sieve.settings.rag.evaluate.top_k
        keys = {
            lc.case.id: (lc.case.id, lc.case.query, lc.case.knowledge_tag, lc.case.top_k or k_default)
            for lc in cases
        }
        with self._lock:
            if refresh:
                self._pools.clear()
                self._known = None
            if self._chains is None:
                self._chains = {
                    name: (sieve.chain if name == CURRENT else sieve.with_settings(s).chain)
                    for name, s in variant_settings(sieve.settings).items()
                }
            if self._known is None:
                from app.evaluation.run.runner import KnownIds

                self._known = KnownIds.from_store(sieve.store)
            missing = [key for key in keys.values() if key not in self._pools]
            if missing:
                self._compute(sieve, missing)
            return {case_id: self._pools[key] for case_id, key in keys.items()}

    def _compute(self, sieve: Sieve, keys: list[tuple[str, str, str | None, int]]) -> None:
        evaluate = sieve.settings.rag.evaluate
        report_path = baseline_report(evaluate.output_dir, evaluate.report_prefix)
        baseline = {}
        if report_path is not None:
            baseline = report_rankings(read_json(report_path) or {})
        self.baseline_path = str(report_path) if report_path else None
        lexical = sieve.lexical

        def best_of(query: str, ids: Sequence[str]) -> str | None:
            scores = lexical.scores(query, ids)
            return max(ids, key=lambda i: (scores.get(i, 0.0), i)) if ids else None

        pools = build_pools(
            [PoolQuery(*key) for key in keys],
            self._chains or {},
            sieve.store,
            baseline=baseline,
            queued=self.queued(),
            best_of=best_of,
            today=evaluate.as_of,
        )
        for key in keys:
            self._pools[key] = pools[key[0]]
        log.info("label: pooled %d case(s) (baseline report: %s)", len(keys), self.baseline_path or "none")

    # -- views ---------------------------------------------------------------------------------------

    def judgments_by_case(self) -> dict[str, list[Judgment]]:
        judgments, problems = self.log.read()
        self._note("judgments", problems)
        out: dict[str, list[Judgment]] = {}
        for j in latest_by_rater(judgments):
            out.setdefault(j.case_id, []).append(j)
        return out

    def case_view(
        self, sieve: Sieve, label_case: LabelCase, pool: Pool, said: list[Judgment], with_text: bool = True
    ) -> dict[str, Any]:
        """One case as the page shows it (see `GET /api/label/cases/{case_id}`); `with_text` False leaves
        the texts out (the queue only counts)."""
        from app.evaluation.run.runner import resolve_case

        case = label_case.case
        grades, judged, _ = resolve_case(case, self._known)
        level = case_relevance_key(case)
        evidence = chunk_evidence(case)
        terms = sieve.analyzer.tokens(case.query)
        by_chunk: dict[str, list[Judgment]] = {}
        for j in said:
            if j.id is not None and j.query == case.query:
                by_chunk.setdefault(j.id, []).append(j)
        items: list[dict[str, Any]] = []
        for chunk in pool.chunks:
            entry = chunk.entry
            key = {"doc": entry.doc_id, "chunk": entry.chunk_id, "source": chunk.source}[level]
            golden_grade = case.judgments.get(entry.chunk_id, grades.get(key))
            in_golden = key in judged or entry.chunk_id in case.judgments
            raters = [_said(j) for j in by_chunk.get(entry.chunk_id, [])]
            items.append(
                {
                    "id": entry.chunk_id,
                    "docId": entry.doc_id,
                    "title": chunk.title,
                    "source": chunk.source,
                    "inIndex": chunk.in_index,
                    "segments": highlight(chunk.text, terms, sieve.analyzer.tokens) if with_text else [],
                    "variants": entry.ranks,
                    "golden": {
                        "judged": in_golden,
                        "grade": golden_grade if in_golden else None,
                        "forbidden": entry.doc_id in case.forbidden_doc_ids,
                        "evidence": entry.chunk_id in evidence,
                    },
                    "judgments": raters,
                    "unjudged": not in_golden and not raters,
                }
            )
        # the chunks the golden set does not judge first, each part in pool order; a judgment made on the
        # page does not move its chunk, so the rater's place in the list holds
        items.sort(key=lambda item: item["golden"]["judged"])
        no_answer = [_said(j) for j in said if j.label == NO_ANSWER and j.query == case.query]
        return {
            "caseId": case.id,
            "query": case.query,
            "knowledgeTag": case.knowledge_tag,
            "kind": label_case.kind,
            "k": pool.query.k,
            "matchOn": level,
            "expectNoAnswer": case.expect_no_answer,
            "noAnswer": no_answer,
            "terms": sorted(set(terms)),
            "variantErrors": pool.errors,
            "baselineReport": self.baseline_path if any(BASELINE in i["variants"] for i in items) else None,
            "items": items,
        }


def _said(j: Judgment) -> dict[str, Any]:
    out: dict[str, Any] = {"who": j.who, "at": j.at}
    if j.label is not None:
        out["label"] = j.label
    else:
        out["grade"] = j.grade
    return out
