"""Splitting a golden set for `sieve tune --holdout FRACTION` and `--folds K`: deterministic for a seed,
stratified by knowledge tag and case kind, a group's paraphrases always on one side (a paraphrase on both
sides would let the held-out part see what it is meant to check).

A split is a list of parts, each a list of case ids in file order: [tuning, held-out] for a holdout, the K
folds for folds. Every case is in exactly one part (drafts too: they ride along and are not scored).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from app.evaluation.golden.cases import GoldenCase
from app.evaluation.tune.model import FoldParts, FoldSplit, HoldoutParts, HoldoutSplit, Split

TUNING, HELD_OUT = "tuning", "heldOut"


class SplitError(ValueError):
    """A split that cannot be used (a fraction out of range, fewer than two folds, a part without a scored
    case); the message says which and what to change."""


def case_kind(case: GoldenCase) -> str:
    """`draft` (not scored), `noAnswer` (scored by its abstention only) or `answer`: a scored case, one whose
    recall, MRR and nDCG the figures average (a non-draft case that is not expectNoAnswer names a relevant
    result, the golden set's rules make sure of it)."""
    if case.draft:
        return "draft"
    return "noAnswer" if case.expect_no_answer else "answer"


@dataclass(frozen=True)
class Unit:
    """The cases that go to one side together: the paraphrases sharing a `group`, or one case without one.

    `stratum` = (knowledge tag or "", `case_kind`), the one most of its cases have (ties: the smaller)."""

    key: tuple[str, str]  # ("group", name) or ("case", id)
    ids: tuple[str, ...]  # in file order
    stratum: tuple[str, str]


def split_units(cases: Sequence[GoldenCase]) -> list[Unit]:
    """The units of `cases`, in the order of each one's first case."""
    members: dict[tuple[str, str], list[GoldenCase]] = {}
    for case in cases:
        key = ("group", case.group) if case.group is not None else ("case", case.id)
        members.setdefault(key, []).append(case)
    units = []
    for key, group in members.items():
        strata = Counter((c.knowledge_tag or "", case_kind(c)) for c in group)
        stratum = min(strata, key=lambda s: (-strata[s], s))
        units.append(Unit(key, tuple(c.id for c in group), stratum))
    return units


def assign_parts(units: Sequence[Unit], shares: Sequence[float], seed: int) -> list[list[str]]:
    """Deal whole units into parts whose target shares of the cases are `shares` (positive, summing to 1).

    Layout: the strata in order of (knowledge tag, kind), each stratum's units shuffled by
    `random.Random(f"{seed}|{tag}|{kind}")` from the order of their keys, then stably by size, largest
    first. Deal: in that order, each unit goes to the part p with the smallest (n_p + s / 2) / share_p,
    n_p being the cases p holds so far and s the unit's size (ties: the larger share, then the earlier
    part). That is the Sainte-Laguë divisor rule: every prefix of the layout is dealt close to the shares,
    so each stratum, a contiguous run of it, is too (implicit stratification, as in systematic sampling),
    small strata included. With s the largest unit's size and n a prefix's cases: two parts (a holdout of
    fraction f) hold f * n ± s / 2 held-out cases in every prefix, so every stratum of n cases holds
    f * n ± s; K equal parts (folds) differ by at most s cases in every prefix, so a fold holds n / K ±
    2 (K - 1) s / K cases of every stratum. The split depends on the seed and the cases, not on their order
    in the file."""
    by_stratum: dict[tuple[str, str], list[Unit]] = {}
    for unit in sorted(units, key=lambda u: u.key):
        by_stratum.setdefault(unit.stratum, []).append(unit)
    parts: list[list[str]] = [[] for _ in shares]
    held = [0] * len(shares)
    for stratum in sorted(by_stratum):
        dealt = by_stratum[stratum]
        random.Random(f"{seed}|{stratum[0]}|{stratum[1]}").shuffle(dealt)
        dealt.sort(key=lambda u: -len(u.ids))
        for unit in dealt:
            size = len(unit.ids)
            p = min(range(len(shares)), key=lambda i: ((held[i] + size / 2) / shares[i], -shares[i], i))
            held[p] += size
            parts[p].extend(unit.ids)
    return parts


def _in_file_order(cases: Sequence[GoldenCase], parts: list[list[str]]) -> list[list[str]]:
    position = {c.id: i for i, c in enumerate(cases)}
    return [sorted(part, key=position.__getitem__) for part in parts]


def holdout_split(cases: Sequence[GoldenCase], fraction: float, seed: int) -> list[list[str]]:
    """[tuning case ids, held-out case ids]: `assign_parts` with shares (1 - fraction, fraction)."""
    if not (math.isfinite(fraction) and 0 < fraction < 1):
        raise SplitError(f"a holdout fraction is between 0 and 1 (exclusive), got {fraction}")
    return _in_file_order(cases, assign_parts(split_units(cases), (1 - fraction, fraction), seed))


def fold_split(cases: Sequence[GoldenCase], k: int, seed: int) -> list[list[str]]:
    """K folds of case ids: `assign_parts` with K equal shares."""
    if k < 2:
        raise SplitError(f"folds: at least 2, got {k}")
    return _in_file_order(cases, assign_parts(split_units(cases), [1 / k] * k, seed))


def check_parts(
    cases: Sequence[GoldenCase], parts: list[list[str]], labels: list[str], advice: list[str]
) -> None:
    """A SplitError naming the first part without a scored case (see `case_kind`), with that part's
    `advice`: its figures would be undefined, so nothing could be recommended on it or checked on it."""
    scored = {c.id for c in cases if case_kind(c) == "answer"}
    for label, ids, fix in zip(labels, parts, advice, strict=True):
        if not scored.intersection(ids):
            units = sum(1 for u in split_units(cases) if scored.intersection(u.ids))
            raise SplitError(
                f"{label} has no scored case ({len(ids)} of {len(cases)} cases; the golden set has "
                f"{len(scored)} scored cases in {units} groups or single cases); {fix}"
            )


def check_split_flags(holdout: float | None, folds: int | None) -> None:
    """A SplitError for `--holdout` outside (0, 1), `--folds` below 2, or both given."""
    if holdout is not None and folds is not None:
        raise SplitError("give --holdout or --folds, not both")
    if holdout is not None and not (math.isfinite(holdout) and 0 < holdout < 1):
        raise SplitError(f"--holdout must be a fraction between 0 and 1 (exclusive), got {holdout}")
    if folds is not None and folds < 2:
        raise SplitError(f"--folds must be at least 2, got {folds}")


def make_split(
    cases: Sequence[GoldenCase], holdout: float | None, folds: int | None, seed: int
) -> Split | None:
    """The tune JSON's `split` for `--holdout` or `--folds` (None for neither): mode, seed, fraction or k,
    and the case ids of each part; a SplitError when a part has no scored case."""
    check_split_flags(holdout, folds)
    strata = ["knowledgeTag", "kind"]
    if holdout is not None:
        parts = holdout_split(cases, holdout, seed)
        check_parts(
            cases,
            parts,
            [f"--holdout {holdout}: the tuning part", f"--holdout {holdout}: the held-out part"],
            ["use a smaller fraction", "use a larger fraction"],
        )
        return HoldoutSplit(
            fraction=holdout,
            seed=seed,
            stratified_by=strata,
            groups_together=True,
            parts=HoldoutParts(tuning=parts[0], held_out=parts[1]),
        )
    if folds is not None:
        parts = fold_split(cases, folds, seed)
        check_parts(
            cases,
            parts,
            [f"--folds {folds}: fold {i} of {folds}" for i in range(1, folds + 1)],
            ["use fewer folds"] * folds,
        )
        return FoldSplit(
            k=folds, seed=seed, stratified_by=strata, groups_together=True, parts=FoldParts(folds=parts)
        )
    return None
