// Build (from this folder): componentize-js --wit ../../../../wit --world-name quota-stage --disable http fetch-event --out quota.wasm plugin.js
//
// quota stage, "by plan": one bucket per project and plan, a cost per route group; projects on
// an unlisted plan get the `free` limits, requests without a project are exempt.
// Configuration (TOML):
//   [plans.free]
//   rate_per_second = 20
//   burst = 100
//   [plans.pro]
//   rate_per_second = 500
//   burst = 5000
//   [costs]
//   functions = 5

import { log } from "aura:gateway/log@0.2.0";

const U32_MAX = 0xffffffff;

let plans = new Map();
let costs = new Map();

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
  configure(plane, config) {
    const cfg = load(config);
    for (const key of Object.keys(cfg)) {
      if (key !== "plans" && key !== "costs") throw `${key}: unknown key (expected plans, costs)`;
    }
    const rawPlans = cfg.plans ?? {};
    const rawCosts = cfg.costs ?? {};
    if (!isTable(rawPlans)) throw "plans: must be a table of plans";
    if (!isTable(rawCosts)) throw "costs: must be a table of route group = cost";
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
      parsedCosts.set(group, u32(cost, `costs.${group}`, 1, freeBurst));
    }
    plans = parsed;
    costs = parsedCosts;
    log("info", `configured: ${plans.size} plans, ${costs.size} costs`);
  },

  decide(request) {
    const project = request.actor.project;
    if (project == null) return { tag: "exempt" };
    const plan = request.actor.plan || "free";
    const { rate, burst } = plans.get(plan) ?? plans.get("free");
    const cost = Math.min(costs.get(request.routeGroup) ?? 1, burst);
    return {
      tag: "limit",
      val: { bucket: `project:${project}:${plan}`, ratePerSecond: rate, burst, cost },
    };
  },
};
