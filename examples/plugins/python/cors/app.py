# Build (from this folder): componentize-py -d ../../../../wit -w cors-stage componentize app -o cors.wasm
"""cors stage, "allow list": exact origins, plus any https subdomain of listed domains. The
decision depends on the origin and on whether the request is a preflight, so it declares
`origin` and `request-method`. Configuration (TOML):

    origins = ["https://app.example.com"]
    subdomains_of = ["example.org"]   # https://<anything>.example.org
    max_age_secs = 600
"""

import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.exports.cors import (
    CorsAllow,
    CorsCache,
    CorsDecision,
    CorsDecision_Allow,
    CorsDecision_Deny,
    CorsInputs,
    CorsRequest,
)
from wit_world.imports.log import Level, log
from wit_world.imports.types import Plane

# The JSON Schema of the configuration, checked by the gateway before `configure` runs.
SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "cors: an allow-list",
    "type": "object",
    "properties": {
        "origins": {
            "description": "Origins allowed, compared case-insensitively (no wildcards).",
            "type": "array",
            "items": {"type": "string"},
        },
        "subdomains_of": {
            "description": "Domains whose https subdomains are allowed (no wildcards).",
            "type": "array",
            "items": {"type": "string"},
        },
        "max_age_secs": {
            "description": "Access-Control-Max-Age of a preflight, in seconds.",
            "type": "integer",
            "minimum": 0,
            "maximum": 4294967295,
            "default": 600,
        },
    },
    "additionalProperties": False,
}
# How long a decision holds: a function of its declared inputs, so as long as the gateway keeps it.
MAX_AGE_MS = 300_000
KEYS = ("origins", "subdomains_of", "max_age_secs")
PREFLIGHT_METHODS = ["GET", "POST", "PATCH", "DELETE", "OPTIONS"]
PREFLIGHT_HEADERS = ["authorization", "apikey", "content-type"]

origins: list[str] = []
domains: list[str] = []
max_age = 600


def load(config: str) -> dict:
    try:
        value = json.loads(config) if config.strip() else {}
    except ValueError as e:
        raise Err(f"config: invalid JSON: {e}")
    if not isinstance(value, dict):
        raise Err("config: must be a table")
    return value


def strings(cfg: dict, key: str) -> list[str]:
    value = cfg.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise Err(f"{key}: must be a list of strings")
    return value


def allowed(origin: str) -> bool:
    origin = origin.lower()
    if origin in origins:
        return True
    if not origin.startswith("https://"):
        return False
    host = origin[len("https://"):].split(":", 1)[0]
    return any(host.endswith("." + d) for d in domains)


class Cors(exports.Cors):
    def config_schema(self) -> str | None:
        return json.dumps(SCHEMA)

    def configure(self, plane: Plane, config: str) -> CorsCache | None:
        global origins, domains, max_age
        cfg = load(config)
        for key in cfg:
            if key not in KEYS:
                raise Err(f"{key}: unknown key (expected one of {', '.join(KEYS)})")
        listed, subdomains = strings(cfg, "origins"), strings(cfg, "subdomains_of")
        if any("*" in v for v in listed + subdomains):
            raise Err("wildcards are not allowed; list origins or use subdomains_of")
        age = cfg.get("max_age_secs", 600)
        if not isinstance(age, int) or isinstance(age, bool) or not 0 <= age <= 0xFFFFFFFF:
            raise Err("max_age_secs: must be an integer between 0 and 4294967295")
        origins = [o.lower() for o in listed]
        domains = [d.lower() for d in subdomains]
        max_age = age
        log(Level.INFO, f"configured: {len(origins)} origins, {len(domains)} domains")
        inputs = CorsInputs.ORIGIN | CorsInputs.REQUEST_METHOD
        return CorsCache(inputs=inputs, max_age_ms=MAX_AGE_MS)

    def decide(self, request: CorsRequest) -> CorsDecision:
        if not allowed(request.origin):
            log(Level.INFO, f"origin {request.origin} denied")
            return CorsDecision_Deny()
        preflight = request.request_method is not None
        return CorsDecision_Allow(
            CorsAllow(
                allow_origin=request.origin,
                allow_methods=list(PREFLIGHT_METHODS) if preflight else [],
                allow_headers=list(PREFLIGHT_HEADERS) if preflight else [],
                expose_headers=["x-request-id"],
                max_age=max_age if preflight else None,
            )
        )
