"""The experiment's verdict: the detectable difference (arithmetic), the ceiling, the Pareto front."""

from __future__ import annotations

import math

import pytest

from app.experiment.verdict import ceiling, detectable_difference, pareto_front

Z = 1.959963984540054 + 0.8416212335729143  # z_{0.975} + z_{0.8}


def test_detectable_difference_is_z_sum_times_sd_over_sqrt_n() -> None:
    diffs = [0.0, 0.5, -0.5, 1.0]
    mean = (0.0 + 0.5 - 0.5 + 1.0) / 4
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (4 - 1))
    assert detectable_difference(diffs) == pytest.approx(Z * sd / math.sqrt(4), rel=1e-12)


def test_detectable_difference_of_sixty_four_cases_with_sd_one_half() -> None:
    # 32 cases +0.5 and 32 cases -0.5: mean 0, sd = sqrt(64 * 0.25 / 63)
    diffs = [0.5] * 32 + [-0.5] * 32
    sd = math.sqrt(64 * 0.25 / 63)
    assert detectable_difference(diffs) == pytest.approx(Z * sd / 8, rel=1e-12)
    assert detectable_difference(diffs) == pytest.approx(0.1764, abs=1e-4)


def test_detectable_difference_follows_alpha_and_power() -> None:
    diffs = [1.0, 0.0, 0.0, 0.0]
    sd = math.sqrt((0.75**2 + 3 * 0.25**2) / 3)
    z = 2.5758293035489 + 1.2815515655446004  # z_{0.995} + z_{0.9}
    assert detectable_difference(diffs, alpha=0.01, power=0.9) == pytest.approx(z * sd / 2, rel=1e-9)


@pytest.mark.parametrize("diffs", [[], [0.3]])
def test_detectable_difference_needs_two_differences(diffs: list[float]) -> None:
    assert detectable_difference(diffs) is None


def test_detectable_difference_of_identical_runs_is_zero() -> None:
    assert detectable_difference([0.0, 0.0, 0.0]) == 0.0


def test_ceiling_counts_the_cases_at_one() -> None:
    top = ceiling([1.0, 1.0, 1.0, 0.5, 1.0])
    assert (top.at_one, top.cases, top.share) == (4, 5, 4 / 5)
    assert top.warning("ndcg", 0.8) is not None
    assert "4 of 5" in (top.warning("ndcg", 0.8) or "")
    assert top.warning("ndcg", 0.9) is None
    assert ceiling([]).warning("ndcg", 0.8) is None


def test_pareto_front_keeps_what_no_other_point_beats_on_all_three() -> None:
    points = {
        "base": (0.90, 30.0, 2600.0),
        "better-and-cheaper": (0.92, 25.0, 2000.0),  # dominates base
        "best-quality": (0.95, 60.0, 4000.0),  # nobody is better on quality
        "dominated": (0.91, 40.0, 3000.0),  # better-and-cheaper beats it on all three
        "same-as-best": (0.95, 60.0, 4000.0),  # equal points do not dominate each other
    }
    assert pareto_front(points) == {"better-and-cheaper", "best-quality", "same-as-best"}


def test_a_missing_figure_counts_as_the_worst() -> None:
    assert pareto_front({"a": (0.9, None, 100.0), "b": (0.9, 10.0, 100.0)}) == {"b"}
    assert pareto_front({"a": (None, 1.0, 1.0), "b": (0.1, 1.0, 1.0)}) == {"b"}
