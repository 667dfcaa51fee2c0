"""The planner: cheapest allocation plan that meets a deadline (static, naive-elastic, greedy, optimal)."""

from rubberband.plan.budget import plan_for_budget
from rubberband.plan.compile import compile_plan, fastest_plan, plan_allocation
from rubberband.plan.plan import Plan, check_plan, simulate_plan
from rubberband.plan.policies import (
           POLICIES,
           Candidate,
           get_policy,
           static_allocation,
)
from rubberband.plan.search import pareto_front
from rubberband.plan.table import StageTable, valid_allocations
from rubberband.plan.variants import VariantTable
from rubberband.plan.whatif import Scenario, saving, whatif
from rubberband.plan.zones import plan_zones

__all__ = ["POLICIES", "Candidate", "Plan", "StageTable", "check_plan", "compile_plan", "fastest_plan", "get_policy", "plan_allocation", "simulate_plan",
           "pareto_front", "static_allocation", "valid_allocations", "Scenario", "saving", "whatif",
           "VariantTable", "plan_zones", "plan_for_budget"]
