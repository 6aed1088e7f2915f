//! The standard e2e control records (one project, one key, one console user), stored modules
//! written as another instance would have, and the file store's policy history.

use std::path::Path;

/// An anon key of [`TEST_PROJECT`] in the standard e2e records.
pub const TEST_KEY: &str = "aura_pk_e2e_0123456789abcdefghijklmnopqrstuvwxyz";
/// The project of the standard e2e records.
pub const TEST_PROJECT: &str = "e2e";
/// The owner of [`TEST_PROJECT`]'s organization.
pub const TEST_CONSOLE_USER: &str = "00000000-0000-4000-8000-0000000000ee";

/// The standard e2e records as a control file.
pub fn e2e_control_file() -> String {
    format!(
        r#"[[organizations]]
id = "00000000-0000-4000-8000-0000000000e0"
name = "e2e"

[[projects]]
ref = "{TEST_PROJECT}"
organization_id = "00000000-0000-4000-8000-0000000000e0"
db_engine = "postgres"
topology = "shared"

[[organization_members]]
organization_id = "00000000-0000-4000-8000-0000000000e0"
user_id = "{TEST_CONSOLE_USER}"
role = "owner"

[[api_keys]]
id = "00000000-0000-4000-8000-0000000000e1"
project_ref = "{TEST_PROJECT}"
role = "anon"
key_sha256 = "{}"
"#,
        aura_gateway::auth::keys::hash_key(TEST_KEY)
    )
}

/// A file store of the standard e2e records (in a fresh temporary file).
pub fn e2e_store() -> aura_gateway::control::file::FileStore {
    // Kept: the store writes beside its file (the policy history, stored modules).
    let dir = tempfile::tempdir().expect("tempdir").keep();
    let path = dir.join("e2e-control.toml");
    std::fs::write(&path, e2e_control_file()).expect("write");
    aura_gateway::control::file::FileStore::open(&path).expect("valid")
}

/// Puts `module` in the file store's module directory under `dir` and returns the control-file
/// record installing it as `project`'s `cors` module, as another instance would have written it.
pub fn stored_cors_module(dir: &Path, project: &str, module: &[u8]) -> String {
    let digest = aura_gateway::policy::digest_of(module);
    std::fs::create_dir_all(dir.join("modules")).expect("dir");
    std::fs::write(dir.join(format!("modules/{digest}.wasm")), module).expect("module");
    format!(
        "[[project_policies]]\nproject_ref = \"{project}\"\nstage = \"cors\"\ndigest = \"{digest}\"\nconfig = \"{{}}\"\n"
    )
}

/// The events of a file store's policy history under `dir` (every project's and the operator's,
/// every stage: one line each in `policy-history/<scope>/<stage>.jsonl`).
pub fn file_history_lines(dir: &Path) -> usize {
    let root = dir.join(aura_gateway::control::file_history::DIR);
    let Ok(scopes) = std::fs::read_dir(&root) else {
        return 0;
    };
    scopes
        .flatten()
        .filter_map(|scope| std::fs::read_dir(scope.path()).ok())
        .flat_map(|files| files.flatten())
        .filter(|f| f.path().extension().is_some_and(|x| x == "jsonl"))
        .map(|f| {
            std::fs::read_to_string(f.path())
                .map(|t| t.lines().count())
                .unwrap_or(0)
        })
        .sum()
}
