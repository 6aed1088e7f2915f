-- Change notifications: every write to a control table that a gateway caches notifies channel
-- aura_control_changes, so that every instance acts at once (host/src/changes.rs), whoever
-- made the change. Payloads are JSON events the gateway parses strictly; they carry no secret
-- (an API key's SHA-256 at most).

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
    ELSIF TG_TABLE_NAME = 'project_policies' THEN
        PERFORM pg_notify('aura_control_changes',
            json_build_object('kind', 'tenant_modules', 'project_ref', r.project_ref)::text);
    END IF;
    RETURN NULL;
END;
$$;

DROP TRIGGER IF EXISTS notify_change ON aura_control.api_keys;
CREATE TRIGGER notify_change AFTER INSERT OR UPDATE OR DELETE ON aura_control.api_keys
    FOR EACH ROW EXECUTE FUNCTION aura_control.notify_change();
DROP TRIGGER IF EXISTS notify_change ON aura_control.projects;
CREATE TRIGGER notify_change AFTER INSERT OR UPDATE OR DELETE ON aura_control.projects
    FOR EACH ROW EXECUTE FUNCTION aura_control.notify_change();
DROP TRIGGER IF EXISTS notify_change ON aura_control.organization_members;
CREATE TRIGGER notify_change AFTER INSERT OR UPDATE OR DELETE ON aura_control.organization_members
    FOR EACH ROW EXECUTE FUNCTION aura_control.notify_change();
DROP TRIGGER IF EXISTS notify_change ON aura_control.project_policies;
CREATE TRIGGER notify_change AFTER INSERT OR UPDATE OR DELETE ON aura_control.project_policies
    FOR EACH ROW EXECUTE FUNCTION aura_control.notify_change();
