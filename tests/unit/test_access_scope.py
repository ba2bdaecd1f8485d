"""The read rule and its helpers (app/access/scope.py): `may_read` as a table, the checks of a document's
`tenant` and `access`, the store's `where` for a scope, the index labels, and the property that a label
answers for a principal exactly as `may_read` does over the metadata it was made of."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from app.access.scope import (
    ADMIN,
    AccessFieldError,
    Label,
    Principal,
    and_where,
    checked_access,
    checked_tenant,
    chunk_label,
    label_knowledge,
    label_matches,
    may_read,
    parse_label,
    scope_fields,
    scope_where,
)
from app.retrieval.types import RetrievalResult, RetrievalTrace
from app.retrieve_response import retrieve_response

HR_ACME = Principal("hr-acme", tenant="acme", groups=("hr",))
SALES_ACME = Principal("sales-acme", tenant="acme", groups=("sales",))
HR_NO_TENANT = Principal("hr", groups=("hr",))
BOTH_GROUPS = Principal("both", groups=("hr", "sales"))
COMMA_GROUP = Principal("comma", groups=("hr,sales",))
ANN = Principal("ann", user="ann")
NOBODY = Principal("nobody")


@pytest.mark.parametrize(
    ("principal", "metadata", "expected"),
    [
        # the admin reads everything, scoped or not
        (ADMIN, {}, True),
        (ADMIN, {"tenant": "acme", "access": ["group:hr"]}, True),
        # tenant and group
        (HR_ACME, {"tenant": "acme", "access": ["group:hr"]}, True),
        (SALES_ACME, {"tenant": "acme", "access": ["group:hr"]}, False),
        (HR_ACME, {"tenant": "globex", "access": ["group:hr"]}, False),
        (HR_NO_TENANT, {"access": ["group:hr"]}, True),
        (HR_NO_TENANT, {"tenant": "acme", "access": ["group:hr"]}, False),  # chunk's tenant, principal none
        (HR_ACME, {"access": ["group:hr"]}, False),  # principal's tenant, chunk none
        (HR_NO_TENANT, {"tenant": None, "access": ["group:hr"]}, True),
        (HR_NO_TENANT, {"tenant": 7, "access": ["group:hr"]}, False),  # a tenant of another type
        # no usable access list: the admin only
        (HR_NO_TENANT, {}, False),
        (NOBODY, {"tenant": "acme"}, False),
        (NOBODY, {"access": []}, False),
        (NOBODY, {"access": None}, False),
        (NOBODY, {"access": "public"}, False),  # a string is not a list, even one naming a reader
        (BOTH_GROUPS, {"access": "group:hr,group:sales"}, False),
        (BOTH_GROUPS, {"access": ["group:hr,group:sales"]}, False),  # one entry, matched whole
        (BOTH_GROUPS, {"access": ["group:sales"]}, True),
        # a group literally named "hr,sales" is one group
        (COMMA_GROUP, {"access": ["group:hr"]}, False),
        (COMMA_GROUP, {"access": ["group:sales"]}, False),
        (COMMA_GROUP, {"access": ["group:hr,group:sales"]}, False),
        (COMMA_GROUP, {"access": ["group:hr,sales"]}, True),
        # users
        (ANN, {"access": ["user:ann"]}, True),
        (ANN, {"access": ["user:bob"]}, False),
        (NOBODY, {"access": ["user:ann"]}, False),
        (ANN, {"access": ["ann"]}, False),
        (ANN, {"access": ["group:ann"]}, False),
        # public: everyone of the tenant
        (NOBODY, {"access": ["public"]}, True),
        (HR_ACME, {"tenant": "acme", "access": ["public"]}, True),
        (HR_ACME, {"access": ["public"]}, False),
        (NOBODY, {"access": ("public",)}, True),
        (NOBODY, {"access": [1, "public"]}, True),
        (NOBODY, {"access": [1, 2]}, False),
    ],
)
def test_may_read(principal: Principal, metadata: dict[str, Any], expected: bool) -> None:
    assert may_read(principal, metadata) is expected


def test_a_principal_reads_under_public_its_groups_and_its_user() -> None:
    principal = Principal("p", tenant="acme", groups=("hr", "sales"), user="ann")
    assert principal.readers == {"public", "group:hr", "group:sales", "user:ann"}
    assert principal.describe() == {
        "name": "p",
        "tenant": "acme",
        "readers": ["group:hr", "group:sales", "public", "user:ann"],
    }
    assert ADMIN.describe() == {"name": "admin", "admin": True}
    assert ADMIN.key is None
    assert Principal("other", tenant="acme", groups=("sales", "hr"), user="ann").key == principal.key


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("group:hr", ["group:hr"]),
        ("group:hr,group:sales", ["group:hr,group:sales"]),  # a lone string is one entry, never split
        (["group:hr", "public", "group:hr"], ["group:hr", "public"]),
        (("user:ann",), ["user:ann"]),
        ([], None),
    ],
)
def test_checked_access(value: Any, expected: list[str] | None) -> None:
    assert checked_access(value) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (5, "'access' must be a list of strings, got int"),
        ({"group": "hr"}, "'access' must be a list of strings, got dict"),
        (["public", 3], "'access' entry 1 must be a string, got int"),
        (["public", None], "'access' entry 1 must be a string, got NoneType"),
        ([""], "'access' entry 0 is empty"),
        (["   "], "'access' entry 0 is empty"),
        ([" group:hr"], "'access' entry 0 ' group:hr' has spaces around it"),
        (["x" * 201], "'access' entry 0 is longer than 200 characters"),
        ([f"user:{i}" for i in range(257)], "'access' holds 257 entries, more than 256"),
        (["\ud800"], "'access' entry 0 is not valid Unicode"),
    ],
)
def test_checked_access_refuses(value: Any, message: str) -> None:
    with pytest.raises(AccessFieldError) as caught:
        checked_access(value)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, None), ("acme", "acme"), ("x" * 200, "x" * 200)],
)
def test_checked_tenant(value: Any, expected: str | None) -> None:
    assert checked_tenant(value) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (3, "'tenant' must be a string, got int"),
        (["acme"], "'tenant' must be a string, got list"),
        ("", "'tenant' is empty"),
        ("acme ", "'tenant' 'acme ' has spaces around it"),
        ("x" * 201, "'tenant' is longer than 200 characters"),
    ],
)
def test_checked_tenant_refuses(value: Any, message: str) -> None:
    with pytest.raises(AccessFieldError) as caught:
        checked_tenant(value)
    assert str(caught.value) == message


def test_scope_fields_checks_both_and_gives_none_for_what_is_absent() -> None:
    assert scope_fields({"tenant": "acme", "access": "public", "other": 1}) == {
        "tenant": "acme",
        "access": ["public"],
    }
    assert scope_fields({}) == {"tenant": None, "access": None}
    assert scope_fields({"access": []}) == {"tenant": None, "access": None}


@pytest.mark.parametrize(
    ("principal", "where"),
    [
        (ADMIN, None),
        (NOBODY, {"access": {"$contains": "public"}}),
        (
            HR_NO_TENANT,
            {"$or": [{"access": {"$contains": "group:hr"}}, {"access": {"$contains": "public"}}]},
        ),
        (
            Principal("p", tenant="acme", groups=("hr",), user="ann"),
            {
                "$and": [
                    {"tenant": "acme"},
                    {
                        "$or": [
                            {"access": {"$contains": "group:hr"}},
                            {"access": {"$contains": "public"}},
                            {"access": {"$contains": "user:ann"}},
                        ]
                    },
                ]
            },
        ),
        (Principal("t", tenant="acme"), {"$and": [{"tenant": "acme"}, {"access": {"$contains": "public"}}]}),
    ],
)
def test_scope_where(principal: Principal, where: dict[str, Any] | None) -> None:
    assert scope_where(principal) == where


def test_and_where_joins_the_clauses_present() -> None:
    tag, scope = {"knowledge": "hr"}, {"access": {"$contains": "public"}}
    assert and_where(None, None) is None
    assert and_where(tag, None) == tag
    assert and_where(None, scope) == scope
    assert and_where(tag, scope) == {"$and": [tag, scope]}


@pytest.mark.parametrize(
    ("knowledge", "metadata", "label"),
    [
        (None, {}, Label(None, None, None)),
        ("hr", {}, Label("hr", None, None)),
        ("hr", {"tenant": "acme"}, Label("hr", "acme", None)),
        (None, {"access": ["user:b", "group:a"]}, Label(None, None, ("group:a", "user:b"))),
        ("hr", {"tenant": "acme", "access": ["public"]}, Label("hr", "acme", ("public",))),
        ("it", {"access": "group:hr,group:sales"}, Label("it", None, None)),  # not a list: no access list
        ("hr", {"tenant": "歡迎", "access": ["group:人事"]}, Label("hr", "歡迎", ("group:人事",))),
    ],
)
def test_a_label_gives_back_the_tag_and_the_scope_it_was_made_of(
    knowledge: str | None, metadata: dict[str, Any], label: Label
) -> None:
    made = chunk_label(knowledge, metadata)
    assert parse_label(made) == label
    assert label_knowledge(made) == knowledge


def test_an_unscoped_chunk_is_labelled_by_its_tag_alone() -> None:
    assert chunk_label("hr", {"doc_id": "d"}) == "hr"
    assert chunk_label(None, {"doc_id": "d"}) is None


# -- the labels answer as may_read does ---------------------------------------------------------------------

NAMES = ["public", "group:hr", "group:sales", "group:hr,group:sales", "user:ann", "user:bob", "hr"]
TENANTS = ["acme", "globex", "", "\x00unusable"]

tenants = st.one_of(st.none(), st.sampled_from(TENANTS), st.integers(0, 3), st.text(max_size=4))
access_values = st.one_of(
    st.none(),
    st.sampled_from(NAMES),
    st.lists(st.one_of(st.sampled_from(NAMES), st.integers(0, 3), st.text(max_size=4)), max_size=4),
    st.tuples(st.sampled_from(NAMES)),
)


@st.composite
def metadata(draw: st.DrawFn) -> dict[str, Any]:
    out: dict[str, Any] = {"doc_id": "d"}
    if draw(st.booleans()):
        out["tenant"] = draw(tenants)
    if draw(st.booleans()):
        out["access"] = draw(access_values)
    return out


principals = st.one_of(
    st.just(ADMIN),
    st.builds(
        Principal,
        name=st.just("p"),
        tenant=st.one_of(st.none(), st.sampled_from([t for t in TENANTS if t]), st.text(max_size=4)),
        groups=st.lists(st.sampled_from(["hr", "sales", "hr,sales"]), max_size=3).map(tuple),
        user=st.one_of(st.none(), st.sampled_from(["ann", "bob"])),
    ),
)
knowledge_tags = st.one_of(st.none(), st.sampled_from(["hr", "it"]))


@given(metadata(), principals, knowledge_tags, knowledge_tags)
# a tenant of another type is unusable, whatever the principal's tenant (the label once wrote it as the
# string "\x00unusable", which a principal configured with that tenant then read)
@example({"tenant": 7, "access": ["public"]}, Principal("p", tenant="\x00unusable"), None, None)
def test_a_label_matches_exactly_when_may_read_does_and_the_tag_is_the_chunks(
    meta: dict[str, Any], principal: Principal, knowledge: str | None, asked: str | None
) -> None:
    label = chunk_label(knowledge, meta)
    assert label_matches(label, None, principal) == may_read(principal, meta)
    assert label_matches(label, asked, principal) == (
        (asked is None or asked == knowledge) and may_read(principal, meta)
    )
    assert label_matches(label, asked, None) == (asked is None or asked == knowledge)


# -- the answer's debug view ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("principal", "debug", "shown"),
    [
        (
            HR_ACME,
            True,
            {"name": "hr-acme", "admin": False, "tenant": "acme", "readers": ["group:hr", "public"]},
        ),
        (ADMIN, True, {"name": "admin", "admin": True, "tenant": None, "readers": []}),
        (HR_ACME, False, None),
        (None, True, None),
    ],
)
def test_the_debug_answer_names_the_scope_and_an_unscoped_answer_has_no_scope_key(
    principal: Principal | None, debug: bool, shown: dict[str, Any] | None
) -> None:
    trace = RetrievalTrace(scope=None if principal is None else principal.describe())
    result = RetrievalResult("q", [], 0, False, trace, 1.0)
    body = json.loads(retrieve_response(result, debug=debug).model_dump_json())
    assert body.get("scope") == shown
    assert ("scope" in body) is (shown is not None)
