"""Meshes, strategies, feasible options per call, scenarios and plans (files and schemas)."""

from realbench.plan.mesh import Mesh, Option, Strategy, all_meshes, mesh_problem, parse_mesh
from realbench.plan.options import enumerate_options, option_problem
from realbench.plan.scenario import Scenario, load_scenario, scenario_from_document
from realbench.plan.plan import Origin, Placement, Plan, load_plan, plan_from_options, resolve_plan, scenario_ref
from realbench.plan.builtin import BUILTIN, PAPER_LIKE, get_builtin

__all__ = ["Mesh", "Option", "Strategy", "all_meshes", "mesh_problem", "parse_mesh", "enumerate_options",
           "option_problem", "Scenario", "load_scenario", "scenario_from_document", "Origin", "Placement",
           "Plan", "load_plan", "plan_from_options", "resolve_plan", "scenario_ref", "BUILTIN", "PAPER_LIKE", "get_builtin"]
