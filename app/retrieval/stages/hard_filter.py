"""hard_filter: business rules a candidate must pass whatever its score."""

from __future__ import annotations

import functools
from datetime import date, datetime
from typing import Any

from app.retrieval.stages._common import ReplayFacts, Rule
from app.retrieval.types import Candidate, QueryContext, Removal, StageOutcome
from app.settings import HardFilterSettings


class HardFilterStage:
    """Applies the rules in this order; the first one a candidate fails is its removal reason.

    1. knowledge tag: when the query names one, the candidate's tag must equal it (`knowledge=hr != finance`);
    2. status: not in `excluded_statuses`, compared case-insensitively (`status=retired`);
    3. effective dates (if `check_effective_dates`): metadata `effectiveFrom` <= today <= `effectiveTo`, both
       inclusive, either may be absent; an ISO date or datetime, else removed as unparseable
       (`effectiveTo=2023-12-31 < today=2024-05-01`, `effectiveFrom unparseable: 'soon'`);
    4. source: not in `denied_sources`, exact match (`source=wiki.md denied`);
    5. text: at least `min_text_chars` characters once stripped (`text 12 chars < 20`).

    Rules 2-4 hide a document from every reader, whatever the query; `withheld` names which of them
    applies, in words that do not identify the document, for the API's debug view.
    """

    name = "hard_filter"
    # what `withheld` names, `reason` (or a rule of the same meaning) removes: rules 2-4 are both's
    removes_withheld = True

    def __init__(self, settings: HardFilterSettings, rule: Rule | None = None):
        # HardFilterSettings rejects blank rule entries at load time.
        self.settings = settings
        self._excluded = {status.strip().casefold() for status in settings.excluded_statuses}
        self._denied = set(settings.denied_sources)
        # what `run` asks of each candidate: `reason`, or a rule of the same meaning (see `replay_facts`)
        self.rule: Rule = rule if rule is not None else self.reason

    def replay_facts(self) -> ReplayFacts:
        """It only drops candidates, each by `reason`, a function of the settings, the query's tag and date
        and the candidate."""
        return ReplayFacts(
            rule=self.rule,
            rule_key=self.name,
            with_rule=lambda rule: HardFilterStage(self.settings, rule),
        )

    def reason(self, query: QueryContext, candidate: Candidate) -> str | None:
        """Why `candidate` must go, or None when it passes every rule."""
        if query.knowledge_tag is not None and candidate.knowledge_tag != query.knowledge_tag:
            shown = candidate.knowledge_tag if candidate.knowledge_tag is not None else "(none)"
            return f"knowledge={shown} != {query.knowledge_tag}"
        meta = candidate.metadata
        status = meta.get("status")
        if status not in (None, "") and str(status).strip().casefold() in self._excluded:
            return f"status={status}"
        # (without either date key there is no date to break a rule: `_date_reason` would say None)
        if self.settings.check_effective_dates and ("effectiveFrom" in meta or "effectiveTo" in meta):
            dated = _date_reason(meta, query.today)
            if dated:
                return dated[0]
        if self._denied and candidate.source in self._denied:
            return f"source={candidate.source} denied"
        if self.settings.min_text_chars > 0:  # every length is >= 0
            length = len(candidate.text.strip())
            if length < self.settings.min_text_chars:
                return f"text {length} chars < {self.settings.min_text_chars}"
        return None

    def withheld(self, query: QueryContext, candidate: Candidate) -> str | None:
        """Why `candidate`'s document is hidden from readers (rules 2-4, whichever stage removed it), as a
        kind that names no document: `status=draft`, `not yet effective`, `no longer effective`,
        `effective date unparseable`, `source denied`; None when none of those rules applies. The
        knowledge-tag and text-length rules hide nothing: another tag finds the document, and a short text
        is no secret."""
        meta = candidate.metadata
        status = meta.get("status")
        if status not in (None, "") and str(status).strip().casefold() in self._excluded:
            return f"status={str(status).strip().casefold()}"
        if self.settings.check_effective_dates and ("effectiveFrom" in meta or "effectiveTo" in meta):
            dated = _date_reason(meta, query.today)
            if dated:
                return dated[1]
        if self._denied and candidate.source in self._denied:
            return "source denied"
        return None

    def run(self, query: QueryContext, candidates: list[Candidate]) -> StageOutcome:
        kept: list[Candidate] = []
        removed: list[Removal] = []
        for candidate in candidates:
            why = self.rule(query, candidate)
            if why is None:
                kept.append(candidate)
            else:
                removed.append(Removal(candidate.chunk_id, candidate.doc_id, why))
        return StageOutcome(kept=kept, removed=removed)


class _Unparseable(ValueError):
    pass


def _date_reason(metadata: dict[str, Any], today: date) -> tuple[str, str] | None:
    """(the removal's reason, its kind for `withheld`) when the dates rule removes the chunk, else None."""
    start, end = metadata.get("effectiveFrom"), metadata.get("effectiveTo")
    try:
        return _dates_rule(start, end, today)
    except TypeError:  # an unhashable value (not from a store): decided without the memo
        return _dates_rule.__wrapped__(start, end, today)


# A pure function of a few values that recur across the candidates and queries of one day (every chunk of a
# document carries its dates; the rule is asked once per candidate and again per removal, `withheld`); the
# values' types are part of the key, so `1` and `True` keep their own reasons.
@functools.lru_cache(maxsize=4096, typed=True)
def _dates_rule(start_value: Any, end_value: Any, today: date) -> tuple[str, str] | None:
    """`_date_reason` of the metadata values `effectiveFrom` = `start_value`, `effectiveTo` = `end_value`."""
    bounds: dict[str, date | None] = {}
    for key, value in (("effectiveFrom", start_value), ("effectiveTo", end_value)):
        try:
            bounds[key] = _parse_date(value)
        except _Unparseable:
            return f"{key} unparseable: {value!r}", "effective date unparseable"
    start, end = bounds["effectiveFrom"], bounds["effectiveTo"]
    if start is not None and start > today:
        return f"effectiveFrom={start.isoformat()} > today={today.isoformat()}", "not yet effective"
    if end is not None and end < today:
        return f"effectiveTo={end.isoformat()} < today={today.isoformat()}", "no longer effective"
    return None


def _parse_date(value: Any) -> date | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, datetime):
        return value.date()
    if isinstance(value, date):
        return value
    if isinstance(value, str):
        text = value.strip()
        try:
            return date.fromisoformat(text)
        except ValueError:
            pass
        try:
            return datetime.fromisoformat(text).date()
        except ValueError:
            pass
    raise _Unparseable(value)
