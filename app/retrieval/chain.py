"""The retrieval chain (`rag.chain`): candidates, then each configured stage in order, then the cut to topK.

One `RetrievalChain` object serves the API, the CLI and the evaluation, so what the evaluation measures is
exactly what users get. Every stage's decisions land in the trace: counts, removed ids with reasons, time.
The class carries the name of its config key: it is a chain of stages, not only a filter (rerank orders,
diversity reorders, fallback adds back).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Protocol

import numpy as np

from app.access.scope import Principal
from app.retrieval.candidates import CandidateGenerator, CandidateSet
from app.retrieval.types import (
    Candidate,
    QueryContext,
    RetrievalResult,
    RetrievalTrace,
    Stage,
    StageOutcome,
    StageTrace,
    Withholding,
)


class QueryEmbedder(Protocol):
    def embed_queries(self, texts: list[str]) -> np.ndarray: ...


@dataclass
class ChainStage:
    stage: Stage
    enabled: bool

    @property
    def name(self) -> str:
        return self.stage.name


@dataclass(frozen=True)
class RetrievalRequest:
    query: str
    top_k: int
    knowledge_tag: str | None = None
    # whose scope the candidates are taken in (`app.access.scope`); None or the admin: every chunk
    principal: Principal | None = None


class RetrievalChain:
    def __init__(
        self,
        embedder: QueryEmbedder,
        candidates: CandidateGenerator,
        stages: list[ChainStage],
        copy_raw: bool = True,
    ):
        """`copy_raw=False`: the stages get the raw candidates themselves rather than copies, for stages
        known never to write into a candidate (the registry's own, `build_stages`, which copy a candidate
        to score it): the copies only cost time then (84 a query on SciFact)."""
        self.embedder = embedder
        self.candidates = candidates
        self.stages = stages
        self.copy_raw = copy_raw

    @property
    def stage_names(self) -> list[str]:
        return [s.name for s in self.stages]

    def retrieve(
        self, query: str, top_k: int, knowledge_tag: str | None = None, principal: Principal | None = None
    ) -> RetrievalResult:
        result = self.retrieve_many([RetrievalRequest(query, top_k, knowledge_tag, principal)])[0]
        if isinstance(result, BaseException):
            raise result
        return result

    def retrieve_many(
        self,
        requests: Sequence[RetrievalRequest],
        today: date | None = None,
        on_result: Callable[[int, RetrievalResult | Exception], None] | None = None,
    ) -> list[RetrievalResult | Exception]:
        """Run several queries: one embedding batch and one store call per knowledge tag, then the
        stages per query. Batching changes no result: each query still sees exactly its own candidates.
        A query whose stages raise yields its exception in place of a result; the others go on."""
        if not requests:
            return []
        start = time.perf_counter()
        embeddings = self.embedder.embed_queries([r.query for r in requests])
        embedded_at = time.perf_counter()
        sets = self.candidates.generate_many(
            [r.query for r in requests],
            np.asarray(embeddings),
            [r.knowledge_tag for r in requests],
            [r.principal for r in requests],
        )
        shared_ms = (time.perf_counter() - start) * 1000 / len(requests)
        candidates_ms = (time.perf_counter() - embedded_at) * 1000 / len(requests)
        withholding = self._withholding()  # once a batch: a check against a Protocol is slow
        out: list[RetrievalResult | Exception] = []
        for request, cset in zip(requests, sets, strict=True):
            try:
                out.append(
                    self._run(
                        request,
                        cset,
                        shared_ms,
                        candidates_ms,
                        today or date.today(),
                        self.copy_raw,
                        withholding,
                    )
                )
            except Exception as exc:  # one bad query must not sink a batch (the evaluation runs many)
                out.append(exc)
            if on_result is not None:
                on_result(len(out) - 1, out[-1])
        return out

    def run_stages(
        self, request: RetrievalRequest, cset: CandidateSet, today: date, copy_raw: bool | None = None
    ) -> RetrievalResult:
        """The stages alone over candidates generated before (the replay of `sieve tune`): no model or
        store call, the same code path as `retrieve_many` after its candidate generation.

        `copy_raw=False` hands the stages the raw candidates themselves instead of copies: only for stages
        known never to write into a candidate (the registry's own, which copy a candidate to score it);
        None: the chain's own `copy_raw`."""
        return self._run(request, cset, 0.0, 0.0, today, self.copy_raw if copy_raw is None else copy_raw)

    def _run(
        self,
        request: RetrievalRequest,
        cset: CandidateSet,
        shared_ms: float,
        candidates_ms: float,
        today: date,
        copy_raw: bool = True,
        withholding: list[Withholding] | None = None,
    ) -> RetrievalResult:
        """One query's candidates through every stage in order, each one's decisions into the trace, then
        the cut to its top_k. `withholding`: `_withholding()`, when the caller has it already."""
        begin = time.perf_counter()
        raw = list(cset.candidates)
        ctx = QueryContext(
            text=request.query, knowledge_tag=request.knowledge_tag, today=today, raw_candidates=raw
        )
        trace = RetrievalTrace(
            candidates_ms=round(candidates_ms, 3),
            candidate_origins=dict(cset.origins),
            search_hits=dict(cset.search_hits),
            scope=None if request.principal is None else request.principal.describe(),
        )
        trace.ranked_after["candidates"] = [c.chunk_id for c in raw]
        current: list[Candidate] = [_copy(c) for c in raw] if copy_raw else list(raw)
        fallback_used = False
        for item in self.stages:
            if item.enabled:
                outcome, stage_trace = _run_stage(item, ctx, current)
                fallback_used = fallback_used or bool(outcome.added)
                current = outcome.kept
            else:
                stage_trace = _disabled(item, current)
            trace.stages.append(stage_trace)
            trace.ranked_after[item.name] = [c.chunk_id for c in current]
        rules = self._withholding() if withholding is None else withholding
        trace.withheld = _withheld(ctx, trace, raw, rules)
        latency = shared_ms + (time.perf_counter() - begin) * 1000
        return RetrievalResult(
            query=request.query,
            documents=current[: request.top_k],
            original_count=len(raw),
            fallback_used=fallback_used,
            trace=trace,
            latency_ms=round(latency, 3),
            raw_candidates=raw,
        )

    def _withholding(self) -> list[Withholding]:
        """The enabled stages whose rules hide documents from readers (`Withholding`), in chain order."""
        return [s.stage for s in self.stages if s.enabled and isinstance(s.stage, Withholding)]


def _withheld(
    ctx: QueryContext, trace: RetrievalTrace, raw: list[Candidate], rules: list[Withholding]
) -> dict[str, str]:
    """The removed chunks whose documents an enabled withholding stage (`rules`) hides from readers, with
    its kind. Asked of every removal, not only that stage's own: a stage before it (similarity_threshold)
    may remove a draft document's chunk first."""
    if not rules:
        return {}
    by_id = {c.chunk_id: c for c in raw}
    # A stage that removes every candidate it would withhold (`Withholding`, `removes_withheld`) withholds
    # none of those it kept, so they are not asked of it again: most removals come after the hard filter
    # (the diversity stage's), of candidates it kept.
    passed = [
        set(trace.ranked_after.get(getattr(rule, "name", ""), ()))
        if getattr(rule, "removes_withheld", False)
        else None
        for rule in rules
    ]
    withheld: dict[str, str] = {}
    for stage in trace.stages:
        for removal in stage.removed:
            chunk_id = removal.chunk_id
            candidate = by_id.get(chunk_id)
            if candidate is None or chunk_id in withheld:
                continue
            for rule, kept in zip(rules, passed, strict=True):
                if kept is not None and chunk_id in kept:
                    continue
                kind = rule.withheld(ctx, candidate)
                if kind is not None:
                    withheld[chunk_id] = kind
                    break
    return withheld


def _run_stage(
    item: ChainStage, ctx: QueryContext, current: list[Candidate]
) -> tuple[StageOutcome, StageTrace]:
    """What an enabled stage did to `current`, and its trace (counts, removals with reasons, time); its
    removals are also recorded in `ctx` for the stages after it."""
    t0 = time.perf_counter()
    outcome = item.stage.run(ctx, current)
    elapsed = (time.perf_counter() - t0) * 1000
    ctx.removed_by_stage[item.name] = list(outcome.removed)
    stage_trace = StageTrace(
        name=item.name,
        input_count=len(current),
        output_count=len(outcome.kept),
        removed=list(outcome.removed),
        added=[c.chunk_id for c in outcome.added],
        latency_ms=round(elapsed, 3),
        score_key=outcome.score_key,
        skipped=outcome.skipped,
        model_inputs=outcome.model_inputs,
    )
    return outcome, stage_trace


def _disabled(item: ChainStage, current: list[Candidate]) -> StageTrace:
    """The trace of a stage switched off in config: it passed `current` through untouched."""
    return StageTrace(
        item.name,
        len(current),
        len(current),
        [],
        [],
        0.0,
        skipped="disabled in config",
        enabled=False,
    )


def _copy(c: Candidate) -> Candidate:
    # stages write scores into candidates; keep the raw list (fallback's refill source) untouched
    return c.with_scores(dict(c.scores))
