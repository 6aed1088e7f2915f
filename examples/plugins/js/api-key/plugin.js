// Build (from this folder): componentize-js --wit ../../../../wit --world-name api-key-stage --disable http fetch-event --out api-key.wasm plugin.js
//
// api-key stage, "custom header": the key is read from one configured header (default
// `x-aura-key`) and from `apikey`; `?apikey=` query keys are ignored. The decision depends on
// those headers alone, so that is all it declares. Configuration (TOML):
//   header = "x-aura-key"   # lower-case header name

import { log } from "aura:gateway/log@0.5.0";

// The JSON Schema of the configuration, checked by the gateway before `configure` runs.
const SCHEMA = {
  $schema: "https://json-schema.org/draft/2020-12/schema",
  title: "api-key: a custom header",
  type: "object",
  properties: {
    header: {
      description: "The lower-case header the key is read from, besides apikey.",
      type: "string",
      pattern: "^[a-z0-9_-]{1,64}$",
      not: { const: "authorization" },
      default: "x-aura-key",
    },
  },
  additionalProperties: false,
};
// How long a decision holds: a function of the headers alone, so as long as the gateway keeps it.
const MAX_AGE_MS = 300_000;
const HEADER_NAME = /^[a-z0-9_-]+$/;

let header = "x-aura-key";

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

export const apiKey = {
  configSchema() {
    return JSON.stringify(SCHEMA);
  },

  configure(plane, config) {
    const cfg = load(config);
    for (const key of Object.keys(cfg)) {
      if (key !== "header") throw `${key}: unknown key (expected header)`;
    }
    const name = cfg.header ?? "x-aura-key";
    if (typeof name !== "string" || !HEADER_NAME.test(name)) {
      throw `header: ${JSON.stringify(name)} is not a lower-case header name`;
    }
    if (name === "authorization") {
      throw 'header: "authorization" carries user JWTs, not API keys';
    }
    header = name;
    return {
      headers: name === "apikey" ? [name] : [name, "apikey"],
      cache: { inputs: { headers: true }, maxAgeMs: MAX_AGE_MS },
    };
  },

  extract(request) {
    // The gateway passes only the headers `configure` named (each value with the position of
    // its name in that list), so every value here is a candidate key.
    const keys = [];
    for (const h of request.headers) {
      const value = h.value.trim();
      if (value && !keys.includes(value)) keys.push(value);
    }
    if (keys.length === 0) {
      log("debug", `no API key in ${header} or apikey`);
      return { tag: "absent" };
    }
    if (keys.length > 1) {
      return { tag: "refuse", val: "two different API keys" };
    }
    return {
      tag: "present",
      val: { key: keys[0], source: "header", allowedRoles: ["anon", "service-role"] },
    };
  },
};
