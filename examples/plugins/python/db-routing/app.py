# Build (from this folder): componentize-py -d ../../../../wit -w db-routing-stage componentize app -o db-routing.wasm
"""db-routing stage, "reads to PostgREST": reads of dedicated Postgres projects go straight to
their PostgREST, everything else over NATS. Configuration (TOML):

    postgrest_methods = ["GET", "HEAD"]   # upper-case methods sent to PostgREST
"""

import json
import re

from componentize_py_types import Err
from wit_world import exports
from wit_world.exports.db_routing import (
    DbEngine,
    DbRequest,
    DbRoute,
    DbRoute_Nats,
    DbRoute_Postgrest,
    DbRoute_Unresolved,
    Topology,
)
from wit_world.imports.log import Level, log
from wit_world.imports.types import Plane

NATS_ONLY = ("/v1/db/schema", "/v1/db/policies", "/v1/db/sql")

methods: list[str] = ["GET", "HEAD"]


def load(config: str) -> dict:
    try:
        value = json.loads(config) if config.strip() else {}
    except ValueError as e:
        raise Err(f"config: invalid JSON: {e}")
    if not isinstance(value, dict):
        raise Err("config: must be a table")
    return value


class DbRouting(exports.DbRouting):
    def configure(self, plane: Plane, config: str) -> None:
        global methods
        cfg = load(config)
        for key in cfg:
            if key != "postgrest_methods":
                raise Err(f"{key}: unknown key (expected postgrest_methods)")
        value = cfg.get("postgrest_methods", ["GET", "HEAD"])
        if not isinstance(value, list):
            raise Err("postgrest_methods: must be a list of upper-case methods")
        for m in value:
            if not isinstance(m, str) or not re.fullmatch("[A-Z0-9]+", m):
                raise Err(f"postgrest_methods: {m!r} is not an upper-case method")
        methods = value

    def decide(self, request: DbRequest) -> DbRoute:
        project = request.project
        if request.path.startswith(NATS_ONLY) or project is None:
            return DbRoute_Nats()
        if project.engine == DbEngine.MONGODB or project.topology == Topology.SHARED:
            return DbRoute_Nats()
        if request.method not in methods:
            return DbRoute_Nats()
        if project.postgrest_url is not None:
            return DbRoute_Postgrest(project.postgrest_url)
        log(Level.WARN, f"no PostgREST target for {request.path}")
        return DbRoute_Unresolved()
