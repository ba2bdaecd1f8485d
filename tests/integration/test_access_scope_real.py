"""Access scopes end to end on a real embedded Chroma with the packaged e5 (issue 43's done-when check): an
HR principal retrieves the HR salary document; a sales principal never sees it, not among the documents, the
raw candidates, the trace's ranked lists and search hits, the removals, the attached chunks, nor what the
fallback stage adds back. With the exact search on and off (`rag.store.exact_search_max_chunks: 0`), and with
the tag post-filter on and off (`rag.retrieval.tag_post_filter_max: 0`: Chroma's own `where` with
`$contains` on the stored access list)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.access.scope import ADMIN, Principal, may_read
from app.retrieval.types import RetrievalResult
from app.service import Sieve
from app.settings import RagSettings, Settings, load_settings, merge, nested

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
MODELS_CACHE = REPO / "target" / "models"

HR = Principal("hr", tenant="acme", groups=("hr",))
SALES = Principal("sales", tenant="acme", groups=("sales",))
HR_GLOBEX = Principal("hr-globex", tenant="globex", groups=("hr",))
SALARY_QUERY = "When are salaries paid and what are the salary bands?"

SALARY = """---
id: hr-salary
title: Salary bands and pay dates
knowledge: hr
tenant: acme
access: [group:hr]
---

# Salary bands and pay dates

## Pay dates

Salaries are paid on the 25th of every month. When the 25th falls on a weekend or a holiday, salaries are
paid on the working day before.

## Salary bands

Band A salaries run from 40,000 to 52,000 a year; band B from 52,000 to 68,000; band C from 68,000 to
90,000. A salary above its band needs the approval of the HR director.

## Salary reviews

Salaries are reviewed every April; a raise takes effect with the May salary payment.
"""
FILES = {
    "hr/salary.md": SALARY,
    # tenant and access from rag.ingest.access_defaults (the sales folder)
    "sales/commission.md": """---
id: sales-commission
title: Sales commission
---

Sales staff earn a commission of 3% on each closed deal, paid with the salary of the following month.
""",
    "sales/targets.md": """---
id: sales-targets
title: Quarterly targets
---

Each sales region sets quarterly revenue targets; salary bonuses depend on reaching them.
""",
    "public/holidays.md": """---
id: holidays
title: Public holidays
knowledge: hr
tenant: acme
access: public
---

The office is closed on public holidays; salaries due on a holiday are paid the working day before.
""",
    "public/canteen.md": """---
id: canteen
title: Canteen
tenant: acme
access: [public]
---

The canteen serves lunch from noon to two; the menu changes every week.
""",
    # the same group name in another tenant
    "globex/salary.md": """---
id: globex-salary
title: Globex salary dates
knowledge: hr
tenant: globex
access: [group:hr]
---

At Globex salaries are paid on the last working day of the month, and salary bands are published yearly.
""",
    # no scope: the admin only
    "unscoped/payroll-notes.md": """---
id: payroll-notes
title: Payroll notes
knowledge: hr
---

Payroll notes: the salary run is prepared on the 20th and checked by finance before the 25th.
""",
    # a comma-joined string is one entry that no principal holds
    "public/joined.md": """---
id: joined
title: Joined access
tenant: acme
access: "group:hr,group:sales"
---

