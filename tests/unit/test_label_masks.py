"""LabelMasks: the masks the lexical index and the exact search filter by answer, label by label, what
`label_matches` answers (the one rule, `may_read`), whatever the labels, principals and order of growth."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from app.access.scope import Principal, chunk_label, label_matches
from app.store.types import LabelMasks

NAMES = ["acme", "globex", "", "hr", "sales", "a,b"]
ENTRIES = ["public", "group:hr", "group:sales", "user:alice", "group:hr,group:sales", "", 7]

metadata = st.fixed_dictionaries(
    {},
    optional={
        "tenant": st.one_of(st.none(), st.sampled_from(NAMES), st.integers(0, 2), st.booleans()),
        "access": st.one_of(
            st.none(),
            st.lists(st.sampled_from(ENTRIES), max_size=4),
            st.sampled_from(["public", "group:hr"]),  # a lone string: no list, admins only
        ),
    },
)
knowledge = st.one_of(st.none(), st.sampled_from(["finance", "hr", "audit"]))
labels_of = st.lists(st.tuples(knowledge, metadata), max_size=12).map(
    lambda pairs: [chunk_label(k, m) for k, m in pairs]
)
principals = st.one_of(
    st.none(),
    st.builds(
        Principal,
        name=st.just("p"),
        tenant=st.one_of(st.none(), st.sampled_from(NAMES)),
        groups=st.lists(st.sampled_from(["hr", "sales", "hr,sales", "ops"]), max_size=3).map(tuple),
        user=st.one_of(st.none(), st.sampled_from(["alice", "bob"])),
    ),
)


def expected(labels: list[Any], tag: str | None, principal: Principal | None) -> list[bool]:
    return [label_matches(label, tag, principal) for label in labels]


@settings(max_examples=300, deadline=None)
@given(
    first=labels_of,
    more=labels_of,
    asks=st.lists(
        st.tuples(st.one_of(st.none(), st.sampled_from(["finance", "hr", "nope"])), principals),
        min_size=1,
        max_size=4,
    ),
)
def test_every_mask_answers_as_label_matches_does_while_labels_are_added(first, more, asks):
    """Labels numbered in the order first seen (None, the unlabelled, is never one of them)."""
    labels: list[str] = []
    for label in first:
        if label is not None and label not in labels:
            labels.append(label)
    masks = LabelMasks()
    tail = [False, True]
    for tag, principal in asks:
        got = masks(labels, tag, principal, tail)
        assert got.tolist() == expected(labels, tag, principal) + tail
    for label in more:
        if label is not None and label not in labels:
            labels.append(label)
    for tag, principal in asks:  # extended, not remade
        got = masks(labels, tag, principal, tail)
        assert got.tolist() == expected(labels, tag, principal) + tail


def test_a_principal_reads_whole_entries_of_its_own_tenant_only():
    labels = [
        chunk_label(None, {"tenant": "acme", "access": ["group:hr"]}),
        chunk_label(None, {"tenant": "acme", "access": ["group:hr,group:sales"]}),  # one name, nobody's
        chunk_label(None, {"tenant": "globex", "access": ["group:hr"]}),
        chunk_label("finance", {"tenant": "acme", "access": ["public"]}),
        chunk_label(None, {"tenant": "acme", "access": []}),  # empty: admins only
        chunk_label(None, {"access": ["public"]}),  # no tenant: a principal without one
        chunk_label(None, {"tenant": 3, "access": ["public"]}),  # a tenant of another type: admins only
        "finance",  # a tag alone, no scope: admins only
    ]
    hr = Principal("hr", tenant="acme", groups=("hr", "sales"))
    nobody_tenant = Principal("anon")
    masks = LabelMasks()
    assert masks(labels, None, hr, [False]).tolist() == [True, False, False, True] + [False] * 5
    assert masks(labels, "finance", hr, [False]).tolist() == [False, False, False, True] + [False] * 5
    assert masks(labels, None, nobody_tenant, []).tolist() == [False] * 5 + [True, False, False]
    assert masks(labels, "finance", None, []).tolist() == [False, False, False, True] + [False] * 3 + [True]
