"""Which report an evaluation is compared with (`rag.evaluate.baseline`), and the files that keep it.

In `rag.evaluate.output_dir`, beside the timestamped reports and `<prefix>-latest.json`:

* `<prefix>-passing.json`: the last passing baseline, a copy written atomically after a run that passed its
  gate on a valid golden set AND is not worse than that baseline: on the cases both runs scored, none of
  Recall, HitRate, MRR and nDCG (the means at K) is lower than the baseline's by more than
  `rag.evaluate.baseline_tolerance` (default 0), nor the share of paired no-answer cases that abstained
  (cases paired as the comparison pairs them). So a run of small drops, each too small to fail the gate,
  never walks the baseline down: each is measured against the same, better baseline. A run whose gate
  failed, a broken golden set's ("invalid") report, or a worse run never replaces it; the report's
  `baselineUpdate` and the log say why, and `sieve baseline accept [FILE]` makes a run the baseline on
  purpose.
* `<prefix>-pinned.json`: a copy of the report pinned with `sieve baseline pin FILE`, until
  `sieve baseline unpin`.

Both are whole copies, so pruning the timestamped reports (`keep_reports`) never takes away what they
need; the pruning pattern matches timestamped names only.

Resolution, by `rag.evaluate.baseline`:

* "previous-passing" (the default): the pinned report, else the last passing one, else no baseline, with a
  note saying why. A pinned report that cannot be used is an error (the user chose it); a last passing
  report that cannot be used is a baseline that cannot be used (`Baseline.error`): the run fails as not
  checked, and the baseline stays.
* "previous": `<prefix>-latest.json` as it is before this run. When it cannot be used (a broken golden
  set's report, a damaged file), the newest usable timestamped report, and the note says so; when none
  is, the run fails as not checked.
* "none": no comparison.
* a path: that report, which must be usable.

An unusable configured or pinned report raises `BaselineError` naming the file.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean

from app.evaluation.compare.comparison import BaselineError, abstentions, load_report, scored_figures
from app.evaluation.compare.pairing import pair
from app.evaluation.report.model import BaselineUpdate, Report, report_text
from app.evaluation.scoring import measures
from app.files import atomic_write_text
from app.settings import EvaluateSettings

log = logging.getLogger("sieve.evaluation")

PREVIOUS_PASSING = "previous-passing"
PREVIOUS = "previous"
NONE = "none"

KIND_PINNED = "pinned"
KIND_PASSING = "last passing"
KIND_PREVIOUS = "previous"
KIND_FILE = "configured file"


@dataclass
class Baseline:
    """The report this run is compared with (None: no comparison, `note` says why). `kind` is how it was
    chosen: pinned, last passing, previous, configured file (None without a report). `error`: there is a
    baseline but it cannot be used (the file and what is wrong), so the run cannot be checked: it fails as
    not checked rather than pass without a comparison."""

    report: Report | None
    path: str | None
    note: str
    kind: str | None = None
    error: str | None = None


def latest_report_path(settings: EvaluateSettings) -> Path:
    return Path(settings.output_dir) / f"{settings.report_prefix}-latest.json"


def passing_report_path(settings: EvaluateSettings) -> Path:
    return Path(settings.output_dir) / f"{settings.report_prefix}-passing.json"


def pinned_report_path(settings: EvaluateSettings) -> Path:
    return Path(settings.output_dir) / f"{settings.report_prefix}-pinned.json"


def resolve_baseline(settings: EvaluateSettings) -> Baseline:
    """The baseline `rag.evaluate.baseline` names, as the module docstring says."""
    choice = settings.baseline
    if choice == NONE:
        return Baseline(None, None, "rag.evaluate.baseline is none")
    if choice == PREVIOUS_PASSING:
        return _previous_passing(settings)
    if choice == PREVIOUS:
        return _previous(settings)
    return Baseline(load_report(choice), choice, f"configured report {choice}", KIND_FILE)


def _previous_passing(settings: EvaluateSettings) -> Baseline:
    pinned = pinned_report_path(settings)
    if pinned.exists():
        try:
            report = load_report(pinned)
        except BaselineError as exc:
            raise BaselineError(
                f"{exc} (the pinned baseline; `sieve baseline unpin` removes the pin)"
            ) from None
        return Baseline(report, str(pinned), f"pinned report {pinned}", KIND_PINNED)
    passing = passing_report_path(settings)
    if not passing.exists():
        return Baseline(
            None,
            None,
            f"no passing report yet: no run in {passing.parent} has passed its gate on a valid golden set "
            f"({passing.name} is written after one does; `sieve baseline pin FILE` pins a report)",
        )
    try:
        report = load_report(passing)
    except BaselineError as exc:
        log.error("[RetrievalEval] the last passing report cannot be used as the baseline: %s", exc)
        return Baseline(None, None, f"the last passing report is not usable: {exc}", error=str(exc))
    path = _own_copy(passing, report)
    return Baseline(report, str(path), f"last passing report {path}", KIND_PASSING)


def _previous(settings: EvaluateSettings) -> Baseline:
    latest = latest_report_path(settings)
    if not latest.exists():
        return Baseline(None, None, f"no previous report at {latest} (first run)")
    try:
        report = load_report(latest)
    except BaselineError as exc:
        log.warning("[RetrievalEval] previous report not used as baseline: %s", exc)
        older = newest_usable_report(settings)
        if older is None:
            note = (
                f"the previous report is not usable ({exc}), and no older timestamped report in "
                f"{latest.parent} is"
            )
            return Baseline(None, None, note, error=note)
        path, report = older
        return Baseline(
            report,
            str(path),
            f"previous report {path}: the newest usable one ({latest.name} is not usable: {exc})",
            KIND_PREVIOUS,
        )
    # name the previous run by its own timestamped copy (the -latest file is about to be replaced)
    path = _own_copy(latest, report)
    return Baseline(report, str(path), f"previous report {path}", KIND_PREVIOUS)


def _own_copy(path: Path, report: Report) -> Path:
    """The report's own timestamped file beside `path` when it is still there, else `path`."""
    own = path.parent / str(report.run.report_file or "")
    return own if own != path.parent and own.is_file() else path