Salary advance requests are sent to payroll before the 15th of the month.
""",
}


@pytest.fixture(scope="module", params=["exact", "hnsw"])
def sieve(request, tmp_path_factory: pytest.TempPathFactory, real_embedder) -> Iterator[Sieve]:
    """A Sieve opened as the server opens it (`Sieve.open`, the session's e5) over a fresh store, with the
    knowledge base above ingested; `hnsw`: the exact search off."""
    base = tmp_path_factory.mktemp(f"access-{request.param}")
    kb = base / "kb"
    for name, text in FILES.items():
        (kb / name).parent.mkdir(parents=True, exist_ok=True)
        (kb / name).write_text(text, encoding="utf-8")
    settings = load_settings(
        merge(
            nested("rag.store.path", str(base / "store")),
            nested("rag.store.exact_search_max_chunks", 30_000 if request.param == "exact" else 0),
            nested("rag.lexical.path", str(base / "lexical")),
            nested("rag.models.cache_dir", str(MODELS_CACHE)),
            nested("rag.ingest.paths", [str(kb)]),
            nested("rag.ingest.chunk_size", 200),
            nested("rag.ingest.chunk_overlap", 0),
            nested(
                "rag.ingest.access_defaults",
                [{"path": str(kb / "sales"), "tenant": "acme", "access": ["group:sales"]}],
            ),
            nested("rag.chain.rerank.enabled", False),
            nested("rag.evaluate.output_dir", str(base / "eval")),
        )
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("app.service.load_embedder", lambda models: real_embedder)
        opened = Sieve.open(settings)
    try:
        report = opened.ingest([kb])
        assert report.errors == [] and report.documents == len(FILES) and report.chunks > len(FILES)
        assert opened.store.exact_search_active is (request.param == "exact")
        yield opened
    finally:
        opened.close()


CHAINS: dict[str, dict[str, Any]] = {
    "default": {},
    # everything removed by the threshold, so the fallback adds back raw candidates
    "fallback": merge(
        nested("rag.chain.similarity_threshold.min_dense", 0.999),
        nested("rag.chain.fallback.min_results", 10),
    ),
}


def variant(base: Sieve, post_filter_max: int, chain: str) -> Sieve:
    """The same models, store and index with these chain settings."""
    overrides = merge(nested("rag.retrieval.tag_post_filter_max", post_filter_max), CHAINS[chain])
    rag = RagSettings.model_validate(merge(base.settings.rag.model_dump(), overrides["rag"]))
    return base.with_settings(Settings(rag=rag))


def every_chunk_id(result: RetrievalResult) -> set[str]:
    """Every chunk id the result names anywhere: documents and their attached chunks, raw candidates, the
    trace's ranked lists and search hits, each stage's removals and additions."""
    trace = result.trace
    ids = {c.chunk_id for d in result.documents for c in (d, *d.attached)}
    ids |= {c.chunk_id for c in result.raw_candidates}
    ids |= {i for ranked in trace.ranked_after.values() for i in ranked}
    ids |= {i for hits in trace.search_hits.values() for i in hits}
    ids |= {r.chunk_id for s in trace.stages for r in s.removed}
    ids |= {i for s in trace.stages for i in s.added}
    return ids


def metadata_of(sieve: Sieve, ids: set[str]) -> dict[str, dict[str, Any]]:
    found = sieve.store.chunks(sorted(ids))
    assert set(found) == ids
    return {i: c.metadata for i, c in found.items()}


@pytest.mark.parametrize("chain", ["default", "fallback"])
@pytest.mark.parametrize("post_filter_max", [4000, 0])
def test_hr_reads_the_salary_document_and_sales_sees_nothing_of_it(
    sieve: Sieve, post_filter_max: int, chain: str
) -> None:
    chain_sieve = variant(sieve, post_filter_max, chain)

    as_hr = chain_sieve.retrieve(SALARY_QUERY, 5, principal=HR)
    assert as_hr.documents[0].doc_id == "hr-salary"
    if chain == "default":  # its further chunks come attached (the fallback's refills carry none)
        assert as_hr.documents[0].attached
        assert {a.doc_id for a in as_hr.documents[0].attached} == {"hr-salary"}
    assert as_hr.trace.scope == {"name": "hr", "tenant": "acme", "readers": ["group:hr", "public"]}

    as_sales = chain_sieve.retrieve(SALARY_QUERY, 5, principal=SALES)
    seen = every_chunk_id(as_sales)
    docs = {str(m["doc_id"]) for m in metadata_of(sieve, seen).values()}
    assert docs == {"sales-commission", "sales-targets", "holidays", "canteen"}  # all it may read, none else
    assert all(may_read(SALES, m) for m in metadata_of(sieve, seen).values())
    assert {d.doc_id for d in as_sales.documents} <= docs
    if chain == "fallback":
        assert as_sales.fallback_used
        fallback = next(s for s in as_sales.trace.stages if s.name == "fallback")
        assert len(fallback.added) == len(as_sales.raw_candidates) > 0
        assert all(may_read(SALES, m) for m in metadata_of(sieve, set(fallback.added)).values())

    as_admin = chain_sieve.retrieve(SALARY_QUERY, 10, principal=ADMIN)
    admin_docs = {str(m["doc_id"]) for m in metadata_of(sieve, every_chunk_id(as_admin)).values()}
    assert admin_docs == {
        "hr-salary",
        "sales-commission",
        "sales-targets",
        "holidays",
        "canteen",
        "globex-salary",
        "payroll-notes",
        "joined",
    }


@pytest.mark.parametrize("post_filter_max", [4000, 0])
@pytest.mark.parametrize(
    ("principal", "readable"),
    [
        (HR, {"hr-salary", "holidays", "canteen"}),
        (HR_GLOBEX, {"globex-salary"}),
        (Principal("nobody", tenant="acme"), {"holidays", "canteen"}),
        (Principal("no-tenant", groups=("hr", "sales")), set()),
        (
            Principal("both", tenant="acme", groups=("hr", "sales")),
            {"hr-salary", "holidays", "canteen", "sales-commission", "sales-targets"},
        ),
    ],
)
def test_each_principal_gets_candidates_among_exactly_the_documents_it_may_read(
    sieve: Sieve, post_filter_max: int, principal: Principal, readable: set[str]
) -> None:
    result = variant(sieve, post_filter_max, "default").retrieve(SALARY_QUERY, 10, principal=principal)
    seen = every_chunk_id(result)
    assert {str(m["doc_id"]) for m in metadata_of(sieve, seen).values()} == readable


@pytest.mark.parametrize("post_filter_max", [4000, 0])
@pytest.mark.parametrize(
    ("principal", "readable"),
    [
        (HR, {"hr-salary", "holidays"}),
        (SALES, {"holidays"}),
        (ADMIN, {"hr-salary", "holidays", "globex-salary", "payroll-notes"}),
    ],
)
def test_a_knowledge_tag_and_a_scope_restrict_the_candidates_together(
    sieve: Sieve, post_filter_max: int, principal: Principal, readable: set[str]
) -> None:
    chain_sieve = variant(sieve, post_filter_max, "default")
    result = chain_sieve.retrieve(SALARY_QUERY, 10, knowledge_tag="hr", principal=principal)
    seen = every_chunk_id(result)
    assert {str(m["doc_id"]) for m in metadata_of(sieve, seen).values()} == readable
