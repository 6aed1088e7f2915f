-- Identity providers a project trusts for its users' JWTs (Clerk, Auth0, Firebase Auth, Cognito,
-- WorkOS, any OIDC issuer), selected by the token's iss exactly: one row per project and issuer.
-- The gateway checks every row again when it reads it (IssuerRecord::check); a row that fails is
-- skipped, the project's other issuers and keys keep working.

CREATE TABLE IF NOT EXISTS aura_control.project_issuers (
    id uuid PRIMARY KEY,
    project_ref text NOT NULL REFERENCES aura_control.projects (ref) ON DELETE CASCADE,
    issuer text NOT NULL CHECK (length(issuer) BETWEEN 1 AND 2048),
    jwks_url text CHECK (jwks_url IS NULL OR (jwks_url ~ '^https://' AND length(jwks_url) <= 2048)),
    keys text CHECK (keys IS NULL OR length(keys) <= 65536),
    algorithms text[] NOT NULL DEFAULT '{RS256,ES256}'
        CHECK (cardinality(algorithms) >= 1 AND algorithms <@ '{RS256,ES256}'::text[]),
    audience_claim text NOT NULL DEFAULT 'aud' CHECK (audience_claim IN ('aud', 'azp', 'client_id')),
    audiences text[] NOT NULL CHECK (cardinality(audiences) <= 16),
    role_claim text CHECK (role_claim IS NULL OR length(role_claim) BETWEEN 1 AND 64),
    allowed_roles text[] NOT NULL DEFAULT '{authenticated}'
        CHECK (cardinality(allowed_roles) >= 1 AND allowed_roles <@ '{authenticated,anon}'::text[]),
    created_at timestamptz NOT NULL DEFAULT now(),
    created_by text,
    CHECK (jwks_url IS NULL OR keys IS NULL),
    CHECK (jwks_url IS NOT NULL OR keys IS NOT NULL OR issuer ~ '^https://'),
    UNIQUE (project_ref, issuer)
);

-- Part of the project's record: logged as a change of the project (0009's function), so every
-- instance's project cache drops it and the next request sees the project's issuers.
DROP TRIGGER IF EXISTS notify_change ON aura_control.project_issuers;
CREATE TRIGGER notify_change AFTER INSERT OR UPDATE OR DELETE ON aura_control.project_issuers
    FOR EACH ROW EXECUTE FUNCTION aura_control.notify_project_part_change();
