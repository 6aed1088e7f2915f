-- Read replicas of a project's dedicated database: a PostgREST base URL over each, and where it
-- runs. The db-routing stage may send a project's reads (GET, HEAD) to one of them; the host
-- refuses any other method, and any URL that is not listed here.

CREATE TABLE IF NOT EXISTS aura_control.project_replicas (
    project_ref text NOT NULL REFERENCES aura_control.projects (ref) ON DELETE CASCADE,
    url text NOT NULL CHECK (url ~ '^https?://' AND length(url) <= 2048),
    region text CHECK (region IS NULL OR length(region) BETWEEN 1 AND 64),
    PRIMARY KEY (project_ref, url)
);

-- A change of a project's replicas is a change of the project: the fleet's project caches drop
-- it (host/src/changes.rs). Logged as aura_control.notify_change logs a project's change (0007).
CREATE OR REPLACE FUNCTION aura_control.notify_replica_change() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    logged bigint;
BEGIN
    INSERT INTO aura_control.change_log (kind, project_ref)
        VALUES ('project', CASE WHEN TG_OP = 'DELETE' THEN OLD.project_ref ELSE NEW.project_ref END)
        RETURNING id INTO logged;
    PERFORM pg_catalog.pg_notify('aura_control_changes', logged::text);
    RETURN NULL;
END;
$$;

DROP TRIGGER IF EXISTS notify_change ON aura_control.project_replicas;
CREATE TRIGGER notify_change AFTER INSERT OR UPDATE OR DELETE ON aura_control.project_replicas
    FOR EACH ROW EXECUTE FUNCTION aura_control.notify_replica_change();
