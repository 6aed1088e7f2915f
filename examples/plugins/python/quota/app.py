# Build (from this folder): componentize-py -d ../../../../wit -w quota-stage componentize app -o quota.wasm
"""quota stage, "by plan": one bucket per project and plan, a cost per route group; projects
on an unlisted plan get the `free` limits, requests without a project are exempt.
Configuration (TOML):

    [plans.free]
    rate_per_second = 20
    burst = 100
    [plans.pro]
    rate_per_second = 500
    burst = 5000
    [costs]
    functions = 5
"""

import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.exports.quota import (
    QuotaDecision,
    QuotaDecision_Exempt,
    QuotaDecision_Limit,
    QuotaRequest,
    QuotaRule,
)
from wit_world.imports.log import Level, log
from wit_world.imports.types import Plane

U32_MAX = 0xFFFFFFFF

plans: dict[str, tuple[int, int]] = {}
costs: dict[str, int] = {}


def load(config: str) -> dict:
    try:
        value = json.loads(config) if config.strip() else {}
    except ValueError as e:
        raise Err(f"config: invalid JSON: {e}")
    if not isinstance(value, dict):
        raise Err("config: must be a table")
    return value


def u32(value, key: str, low: int, high: int = U32_MAX) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise Err(f"{key}: must be an integer between {low} and {high}")
    return value


class Quota(exports.Quota):
    def configure(self, plane: Plane, config: str) -> None:
        global plans, costs
        cfg = load(config)
        for key in cfg:
            if key not in ("plans", "costs"):
                raise Err(f"{key}: unknown key (expected plans, costs)")
        raw_plans, raw_costs = cfg.get("plans", {}), cfg.get("costs", {})
        if not isinstance(raw_plans, dict):
            raise Err("plans: must be a table of plans")
        if not isinstance(raw_costs, dict):
            raise Err("costs: must be a table of route group = cost")
        if "free" not in raw_plans:
            raise Err("plans.free is required")
        parsed = {}
        for name, limits in raw_plans.items():
            if not isinstance(limits, dict):
                raise Err(f"plans.{name}: must be a table with rate_per_second and burst")
            for key in limits:
                if key not in ("rate_per_second", "burst"):
                    raise Err(f"plans.{name}.{key}: unknown key")
            for key in ("rate_per_second", "burst"):
                if key not in limits:
                    raise Err(f"plans.{name}.{key} is required")
            parsed[name] = (
                u32(limits["rate_per_second"], f"plans.{name}.rate_per_second", 1),
                u32(limits["burst"], f"plans.{name}.burst", 1),
            )
        free_burst = parsed["free"][1]
        parsed_costs = {
            group: u32(cost, f"costs.{group}", 1, free_burst) for group, cost in raw_costs.items()
        }
        plans, costs = parsed, parsed_costs
        log(Level.INFO, f"configured: {len(plans)} plans, {len(costs)} costs")

    def decide(self, request: QuotaRequest) -> QuotaDecision:
        project = request.actor.project
        if project is None:
            return QuotaDecision_Exempt()
        plan = request.actor.plan or "free"
        rate, burst = plans.get(plan) or plans["free"]
        cost = min(costs.get(request.route_group, 1), burst)
        return QuotaDecision_Limit(
            QuotaRule(
                bucket=f"project:{project}:{plan}",
                rate_per_second=rate,
                burst=burst,
                cost=cost,
            )
        )
