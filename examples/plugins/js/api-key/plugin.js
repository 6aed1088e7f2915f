// Build (from this folder): componentize-js --wit ../../../../wit --world-name api-key-stage --disable http fetch-event --out api-key.wasm plugin.js
//
// api-key stage, "custom header": the key is read from one configured header (default
// `x-aura-key`) and from `apikey`; `?apikey=` query keys are ignored. Configuration (TOML):
//   header = "x-aura-key"   # lower-case header name

import { log } from "aura:gateway/log@0.2.0";

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
    return name === "apikey" ? [name] : [name, "apikey"];
  },

  extract(request) {
    const keys = [];
    for (const [name, raw] of request.headers) {
      const value = raw.trim();
      if ((name === header || name === "apikey") && value && !keys.includes(value)) {
        keys.push(value);
      }
    }
    if (keys.length === 0) {
      log("debug", `no API key on ${request.path}`);
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
