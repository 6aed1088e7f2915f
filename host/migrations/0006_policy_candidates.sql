-- A module a project tries next to the one in force for a stage (`shadow`: run on live requests
-- and compared, never deciding; `canary`: deciding for `percent` % of actors). At most one per
-- project and stage; `promote` makes it the module in force, `abort` drops it.
CREATE TABLE IF NOT EXISTS aura_control.policy_candidates (
    project_ref text NOT NULL REFERENCES aura_control.projects (ref) ON DELETE CASCADE,
    stage text NOT NULL,
    digest text NOT NULL REFERENCES aura_control.policy_modules (digest),
    config text NOT NULL DEFAULT '{}',
    mode text NOT NULL CHECK (mode IN ('shadow', 'canary')),
    percent smallint NOT NULL DEFAULT 0 CHECK (percent BETWEEN 0 AND 100),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (project_ref, stage)
);

-- A change of a candidate notifies every instance like a change of a module in force.
CREATE OR REPLACE FUNCTION aura_control.notify_change() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    IF TG_OP = 'DELETE' THEN r := OLD; ELSE r := NEW; END IF;
    IF TG_TABLE_NAME = 'api_keys' THEN
        PERFORM pg_notify('aura_control_changes',
            json_build_object('kind', 'api_key', 'key_sha256', r.key_sha256)::text);
        IF TG_OP = 'UPDATE' AND OLD.key_sha256 IS DISTINCT FROM NEW.key_sha256 THEN
            PERFORM pg_notify('aura_control_changes',
                json_build_object('kind', 'api_key', 'key_sha256', OLD.key_sha256)::text);
        END IF;
    ELSIF TG_TABLE_NAME = 'projects' THEN
        PERFORM pg_notify('aura_control_changes',
            json_build_object('kind', 'project', 'project_ref', r.ref)::text);
    ELSIF TG_TABLE_NAME = 'organization_members' THEN
        PERFORM pg_notify('aura_control_changes',
            json_build_object('kind', 'membership', 'organization_id', r.organization_id::text,
                              'user_id', r.user_id::text)::text);
    ELSIF TG_TABLE_NAME IN ('project_policies', 'policy_candidates') THEN
        PERFORM pg_notify('aura_control_changes',
            json_build_object('kind', 'tenant_modules', 'project_ref', r.project_ref)::text);
    END IF;
    RETURN NULL;
END;
$$;

DROP TRIGGER IF EXISTS notify_change ON aura_control.policy_candidates;
CREATE TRIGGER notify_change AFTER INSERT OR UPDATE OR DELETE ON aura_control.policy_candidates
    FOR EACH ROW EXECUTE FUNCTION aura_control.notify_change();
