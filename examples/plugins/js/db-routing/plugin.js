// Build (from this folder): componentize-js --wit ../../../../wit --world-name db-routing-stage --disable http fetch-event --out db-routing.wasm plugin.js
//
// db-routing stage, "reads to PostgREST": reads of dedicated Postgres projects go straight to
// their database — a `GET` or `HEAD` to a read replica in the client's region when the project
// has one, else to its PostgREST — and everything else over NATS. The decision depends on the
// method, the path, the project and the client's region: that is what it declares.
// Configuration (TOML):
//   postgrest_methods = ["GET", "HEAD"]   # upper-case methods sent to PostgREST

import { log } from "aura:gateway/log@0.5.0";

const NATS_ONLY = ["/v1/db/schema", "/v1/db/policies", "/v1/db/sql"];
const METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];
// The JSON Schema of the configuration, checked by the gateway before `configure` runs.
const SCHEMA = {
  $schema: "https://json-schema.org/draft/2020-12/schema",
  title: "db-routing: reads to PostgREST",
  type: "object",
  properties: {
    postgrest_methods: {
      description: "Methods sent to PostgREST (a GET or HEAD may go to a replica instead).",
      type: "array",
      items: { enum: METHODS },
      uniqueItems: true,
      default: ["GET", "HEAD"],
    },
  },
  additionalProperties: false,
};
// How long a decision holds: a function of its declared inputs, so as long as the gateway keeps it.
const MAX_AGE_MS = 300_000;

// The methods as the gateway passes them: "get", "head", …
let postgrestMethods = ["get", "head"];

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
  configSchema() {
    return JSON.stringify(SCHEMA);
  },

  configure(plane, config) {
    const cfg = load(config);
    for (const key of Object.keys(cfg)) {
      if (key !== "postgrest_methods") throw `${key}: unknown key (expected postgrest_methods)`;
    }
    const value = cfg.postgrest_methods ?? ["GET", "HEAD"];
    if (!Array.isArray(value)) throw "postgrest_methods: must be a list of upper-case methods";
    for (const m of value) {
      if (!METHODS.includes(m)) {
        throw `postgrest_methods: ${JSON.stringify(m)} is not a known method`;
      }
    }
    postgrestMethods = value.map((m) => m.toLowerCase());
    return {
      inputs: { method: true, path: true, project: true, clientRegion: true },
      maxAgeMs: MAX_AGE_MS,
    };
  },

  decide(request) {
    const project = request.project;
    if (NATS_ONLY.some((p) => request.path.startsWith(p)) || project == null) {
      return { tag: "nats" };
    }
    if (project.engine === "mongodb" || project.topology === "shared") return { tag: "nats" };
    if (!postgrestMethods.includes(request.method)) return { tag: "nats" };
    // The gateway sends only GET and HEAD to a replica, and only to one of the project's.
    const read = request.method === "get" || request.method === "head";
    const region = request.clientRegion;
    const replica = read && region != null && project.replicas.find((r) => r.region === region);
    if (replica) return { tag: "replica", val: replica.url };
    if (project.postgrestUrl != null) return { tag: "postgrest", val: project.postgrestUrl };
    log("warn", `no PostgREST target for ${request.path}`);
    return { tag: "unresolved" };
  },
};
