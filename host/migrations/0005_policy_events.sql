-- The history of the policy modules in force: every install, delete, rollback (by hand or
-- automatic) and operator reload, with who made it. Digests are not foreign keys: a module the
-- history names may have been collected since.
CREATE TABLE IF NOT EXISTS aura_control.policy_events (
    id bigserial PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT now(),
    actor text NOT NULL,
    project_ref text,
    stage text NOT NULL,
    plane text NOT NULL,
    action text NOT NULL,
    digest_before text,
    digest_after text,
    mode text NOT NULL DEFAULT 'enforce',
    reason text,
    config text
);

CREATE INDEX IF NOT EXISTS policy_events_by_project
    ON aura_control.policy_events (project_ref, stage, id DESC);
