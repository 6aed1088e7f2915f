// Build (from this folder): componentize-js --wit ../../../../wit --world-name cors-stage --disable http fetch-event --out cors.wasm plugin.js
//
// cors stage, "allow list": exact origins, plus any https subdomain of listed domains. The
// decision depends on the origin and on whether the request is a preflight, so it declares
// `origin` and `request-method`. Configuration (TOML):
//   origins = ["https://app.example.com"]
//   subdomains_of = ["example.org"]   # https://<anything>.example.org
//   max_age_secs = 600

import { log } from "aura:gateway/log@0.5.0";

// The JSON Schema of the configuration, checked by the gateway before `configure` runs.
const SCHEMA = {
  $schema: "https://json-schema.org/draft/2020-12/schema",
  title: "cors: an allow-list",
  type: "object",
  properties: {
    origins: {
      description: "Origins allowed, compared case-insensitively (no wildcards).",
      type: "array",
      items: { type: "string" },
    },
    subdomains_of: {
      description: "Domains whose https subdomains are allowed (no wildcards).",
      type: "array",
      items: { type: "string" },
    },
    max_age_secs: {
      description: "Access-Control-Max-Age of a preflight, in seconds.",
      type: "integer",
      minimum: 0,
      maximum: 4294967295,
      default: 600,
    },
  },
  additionalProperties: false,
};
// How long a decision holds: a function of its declared inputs, so as long as the gateway keeps it.
const MAX_AGE_MS = 300_000;
const KEYS = ["origins", "subdomains_of", "max_age_secs"];
const PREFLIGHT_METHODS = ["GET", "POST", "PATCH", "DELETE", "OPTIONS"];
const PREFLIGHT_HEADERS = ["authorization", "apikey", "content-type"];

let origins = [];
let domains = [];
let maxAge = 600;

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

function strings(cfg, key) {
  const value = cfg[key] ?? [];
  if (!Array.isArray(value) || !value.every((v) => typeof v === "string")) {
    throw `${key}: must be a list of strings`;
  }
  return value;
}

function allowed(origin) {
  origin = origin.toLowerCase();
  if (origins.includes(origin)) return true;
  if (!origin.startsWith("https://")) return false;
  const host = origin.slice("https://".length).split(":")[0];
  return domains.some((d) => host.endsWith(`.${d}`));
}

export const cors = {
  configSchema() {
    return JSON.stringify(SCHEMA);
  },

  configure(plane, config) {
    const cfg = load(config);
    for (const key of Object.keys(cfg)) {
      if (!KEYS.includes(key)) throw `${key}: unknown key (expected one of ${KEYS.join(", ")})`;
    }
    const listed = strings(cfg, "origins");
    const subdomains = strings(cfg, "subdomains_of");
    if ([...listed, ...subdomains].some((v) => v.includes("*"))) {
      throw "wildcards are not allowed; list origins or use subdomains_of";
    }
    const age = cfg.max_age_secs ?? 600;
    if (!Number.isInteger(age) || age < 0 || age > 0xffffffff) {
      throw "max_age_secs: must be an integer between 0 and 4294967295";
    }
    origins = listed.map((o) => o.toLowerCase());
    domains = subdomains.map((d) => d.toLowerCase());
    maxAge = age;
    log("info", `configured: ${origins.length} origins, ${domains.length} domains`);
    return { inputs: { origin: true, requestMethod: true }, maxAgeMs: MAX_AGE_MS };
  },

  decide(request) {
    if (!allowed(request.origin)) {
      log("info", `origin ${request.origin} denied`);
      return { tag: "deny" };
    }
    const preflight = request.requestMethod !== undefined && request.requestMethod !== null;
    return {
      tag: "allow",
      val: {
        allowOrigin: request.origin,
        allowMethods: preflight ? [...PREFLIGHT_METHODS] : [],
        allowHeaders: preflight ? [...PREFLIGHT_HEADERS] : [],
        exposeHeaders: ["x-request-id"],
        maxAge: preflight ? maxAge : undefined,
      },
    };
  },
};
