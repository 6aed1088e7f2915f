// Build (from this folder): componentize-js --wit ../../../../wit --world-name quota-stage --disable http fetch-event --out quota.wasm plugin.js
//
// quota stage, "by plan": one bucket per project, with its plan's limits and a cost per route
// group; projects on an unlisted plan get the `free` limits, requests without a project are
// exempt, and users whose token carries a denied claim value are refused (403 `claim_denied`).
// The decision depends on the route group, the project, its plan and (with `deny_claims`) the
// claims: that is what it declares. Configuration (TOML):
//   [plans.free]
//   rate_per_second = 20
//   burst = 100
//   [plans.pro]
//   rate_per_second = 500
//   burst = 5000
//   [costs]
//   functions = 5
//   [deny_claims]          # optional: claim = the string value refused
//   tier = "suspended"

import { log } from "aura:gateway/log@0.5.0";

const U32_MAX = 0xffffffff;
// The route groups the configuration may give a cost, by the names the gateway passes in
// `request.routeGroup`.
const ROUTE_GROUPS = [
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
];
// The JSON Schema of the configuration, checked by the gateway before `configure` runs.
const LIMITS = {
  type: "object",
  properties: {
    rate_per_second: { type: "integer", minimum: 1, maximum: U32_MAX },
    burst: { type: "integer", minimum: 1, maximum: U32_MAX },
  },
  required: ["rate_per_second", "burst"],
  additionalProperties: false,
};
const SCHEMA = {
  $schema: "https://json-schema.org/draft/2020-12/schema",
  title: "quota: by plan",
  type: "object",
  properties: {
    plans: {
      description: "Limits by plan; free is required and applies to unlisted plans.",
      type: "object",
      required: ["free"],
      additionalProperties: LIMITS,
    },
    costs: {
      description: "Tokens one request of a route group takes (default 1).",
      type: "object",
      propertyNames: { enum: ROUTE_GROUPS },
      additionalProperties: { type: "integer", minimum: 1, maximum: U32_MAX },
    },
    deny_claims: {
      description: "Users whose token has one of these claims with this value are refused.",
      type: "object",
      maxProperties: 8,
      propertyNames: { minLength: 1, maxLength: 64 },
      additionalProperties: { type: "string" },
    },
  },
  required: ["plans"],
  additionalProperties: false,
};
// How long a decision holds: a function of its declared inputs, so as long as the gateway keeps it.
const MAX_AGE_MS = 300_000;

let plans = new Map();
let costs = new Map();
// [claim, value refused]; the gateway passes a claim by its position in this list.
let denyClaims = [];

// Throwing from a function whose WIT result is `result<_, string>` returns `err(<thrown string>)`.
function load(config) {
  let value;
  try {
    value = config.trim() === "" ? {} : JSON.parse(config);
  } catch (e) {
    throw `config: invalid JSON: ${e.message}`;
  }
  if (!isTable(value)) throw "config: must be a table";
  return value;
}

function isTable(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

function u32(value, key, low, high = U32_MAX) {
  if (!Number.isInteger(value) || value < low || value > high) {
    throw `${key}: must be an integer between ${low} and ${high}`;
  }
  return value;
}

export const quota = {
  configSchema() {
    return JSON.stringify(SCHEMA);
  },

  configure(plane, config) {
    const cfg = load(config);
    for (const key of Object.keys(cfg)) {
      if (!["plans", "costs", "deny_claims"].includes(key)) {
        throw `${key}: unknown key (expected plans, costs, deny_claims)`;
      }
    }
    const rawPlans = cfg.plans ?? {};
    const rawCosts = cfg.costs ?? {};
    const rawClaims = cfg.deny_claims ?? {};
    if (!isTable(rawPlans)) throw "plans: must be a table of plans";
    if (!isTable(rawCosts)) throw "costs: must be a table of route group = cost";
    if (!isTable(rawClaims) || Object.keys(rawClaims).length > 8) {
      throw "deny_claims: must be a table of at most 8 claim = value";
    }
    if (!Object.hasOwn(rawPlans, "free")) throw "plans.free is required";
    const parsed = new Map();
    for (const [name, limits] of Object.entries(rawPlans)) {
      if (!isTable(limits)) throw `plans.${name}: must be a table with rate_per_second and burst`;
      for (const key of Object.keys(limits)) {
        if (key !== "rate_per_second" && key !== "burst") throw `plans.${name}.${key}: unknown key`;
      }
      for (const key of ["rate_per_second", "burst"]) {
        if (!Object.hasOwn(limits, key)) throw `plans.${name}.${key} is required`;
      }
      parsed.set(name, {
        rate: u32(limits.rate_per_second, `plans.${name}.rate_per_second`, 1),
        burst: u32(limits.burst, `plans.${name}.burst`, 1),
      });
    }
    const freeBurst = parsed.get("free").burst;
    const parsedCosts = new Map();
    for (const [group, cost] of Object.entries(rawCosts)) {
      if (!ROUTE_GROUPS.includes(group)) throw `costs.${group}: not a route group`;
      parsedCosts.set(group, u32(cost, `costs.${group}`, 1, freeBurst));
    }
    for (const [claim, value] of Object.entries(rawClaims)) {
      if (typeof value !== "string") throw `deny_claims.${claim}: must be a string`;
    }
    plans = parsed;
    costs = parsedCosts;
    denyClaims = Object.entries(rawClaims);
    log("info", `configured: ${plans.size} plans, ${costs.size} costs`);
    return {
      claims: denyClaims.map(([claim]) => claim),
      headers: [],
      cache: {
        inputs: { routeGroup: true, project: true, plan: true, claims: denyClaims.length > 0 },
        maxAgeMs: MAX_AGE_MS,
      },
    };
  },

  decide(request) {
    // Each claim comes as JSON text, named by its position in the list `configure` answered.
    for (const { name, value } of request.claims) {
      if (JSON.parse(value) === denyClaims[name][1]) {
        return {
          tag: "deny",
          val: { status: "forbidden", reason: "claim-denied", retryAfterSeconds: 0 },
        };
      }
    }
    const project = request.actor.project;
    if (project == null) return { tag: "exempt" };
    const plan = request.actor.plan || "free";
    const { rate, burst } = plans.get(plan) ?? plans.get("free");
    const cost = Math.min(costs.get(request.routeGroup) ?? 1, burst);
    // The gateway names the bucket from the request: one per project.
    return {
      tag: "limit",
      val: { scope: { tag: "project" }, ratePerSecond: rate, burst, cost },
    };
  },
};
