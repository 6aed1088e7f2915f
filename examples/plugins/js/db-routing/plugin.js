// Build (from this folder): componentize-js --wit ../../../../wit --world-name db-routing-stage --disable http fetch-event --out db-routing.wasm plugin.js
//
// db-routing stage, "reads to PostgREST": reads of dedicated Postgres projects go straight to
// their PostgREST, everything else over NATS. Configuration (TOML):
//   postgrest_methods = ["GET", "HEAD"]   # upper-case methods sent to PostgREST

import { log } from "aura:gateway/log@0.2.0";

const NATS_ONLY = ["/v1/db/schema", "/v1/db/policies", "/v1/db/sql"];
const METHOD = /^[A-Z0-9]+$/;

let methods = ["GET", "HEAD"];

// Throwing from a function whose WIT result is `result<_, string>` returns `err(<thrown string>)`.
function load(config) {
  let value;
  try {
    value = config.trim() === "" ? {} : JSON.parse(config);
  } catch (e) {
    throw `config: invalid JSON: ${e.message}`;
  }
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    throw "config: must be a table";
  }
  return value;
}

export const dbRouting = {
  configure(plane, config) {
    const cfg = load(config);
    for (const key of Object.keys(cfg)) {
      if (key !== "postgrest_methods") throw `${key}: unknown key (expected postgrest_methods)`;
    }
    const value = cfg.postgrest_methods ?? ["GET", "HEAD"];
    if (!Array.isArray(value)) throw "postgrest_methods: must be a list of upper-case methods";
    for (const m of value) {
      if (typeof m !== "string" || !METHOD.test(m)) {
        throw `postgrest_methods: ${JSON.stringify(m)} is not an upper-case method`;
      }
    }
    methods = value;
  },

  decide(request) {
    const project = request.project;
    if (NATS_ONLY.some((p) => request.path.startsWith(p)) || project == null) {
      return { tag: "nats" };
    }
    if (project.engine === "mongodb" || project.topology === "shared") return { tag: "nats" };
    if (!methods.includes(request.method)) return { tag: "nats" };
    if (project.postgrestUrl != null) return { tag: "postgrest", val: project.postgrestUrl };
    log("warn", `no PostgREST target for ${request.path}`);
    return { tag: "unresolved" };
  },
};