def timestamped_reports(settings: EvaluateSettings) -> list[Path]:
    """`<prefix>-<YYYYmmddTHHMMSSZ>.json` in the output folder, newest first."""
    out = Path(settings.output_dir)
    if not out.is_dir():
        return []
    pattern = re.compile(rf"^{re.escape(settings.report_prefix)}-\d{{8}}T\d{{6}}Z\.json$")
    return sorted((p for p in out.iterdir() if pattern.match(p.name) and p.is_file()), reverse=True)


def newest_usable_report(settings: EvaluateSettings) -> tuple[Path, Report] | None:
    """The newest timestamped report that `load_report` accepts (an evaluated run, well formed)."""
    for path in timestamped_reports(settings):
        try:
            return path, load_report(path)
        except BaselineError:
            continue
    return None


def baseline_update(
    report: Report, settings: EvaluateSettings, gate_passed: bool, baseline: Baseline | None = None
) -> BaselineUpdate:
    """Whether `report` may replace the last passing baseline (the module docstring's rule), and why.
    Decided before the files are written, so the report carries it. `baseline` is the one the run was
    compared with: when it is the last passing report, it is not read again."""
    if report.status != "ok":
        return BaselineUpdate(promoted=False, reason="the golden set is invalid: nothing was evaluated")
    if not gate_passed:
        return BaselineUpdate(promoted=False, reason="the gate failed")
    if not settings.write_json:
        return BaselineUpdate(
            promoted=False, reason="rag.evaluate.write_json is false: no report file to keep"
        )
    path = passing_report_path(settings)
    if not path.exists():
        return BaselineUpdate(promoted=True, reason="the first passing run")
    if baseline is not None and baseline.kind == KIND_PASSING and baseline.report is not None:
        current = baseline.report
    else:
        try:
            current = load_report(path)
        except BaselineError as exc:
            return BaselineUpdate(promoted=True, reason=f"the last passing report is not usable ({exc})")
    worse = worse_than(current, report, settings.baseline_tolerance)
    if worse:
        return BaselineUpdate(
            promoted=False,
            reason=f"worse than the last passing baseline {_evaluated(current)}: {'; '.join(worse)} "
            f"(rag.evaluate.baseline_tolerance {settings.baseline_tolerance:g})",
        )
    return BaselineUpdate(
        promoted=True, reason=f"not worse than the last passing baseline {_evaluated(current)}"
    )


