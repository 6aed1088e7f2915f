-- Policy modules installed by tenants for their projects (content-addressed by SHA-256).
CREATE TABLE IF NOT EXISTS aura_control.policy_modules (
    digest text PRIMARY KEY,
    module bytea NOT NULL,
    size integer NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS aura_control.project_policies (
    project_ref text NOT NULL REFERENCES aura_control.projects (ref) ON DELETE CASCADE,
    stage text NOT NULL,
    digest text NOT NULL REFERENCES aura_control.policy_modules (digest),
    config text NOT NULL DEFAULT '{}',
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (project_ref, stage)
);
