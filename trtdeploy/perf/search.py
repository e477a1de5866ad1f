"""``--find``: the highest concurrency (or request rate) at which a level meets the SLO, by doubling then bisection.

The search is a policy over verdicts: it proposes the next level's value, the run measures that level and tells
it whether the level met the SLO. It runs every value at most once, and as many levels as a doubling followed by
a bisection done by hand: for a highest concurrency N, 2 x log2(N) or so.
"""

from __future__ import annotations

from typing import Any

from ..errors import UsageError
from .slo import EXAMPLE, Slo

#: What --find can look for: the highest closed-loop concurrency, or the highest open-loop request rate.
FINDS = ("max-concurrency", "max-rate")
#: Doubling from the start (or halving, when the start fails) stops after this many steps: start x or / 1024.
MAX_STEPS = 10
#: Rates: the bisection stops once the lowest rate that failed is within this share above the highest that met.
RATE_PRECISION = 0.05


def check_search(find: str | None, slo: Slo | None) -> None:
    """Raise UsageError for a --find without the --slo it searches against."""
    if find is not None and slo is None:
        raise UsageError(
            f"--find {find} looks for the highest level that meets --slo", hint="pass --slo too, " + EXAMPLE
        )


class Search:
    """Doubling, then bisection, over levels whose verdicts come one at a time.

    From ``start``, while levels meet the SLO the value doubles (up to ``start`` x 2**MAX_STEPS, the ceiling); if
    the start fails, it halves instead (down to 1 for a concurrency; for a rate to ``start`` / 2**MAX_STEPS or
    ``lowest_rate``, whichever is higher) until a level meets it. Then it bisects between the highest value that met
    the SLO and the lowest above it that did not, until they are neighbours (concurrency) or within RATE_PRECISION
    (rates). The answer is the highest value that met the SLO; every value tried above it failed."""

    def __init__(self, find: str, start: float, *, lowest_rate: float = 0.0) -> None:
        self.find = find
        self.integer = find == "max-concurrency"
        self.start = start
        self.ceiling = start * 2**MAX_STEPS
        self.floor = 1 if self.integer else max(start / 2**MAX_STEPS, lowest_rate)
        #: Every value tried, in order, and whether its level met the SLO.
        self.tried: list[tuple[float, bool]] = []
        #: The highest value that met the SLO, and the lowest above it that did not.
        self.met: float | None = None
        self.failed: float | None = None

    def next_value(self) -> float | None:
        """The value of the next level to run; None when the search is over."""
        if not self.tried:
            return self.start
        if self.failed is None:  # every level so far met the SLO
            assert self.met is not None
            higher = self.met * 2
            return higher if higher <= self.ceiling else None
        if self.met is None:  # every level so far failed
            lower = self.failed // 2 if self.integer else self.failed / 2
            return lower if lower >= self.floor else None
        if self.integer:
            return (self.met + self.failed) // 2 if self.failed - self.met > 1 else None
        if self.failed <= self.met * (1 + RATE_PRECISION):
            return None
        middle = (self.met + self.failed) / 2
        rounded = float(f"{middle:.3g}")  # a readable rate where three digits tell it apart
        return rounded if self.met < rounded < self.failed else middle

    def record(self, value: float, met: bool) -> None:
        """The verdict of the level run at ``value`` (the last value :meth:`next_value` gave)."""
        self.tried.append((value, met))
        if met:
            self.met = value if self.met is None else max(self.met, value)
        else:
            self.failed = value if self.failed is None else min(self.failed, value)

    @property
    def found(self) -> float | None:
        """The highest value that met the SLO (None: none did)."""
        return self.met

    def summary(self) -> dict[str, Any]:
        """What the search found, for summary.json: ``level`` is the index of the found level among the run's
        levels (the search runs every level of its run)."""
        values = [value for value, _ in self.tried]
        return {
            "find": self.find,
            "start": self.start,
            "found": self.found,
            "level": values.index(self.found) if self.found is not None else None,
            "lowest_failed": self.failed,
            "ceiling_reached": self.failed is None and self.met is not None,
            "levels_run": len(self.tried),
        }