def worse_than(baseline: Report, report: Report, tolerance: float) -> list[str]:
    """How `report` is worse than `baseline` beyond `tolerance`, one phrase per measure (empty: it is not).
    Over the cases paired as the comparison pairs them (`pairing.pair`: by id then content, at the common
    K), the mean of each gated measure (`measures.GATED`) and the share of paired no-answer cases that
    abstained; a run that cannot be set beside the baseline (nothing paired) counts as worse, saying why."""
    pairing = pair(baseline, report)
    before, after = scored_figures(pairing.baseline, pairing.current)
    no_answer, abstained_before, abstained_after = abstentions(pairing)
    if not before and not no_answer:
        return ["no case is paired with the baseline"]
    rows = [
        (
            name,
            [float(f[name]) for f in before.values()],
            [float(f[name]) for f in after.values()],
            "paired cases",
        )
        for name in (measures.GATED if before else ())
    ]
    if no_answer:
        rows.append(
            (
                "correctAbstention",
                list(abstained_before.values()),
                list(abstained_after.values()),
                "paired no-answer cases",
            )
        )
    out = []
    for name, b_values, a_values, what in rows:
        b, a = fmean(b_values), fmean(a_values)
        if b - a > tolerance + 1e-12:
            out.append(f"{name} {b:.3f} -> {a:.3f} ({a - b:+.3f} over {len(b_values)} {what})")
    return out


def _evaluated(report: Report) -> str:
    return f"(evaluated {report.run.evaluated_at or report.run.started_at or '?'})"


def record_passing(report: Report, settings: EvaluateSettings, update: BaselineUpdate) -> Path | None:
    """After a run: copy `report` to `<prefix>-passing.json` (atomically) when `update` promotes it;
    otherwise leave the baseline as it is. Returns the path written, or None."""
    if not update.promoted:
        return None
    return _write_passing(report, settings)


def _write_passing(report: Report, settings: EvaluateSettings) -> Path:
    path = passing_report_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, report_text(report))
    return path


def accept(source: str | Path | None, settings: EvaluateSettings) -> tuple[Path, Report, Path]:
    """Make a report the last passing baseline on purpose (`sieve baseline accept [FILE]`), whatever its
    gate said and however it compares: `source`, or the latest report when None. It must be a usable report
    (`load_report`; BaselineError naming it otherwise). Returns the passing path, the report and the file
    it was read from."""
    path = Path(source) if source is not None else latest_report_path(settings)
    report = load_report(path)
    return _write_passing(report, settings), report, path


def pin(source: str | Path, settings: EvaluateSettings) -> tuple[Path, Report]:
    """Check `source` is a usable report (`load_report`; BaselineError naming it otherwise) and copy its
    bytes to `<prefix>-pinned.json`, atomically. Returns the pinned path and the report."""
    report = load_report(source)
    text = Path(source).read_text(encoding="utf-8")
    path = pinned_report_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)
    return path, report


def unpin(settings: EvaluateSettings) -> Path | None:
    """Remove the pinned report; returns its path, or None when nothing was pinned."""
    path = pinned_report_path(settings)
    if not path.exists():
        return None
    path.unlink()
    return path


def report_line(path: Path) -> str:
    """One line about a report file for `sieve baseline show`: evaluated when, status, gate, nDCG; or why
    it cannot be read."""
    if not path.exists():
        return "none"
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        return f"{path} (cannot be read: {exc})"
    if not isinstance(report, dict):
        return f"{path} (not a report)"
    run = _object(report.get("run"))
    when = run.get("evaluatedAt") or run.get("startedAt") or "?"
    status = report.get("status")
    parts = [f"evaluated {when}"]
    if status != "ok":
        parts.append(f"status {status!r}: nothing was evaluated")
    else:
        parts.append("gate passed" if _object(report.get("gate")).get("passed") else "gate FAILED")
        ndcg = _object(report.get("summary")).get("ndcg")
        if isinstance(ndcg, int | float):
            parts.append(f"nDCG {ndcg:.3f}")
    return f"{path} ({', '.join(parts)})"


def _object(value: object) -> dict[str, object]:
    """A JSON object of a report file as it was read, or {} for any other value."""
    return value if isinstance(value, dict) else {}


def show(settings: EvaluateSettings) -> list[str]:
    """What `sieve baseline show` prints: the setting, the candidate files and the report the next run
    would be compared with, with the reason. Raises BaselineError when that report cannot be used."""
    lines = [
        f"rag.evaluate.baseline: {settings.baseline}",
        f"pinned: {report_line(pinned_report_path(settings))}",
        f"last passing: {report_line(passing_report_path(settings))}",
        f"latest: {report_line(latest_report_path(settings))}",
    ]
    baseline = resolve_baseline(settings)
    if baseline.report is None:
        lines.append(f"next run: no baseline: {baseline.note}")
    else:
        lines.append(f"next run compares with: {baseline.note}")
    if settings.baseline != PREVIOUS_PASSING and pinned_report_path(settings).exists():
        lines.append("note: the pinned report is used only with rag.evaluate.baseline: previous-passing")
    return lines
