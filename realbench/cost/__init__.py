"""The cost model: time and memory of each call under each option, reallocation and data
transfer costs, and the dataflow simulator that turns a plan into time per iteration."""

from realbench.cost.calls import CallCost, call_cost
from realbench.cost.realloc import realloc_time, transfer_time
from realbench.cost.simulate import Estimator, PlanEstimate

__all__ = ["CallCost", "call_cost", "realloc_time", "transfer_time", "Estimator", "PlanEstimate"]
