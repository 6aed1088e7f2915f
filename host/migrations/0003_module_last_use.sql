-- When a stored policy module was last stored or in use on some instance: modules no project
-- references and no instance used for `plugins.module_gc_grace_secs` are collected.
ALTER TABLE aura_control.policy_modules
    ADD COLUMN IF NOT EXISTS last_used_at timestamptz NOT NULL DEFAULT now();
