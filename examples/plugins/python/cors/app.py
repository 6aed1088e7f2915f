# Build (from this folder): componentize-py -d ../../../../wit -w cors-stage componentize app -o cors.wasm
"""cors stage, "allow list": exact origins, plus any https subdomain of listed domains.
Configuration (TOML):

    origins = ["https://app.example.com"]
    subdomains_of = ["example.org"]   # https://<anything>.example.org
    max_age_secs = 600
"""

import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.exports.cors import (
    CorsAllow,
    CorsDecision,
    CorsDecision_Allow,
    CorsDecision_Deny,
    CorsRequest,
)
from wit_world.imports.log import Level, log
from wit_world.imports.types import Plane

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
    def configure(self, plane: Plane, config: str) -> None:
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
