-- A project's credential settings. browser_secret_keys: whether its service_role keys are
-- accepted on requests a browser made (an Origin or Sec-Fetch-Site header), where the gateway's
-- auth.secret_keys_from_browsers refuses them (the default). No row: the defaults.

CREATE TABLE IF NOT EXISTS aura_control.project_auth (
    project_ref text PRIMARY KEY REFERENCES aura_control.projects (ref) ON DELETE CASCADE,
    browser_secret_keys boolean NOT NULL DEFAULT false,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Part of a project's record: a change is logged as a change of the project (kind 'project',
-- like replicas in 0008), so every instance's project cache drops it (host/src/changes.rs). An
-- UPDATE that moves a row to another project logs both.
CREATE OR REPLACE FUNCTION aura_control.notify_project_part_change() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    logged bigint;
BEGIN
    IF TG_OP <> 'INSERT' THEN
        INSERT INTO aura_control.change_log (kind, project_ref)
            VALUES ('project', OLD.project_ref) RETURNING id INTO logged;
        PERFORM pg_catalog.pg_notify('aura_control_changes', logged::text);
    END IF;
    IF TG_OP = 'INSERT' OR (TG_OP = 'UPDATE' AND NEW.project_ref IS DISTINCT FROM OLD.project_ref) THEN
        INSERT INTO aura_control.change_log (kind, project_ref)
            VALUES ('project', NEW.project_ref) RETURNING id INTO logged;
        PERFORM pg_catalog.pg_notify('aura_control_changes', logged::text);
    END IF;
    -- The log is read within moments; an hour of it is kept (as 0007 does).
    IF logged % 1000 = 0 THEN
        DELETE FROM aura_control.change_log WHERE at < pg_catalog.now() - interval '1 hour';
    END IF;
    RETURN NULL;
END;
$$;

DROP TRIGGER IF EXISTS notify_change ON aura_control.project_auth;
CREATE TRIGGER notify_change AFTER INSERT OR UPDATE OR DELETE ON aura_control.project_auth
    FOR EACH ROW EXECUTE FUNCTION aura_control.notify_project_part_change();
