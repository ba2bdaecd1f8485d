"""Which baseline case each current case is compared with, and at which K: the pairing every comparison
(`compare_reports`) and the baseline's promotion check (`baselines.worse_than`) stand on.

The rules, in order:

1. **By id, then by content.** A case pairs with the baseline case of the same id. A current case whose id
   the baseline lacks, but whose `caseSha256` (the case's content, its id left out) matches exactly one
   baseline case that has no partner, is that case renamed: paired, and listed as renamed.
2. **A case whose own topK changed is a changed case**, listed and left out of the pairing. A case carries
   its own topK when its K differs from its run's K; when both sides use their run's K, a different K is
   the run's, not the case's (rule 3).
3. **At a common K.** When the two runs' K differ, each pair is compared at the smaller K: the side with the
   longer list is cut to it (the report keeps each case's ranking, so its figures are recomputed from the
   ranked documents; a depth-10 list holds the depth-5 list). The comparison says so in `notes`.
4. **Leaving the scoring is a removal.** A paired case the baseline scored (figures at K) that has none now
   (its expected ids went stale, every expectation is gone, or it failed) is not paired: it is listed in
   `left_scoring` with the reason, for the gate's `removed_cases`.

A no-answer case pairs as any other; its figure is whether it abstained.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from app.evaluation.report.model import CaseRecord, ChangedCase, RankedDocument, RenamedCase, Report
from app.evaluation.scoring import measures, metrics
from app.evaluation.scoring.measures import Ranking
from app.evaluation.scoring.metrics import Gain, Rank, match_key

# what the gate names as the way back for a case that left the scoring
WAY_BACK = (
    "`sieve golden check` says where a stale id's text went (and `sieve golden anchor` rewrites it); retire "
    "the case with a reason in the golden set's `retired` list if it is gone on purpose"
)


@dataclass
class Pairing:
    """The two runs' cases side by side. `baseline` and `current` map a current case id to the records
    compared (a renamed case's baseline record under its current id; both cut to the common K when the
    runs' K differ); `paired` lists those ids in order. `only_in_baseline` / `only_in_current` are the
    cases of one run only (renamed ones excluded), `baseline_by_id` every baseline case under the id the
    current run knows it by. `k` is the runs' K the pairs are compared at (the smaller one; a case with its
    own topK keeps it)."""

    baseline: dict[str, CaseRecord] = field(default_factory=dict)
    current: dict[str, CaseRecord] = field(default_factory=dict)
    paired: list[str] = field(default_factory=list)
    renamed: list[RenamedCase] = field(default_factory=list)
    changed: list[ChangedCase] = field(default_factory=list)
    left_scoring: dict[str, str] = field(default_factory=dict)
    only_in_baseline: list[str] = field(default_factory=list)
    only_in_current: list[str] = field(default_factory=list)
    baseline_by_id: dict[str, CaseRecord] = field(default_factory=dict)
    k: int | None = None
    notes: list[str] = field(default_factory=list)


def pair(baseline: Report, current: Report) -> Pairing:
    """Pair the cases of `current` with those of `baseline` by the module docstring's rules."""
    b_cases = {c.case.id: c for c in baseline.cases}
    c_cases = {c.case.id: c for c in current.cases}
    renamed = _renamed(b_cases, c_cases)
    by_id = {**b_cases}
    for r in renamed:
        by_id[r.id] = by_id.pop(r.baseline_id)
    out = Pairing(
        renamed=renamed,
        only_in_baseline=sorted(set(by_id) - set(c_cases)),
        only_in_current=sorted(set(c_cases) - set(by_id)),
        baseline_by_id=by_id,
    )
    b_k, c_k = baseline.run.k, current.run.k
    gain_b: Gain = _gain(baseline)
    gain_c: Gain = _gain(current)
    cut: Counter[tuple[str, int, int]] = Counter()
    for i in sorted(set(by_id) & set(c_cases)):
        before, now = by_id[i], c_cases[i]
        kb, kc = before.resolved.top_k, now.resolved.top_k
        if kb != kc and (kb != b_k or kc != c_k):
            out.changed.append(ChangedCase(id=i, reason=f"its own topK changed: {kb} -> {kc}"))
            continue
        if kb > kc:
            before = at_cut(before, kc, gain_b)
            cut["baseline", kb, kc] += 1
        elif kc > kb:
            now = at_cut(now, kb, gain_c)
            cut["current", kc, kb] += 1
        left = left_scoring(before, now)
        if left is not None:
            out.left_scoring[i] = left
            continue
        out.baseline[i], out.current[i] = before, now
        out.paired.append(i)
    out.notes = [
        f"compared at K={k}: the {side} run's lists (K={longer}) cut to K={k} for {n} paired case(s)"
        for (side, longer, k), n in sorted(cut.items())
    ]
    out.k = min(b_k, c_k) if b_k is not None and c_k is not None else None
    return out


