# Build (from this folder): componentize-py -d ../../../../wit -w api-key-stage componentize app -o api-key.wasm
"""api-key stage, "custom header": the key is read from one configured header (default
`x-aura-key`) and from `apikey`; `?apikey=` query keys are ignored. The decision depends on
those headers alone, so that is all it declares. Configuration (TOML):

    header = "x-aura-key"   # lower-case header name
"""

import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.exports.api_key import (
    Credential,
    KeyCache,
    KeyDecision,
    KeyDecision_Absent,
    KeyDecision_Present,
    KeyDecision_Refuse,
    KeyInputs,
    KeyRequest,
    KeyRole,
    KeySetup,
    KeySource,
)
from wit_world.imports.log import Level, log
from wit_world.imports.types import Plane

# The JSON Schema of the configuration, checked by the gateway before `configure` runs.
SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "api-key: a custom header",
    "type": "object",
    "properties": {
        "header": {
            "description": "The lower-case header the key is read from, besides apikey.",
            "type": "string",
            "pattern": "^[a-z0-9_-]{1,64}$",
            "not": {"const": "authorization"},
            "default": "x-aura-key",
        }
    },
    "additionalProperties": False,
}
# How long a decision holds: a function of the headers alone, so as long as the gateway keeps it.
MAX_AGE_MS = 300_000
HEADER_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789-_")

header = "x-aura-key"


def load(config: str) -> dict:
    try:
        value = json.loads(config) if config.strip() else {}
    except ValueError as e:
        raise Err(f"config: invalid JSON: {e}")
    if not isinstance(value, dict):
        raise Err("config: must be a table")
    return value


class ApiKey(exports.ApiKey):
    def config_schema(self) -> str | None:
        return json.dumps(SCHEMA)

    def configure(self, plane: Plane, config: str) -> KeySetup:
        global header
        cfg = load(config)
        for key in cfg:
            if key != "header":
                raise Err(f"{key}: unknown key (expected header)")
        name = cfg.get("header", "x-aura-key")
        if not isinstance(name, str) or not name or not set(name) <= HEADER_CHARS:
            raise Err(f"header: {name!r} is not a lower-case header name")
        if name == "authorization":
            raise Err('header: "authorization" carries user JWTs, not API keys')
        header = name
        return KeySetup(
            headers=[name] if name == "apikey" else [name, "apikey"],
            cache=KeyCache(inputs=KeyInputs.HEADERS, max_age_ms=MAX_AGE_MS),
        )

    def extract(self, request: KeyRequest) -> KeyDecision:
        # The gateway passes only the headers `configure` named (each value with the position of
        # its name in that list), so every value here is a candidate key.
        keys = []
        for h in request.headers:
            value = h.value.strip()
            if value and value not in keys:
                keys.append(value)
        if not keys:
            log(Level.DEBUG, f"no API key in {header} or apikey")
            return KeyDecision_Absent()
        if len(keys) > 1:
            return KeyDecision_Refuse("two different API keys")
        return KeyDecision_Present(
            Credential(
                key=keys[0],
                source=KeySource.HEADER,
                allowed_roles=[KeyRole.ANON, KeyRole.SERVICE_ROLE],
            )
        )
