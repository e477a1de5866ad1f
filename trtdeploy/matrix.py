"""The build matrix: precisions x batch sizes x TP x PP x (input, output) lengths, one deployment per point.

Every point is planned before anything runs; points that cannot work (fp8 on an A100, more GPUs than there are, a
model that does not fit) are collected with their reasons instead of failing one build in.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from .build import BuildRequest, Plan, plan
from .errors import TrtDeployError, UsageError


@dataclass(frozen=True)
class Matrix:
    """The values of each axis; None in an axis means "the default" (the engine's or the GPU profile's)."""

    precisions: tuple[str | None, ...] = (None,)
    max_batch_sizes: tuple[int | None, ...] = (None,)
    tps: tuple[int, ...] = (1,)
    pps: tuple[int, ...] = (1,)
    lengths: tuple[tuple[int | None, int | None], ...] = ((None, None),)

    def points(self, base: BuildRequest) -> list[BuildRequest]:
        """One request per combination, in a stable order (precision, batch, tp, pp, lengths)."""
        combos = itertools.product(self.precisions, self.max_batch_sizes, self.tps, self.pps, self.lengths)
        several_lengths = len(self.lengths) > 1
        return [
            replace(
                base,
                variant=f"isl{isl}-osl{osl}" if several_lengths else base.variant,
                precision=precision,
                max_batch_size=batch,
                tp=tp,
                pp=pp,
                max_input_len=isl if isl is not None else base.max_input_len,
                max_output_len=osl if osl is not None else base.max_output_len,
            )
            for precision, batch, tp, pp, (isl, osl) in combos
        ]


def parse_lengths(text: str) -> tuple[tuple[int, int], ...]:
    """``2048:1024,4096:512`` -> ((2048, 1024), (4096, 512))."""
    pairs = []
    for item in text.split(","):
        isl, sep, osl = item.strip().partition(":")
        if not sep or not isl.isdigit() or not osl.isdigit() or int(isl) < 1 or int(osl) < 1:
            raise UsageError(
                f"--isl-osl: {item.strip()!r} is not INPUT:OUTPUT", hint="e.g. --isl-osl 2048:1024,1024:512"
            )
        pairs.append((int(isl), int(osl)))
    return tuple(pairs)


@dataclass(frozen=True)
class Rejected:
    request: BuildRequest
    error: TrtDeployError

    @property
    def reason(self) -> str:
        return self.error.message

    @property
    def label(self) -> str:
        r = self.request
        lengths = f"{r.max_input_len}:{r.max_output_len}" if r.max_input_len or r.max_output_len else "default lengths"
        return f"{r.precision or 'default precision'} bs{r.max_batch_size or '-'} tp{r.tp}pp{r.pp} {lengths}"


def plan_all(
    requests: list[BuildRequest], *, dry_run: bool = False, skip_invalid: bool = False
) -> tuple[list[Plan], list[Rejected]]:
    """Plan every point. A single point's error is raised as it is; in a matrix every point that cannot be built is
    listed in one UsageError, or, with ``skip_invalid``, returned beside the plans of the others."""
    plans: list[Plan] = []
    rejected: list[Rejected] = []
    for request in requests:
        try:
            plans.append(plan(request, dry_run=dry_run))
        except TrtDeployError as exc:
            rejected.append(Rejected(request, exc))
    if not plans and not rejected:
        raise UsageError("the matrix has no points")
    if rejected and len(requests) == 1:
        raise rejected[0].error
    if rejected and not skip_invalid:
        raise UsageError(
            f"{len(rejected)} of {len(requests)} matrix points cannot be built (nothing was built)",
            hint="fix or drop them, or pass --skip-invalid to build the rest",
            details="\n".join(f"  {r.label}: {r.reason}" for r in rejected),
        )
    return plans, rejected