def _gain(report: Report) -> Gain:
    return "exponential" if report.run.gain == "exponential" else "linear"


def _renamed(b_cases: Mapping[str, CaseRecord], c_cases: Mapping[str, CaseRecord]) -> list[RenamedCase]:
    """Current cases with a new id whose content hash matches exactly one baseline case left without a
    partner (and no other new case claims it): the same case renamed."""
    b_by_sha = _by_content(b_cases, [i for i in b_cases if i not in c_cases])
    c_by_sha = _by_content(c_cases, [i for i in c_cases if i not in b_cases])
    out = []
    for sha, ids in sorted(c_by_sha.items()):
        olds = b_by_sha.get(sha, [])
        if len(ids) == 1 and len(olds) == 1:
            out.append(RenamedCase(id=ids[0], baseline_id=olds[0]))
    return sorted(out, key=lambda r: r.id)


def _by_content(cases: Mapping[str, CaseRecord], ids: list[str]) -> dict[str, list[str]]:
    """`ids` grouped by their case's `caseSha256` (cases without one left out)."""
    out: dict[str, list[str]] = {}
    for i in ids:
        sha = cases[i].case.case_sha256
        if sha:
            out.setdefault(sha, []).append(i)
    return out


def left_scoring(before: CaseRecord, now: CaseRecord) -> str | None:
    """Why a case the baseline scored has no figures now, or None when it still has them (or the
    baseline had none either, or it is a no-answer case)."""
    if before.scores.metrics is None or now.scores.metrics is not None:
        return None
    if now.case.expect_no_answer:
        return "it became a no-answer case"
    if now.outcome.error is not None:
        return f"it failed: {now.outcome.error}"
    if now.resolved.unscorable:
        return now.resolved.unscorable
    if now.resolved.missing_from_index:
        shown = ", ".join(now.resolved.missing_from_index[:5])
        return f"its expected ids are not in the index ({shown})"
    return "no relevant document is expected any more"


def rank_of(document: RankedDocument, match_on: str) -> Rank:
    """What a recorded rank is matched on (as the run matched it): its key at the case's level, and at
    chunk level its attached chunks too (own id first)."""
    if match_on == "chunk" and document.attached:
        return (document.chunk_id, *document.attached)
    return match_key(document, match_on)


def at_cut(record: CaseRecord, k: int, gain: Gain) -> CaseRecord:
    """`record` as if its run had stopped at K = `k` (<= its own K): its ranking cut, its compared
    measures recomputed from the ranked documents (`measures.COMPARED`, each the best over the case's
    alternatives as the run scored them), its condensed figures from the judged ranks of the cut list
    (a rank is judged unless the run listed it as unjudged), Judged@K and the unjudged ids of the cut."""
    ranked = record.outcome.ranked_documents[:k]
    ranks = [rank_of(d, record.resolved.match_on) for d in ranked]
    maps = record.resolved.alternatives or [record.resolved.expected]
    unjudged = set(record.scores.unjudged)
    judged = {i for r in ranks for i in metrics.rank_ids(r)[:1] if i not in unjudged}
    scores = record.scores.model_copy(
        update={
            "unjudged": [i for i in record.scores.unjudged if i in {metrics.rank_ids(r)[0] for r in ranks}],
            "judged": metrics.judged_at_k(ranks, judged, k),
        }
    )
    if record.scores.metrics is not None and metrics.has_relevant_alternative(maps):
        kept = metrics.condensed(ranks, judged)
        scores = scores.model_copy(
            update={
                "metrics": measures.table(Ranking(ranks, maps, k, gain=gain), measures.COMPARED),
                "condensed": measures.table(Ranking(kept, maps, k, gain=gain), measures.RANKING),
            }
        )
    return record.model_copy(
        update={
            "resolved": record.resolved.model_copy(update={"top_k": k}),
            "outcome": record.outcome.model_copy(update={"ranked_documents": ranked}),
            "scores": scores,
        }
    )
