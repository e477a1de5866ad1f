"""Capacity planning from measured curves: the replicas, GPUs and pods a target load needs under an SLO, a
simulation of that fleet behind load balancers, and the HPA target per replica (:func:`recommend_hpa`)."""

from .curves import MeasuredLevel, ReplicaCurve, SloUnmet, read_curve
from .plan import DEFAULT_HEADROOM, HpaTarget, Plan, Simulated, SweepPlan, hpa_target, plan, plan_runs, recommend_hpa
from .simulate import BALANCING, Load

__all__ = [
    "BALANCING",
    "DEFAULT_HEADROOM",
    "HpaTarget",
    "Load",
    "MeasuredLevel",
    "Plan",
    "ReplicaCurve",
    "Simulated",
    "SloUnmet",
    "SweepPlan",
    "hpa_target",
    "plan",
    "plan_runs",
    "read_curve",
    "recommend_hpa",
]
