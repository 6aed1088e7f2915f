-- Change events only the fleet can read (host/src/changes.rs).
--
-- Any database login may NOTIFY or LISTEN on any channel. So the triggers no longer put the
-- change in the notification: they append it to aura_control.change_log, which no other role
-- may read or write (its rows name key hashes, project refs and user ids), and notify
-- aura_control_changes with the new row's id only. A gateway reads the log itself; a forged
-- notification costs it one indexed read that finds nothing, and only the kinds written here
-- are ever acted on.

CREATE TABLE IF NOT EXISTS aura_control.change_log (
    id bigserial PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT now(),
    kind text NOT NULL CHECK (kind IN ('api_key', 'project', 'membership', 'tenant_modules')),
    key_sha256 text,
    project_ref text,
    organization_id uuid,
    user_id uuid
);

CREATE INDEX IF NOT EXISTS change_log_by_time ON aura_control.change_log (at);

REVOKE ALL ON aura_control.change_log FROM PUBLIC;
REVOKE ALL ON SEQUENCE aura_control.change_log_id_seq FROM PUBLIC;

-- SECURITY DEFINER: whoever writes a control table records its change without any privilege
-- on the log; the search path is fixed so that the function runs only what it names.
CREATE OR REPLACE FUNCTION aura_control.notify_change() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
    logged bigint;
BEGIN
    IF TG_OP = 'DELETE' THEN r := OLD; ELSE r := NEW; END IF;
    IF TG_TABLE_NAME = 'api_keys' THEN
        INSERT INTO aura_control.change_log (kind, key_sha256)
            VALUES ('api_key', r.key_sha256) RETURNING id INTO logged;
        IF TG_OP = 'UPDATE' AND OLD.key_sha256 IS DISTINCT FROM NEW.key_sha256 THEN
            INSERT INTO aura_control.change_log (kind, key_sha256)
                VALUES ('api_key', OLD.key_sha256) RETURNING id INTO logged;
        END IF;
    ELSIF TG_TABLE_NAME = 'projects' THEN
        INSERT INTO aura_control.change_log (kind, project_ref)
            VALUES ('project', r.ref) RETURNING id INTO logged;
    ELSIF TG_TABLE_NAME = 'organization_members' THEN
        INSERT INTO aura_control.change_log (kind, organization_id, user_id)
            VALUES ('membership', r.organization_id, r.user_id) RETURNING id INTO logged;
    ELSIF TG_TABLE_NAME IN ('project_policies', 'policy_candidates') THEN
        INSERT INTO aura_control.change_log (kind, project_ref)
            VALUES ('tenant_modules', r.project_ref) RETURNING id INTO logged;
    END IF;
    IF logged IS NOT NULL THEN
        PERFORM pg_catalog.pg_notify('aura_control_changes', logged::text);
        -- The log is read within moments; an hour of it is kept.
        IF logged % 1000 = 0 THEN
            DELETE FROM aura_control.change_log WHERE at < pg_catalog.now() - interval '1 hour';
        END IF;
    END IF;
    RETURN NULL;
END;
$$;
