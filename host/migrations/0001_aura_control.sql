-- The control tables the gateway reads (platform contract §6).
CREATE SCHEMA IF NOT EXISTS aura_control;

CREATE TABLE IF NOT EXISTS aura_control.organizations (
    id uuid PRIMARY KEY,
    name text NOT NULL
);

CREATE TABLE IF NOT EXISTS aura_control.projects (
    ref text PRIMARY KEY,
    organization_id uuid NOT NULL REFERENCES aura_control.organizations (id),
    db_engine text NOT NULL,
    topology text NOT NULL,
    postgrest_url text NULL,
    plan text NOT NULL DEFAULT 'free'
);

CREATE TABLE IF NOT EXISTS aura_control.organization_members (
    organization_id uuid REFERENCES aura_control.organizations (id),
    user_id uuid,
    role text NOT NULL,
    PRIMARY KEY (organization_id, user_id)
);

CREATE TABLE IF NOT EXISTS aura_control.api_keys (
    id uuid PRIMARY KEY,
    project_ref text NOT NULL REFERENCES aura_control.projects (ref),
    role text NOT NULL,
    key_sha256 text NOT NULL UNIQUE,
    revoked_at timestamptz NULL
);
