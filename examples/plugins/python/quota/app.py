# Build (from this folder): componentize-py -d ../../../../wit -w quota-stage componentize app -o quota.wasm
"""quota stage, "by plan": one bucket per project, with its plan's limits and a cost per route
group; projects on an unlisted plan get the `free` limits, requests without a project are
exempt, and users whose token carries a denied claim value are refused (403 `claim_denied`).
The decision depends on the route group, the project, its plan and (with `deny_claims`) the
claims: that is what it declares. Configuration (TOML):

    [plans.free]
    rate_per_second = 20
    burst = 100
    [plans.pro]
    rate_per_second = 500
    burst = 5000
    [costs]
    functions = 5
    [deny_claims]          # optional: claim = the string value refused
    tier = "suspended"
"""

import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.exports.quota import (
    BucketScope_Project,
    DenyReason,
    DenyStatus,
    QuotaCache,
    QuotaDecision,
    QuotaDecision_Deny,
    QuotaDecision_Exempt,
    QuotaDecision_Limit,
    QuotaDenial,
    QuotaInputs,
    QuotaRequest,
    QuotaRule,
    QuotaSetup,
)
from wit_world.imports.log import Level, log
from wit_world.imports.types import Plane

U32_MAX = 0xFFFFFFFF
# The route groups the configuration may give a cost, by the names the gateway passes in
# `request.route_group`.
ROUTE_GROUPS = [
    "auth",
    "db",
    "storage",
    "functions",
    "realtime",
    "notifications",
    "ai",
    "provisioner",
    "control",
    "management",
    "gateway",
]
# The JSON Schema of the configuration, checked by the gateway before `configure` runs.
LIMITS = {
    "type": "object",
    "properties": {
        "rate_per_second": {"type": "integer", "minimum": 1, "maximum": U32_MAX},
        "burst": {"type": "integer", "minimum": 1, "maximum": U32_MAX},
    },
    "required": ["rate_per_second", "burst"],
    "additionalProperties": False,
}
SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "quota: by plan",
    "type": "object",
    "properties": {
        "plans": {
            "description": "Limits by plan; free is required and applies to unlisted plans.",
            "type": "object",
            "required": ["free"],
            "additionalProperties": LIMITS,
        },
        "costs": {
            "description": "Tokens one request of a route group takes (default 1).",
            "type": "object",
            "propertyNames": {"enum": ROUTE_GROUPS},
            "additionalProperties": {"type": "integer", "minimum": 1, "maximum": U32_MAX},
        },
        "deny_claims": {
            "description": "Users whose token has one of these claims with this value are refused.",
            "type": "object",
            "maxProperties": 8,
            "propertyNames": {"minLength": 1, "maxLength": 64},
            "additionalProperties": {"type": "string"},
        },
    },
    "required": ["plans"],
    "additionalProperties": False,
}
# How long a decision holds: a function of its declared inputs, so as long as the gateway keeps it.
MAX_AGE_MS = 300_000

plans: dict[str, tuple[int, int]] = {}
costs: dict[str, int] = {}
# (claim, value refused); the gateway passes a claim by its position in this list.
deny_claims: list[tuple[str, str]] = []


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
    def config_schema(self) -> str | None:
        return json.dumps(SCHEMA)

    def configure(self, plane: Plane, config: str) -> QuotaSetup:
        global plans, costs, deny_claims
        cfg = load(config)
        for key in cfg:
            if key not in ("plans", "costs", "deny_claims"):
                raise Err(f"{key}: unknown key (expected plans, costs, deny_claims)")
        raw_plans, raw_costs = cfg.get("plans", {}), cfg.get("costs", {})
        raw_claims = cfg.get("deny_claims", {})
        if not isinstance(raw_plans, dict):
            raise Err("plans: must be a table of plans")
        if not isinstance(raw_costs, dict):
            raise Err("costs: must be a table of route group = cost")
        if not isinstance(raw_claims, dict) or len(raw_claims) > 8:
            raise Err("deny_claims: must be a table of at most 8 claim = value")
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
        parsed_costs = {}
        for group, cost in raw_costs.items():
            if group not in ROUTE_GROUPS:
                raise Err(f"costs.{group}: not a route group")
            parsed_costs[group] = u32(cost, f"costs.{group}", 1, free_burst)
        for claim, value in raw_claims.items():
            if not isinstance(value, str):
                raise Err(f"deny_claims.{claim}: must be a string")
        plans, costs, deny_claims = parsed, parsed_costs, list(raw_claims.items())
        log(Level.INFO, f"configured: {len(plans)} plans, {len(costs)} costs")
        inputs = QuotaInputs.ROUTE_GROUP | QuotaInputs.PROJECT | QuotaInputs.PLAN
        if deny_claims:
            inputs |= QuotaInputs.CLAIMS
        return QuotaSetup(
            claims=[claim for claim, _ in deny_claims],
            headers=[],
            cache=QuotaCache(inputs=inputs, max_age_ms=MAX_AGE_MS),
        )

    def decide(self, request: QuotaRequest) -> QuotaDecision:
        # Each claim comes as JSON text, named by its position in the list `configure` answered.
        for claim in request.claims:
            _, refused = deny_claims[claim.name]
            if json.loads(claim.value) == refused:
                return QuotaDecision_Deny(
                    QuotaDenial(
                        status=DenyStatus.FORBIDDEN,
                        reason=DenyReason.CLAIM_DENIED,
                        retry_after_seconds=0,
                    )
                )
        if request.actor.project is None:
            return QuotaDecision_Exempt()
        plan = request.actor.plan or "free"
        rate, burst = plans.get(plan) or plans["free"]
        cost = min(costs.get(request.route_group, 1), burst)
        # The gateway names the bucket from the request: one per project.
        return QuotaDecision_Limit(
            QuotaRule(scope=BucketScope_Project(), rate_per_second=rate, burst=burst, cost=cost)
        )
