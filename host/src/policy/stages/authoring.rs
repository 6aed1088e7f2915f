//! What the binary gives plugin authors besides `plugin check`: the WIT package of each
//! accepted version (`aura-gateway wit`) and a buildable starting point in Rust, Python or
//! JavaScript (`aura-gateway plugin new`), made of the example plugin of that stage and language
//! with its configuration and test vectors.

use std::path::{Path, PathBuf};

use crate::policy::Stage;

/// The WIT package `aura:gateway` of an accepted version.
pub fn wit(version: &str) -> Option<&'static str> {
    match version {
        "0.5.0" => Some(include_str!("../../../../wit/gateway.wit")),
        "0.4.0" => Some(include_str!("../../../../wit/0.4.0/gateway.wit")),
        "0.3.0" => Some(include_str!("../../../../wit/0.3.0/gateway.wit")),
        "0.2.0" => Some(include_str!("../../../../wit/0.2.0/gateway.wit")),
        "0.1.0" => Some(include_str!("../../../../wit/0.1.0/gateway.wit")),
        _ => None,
    }
}

/// The componentize-py release the Python examples are built and tested with.
pub const COMPONENTIZE_PY: &str = "0.25.1";
/// The componentize-js release the JavaScript examples are built and tested with.
pub const COMPONENTIZE_JS: &str = "0.23.0";

/// A language a plugin can be written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lang {
    Rust,
    Python,
    Js,
}

impl Lang {
    /// `rust`, `python` or `js`.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "rust" => Some(Lang::Rust),
            "python" => Some(Lang::Python),
            "js" => Some(Lang::Js),
            _ => None,
        }
    }
}

/// The WIT world of a stage (`cors-stage`).
pub fn world(stage: Stage) -> &'static str {
    match stage {
        Stage::ApiKey => "api-key-stage",
        Stage::Cors => "cors-stage",
        Stage::Quota => "quota-stage",
        Stage::DbRouting => "db-routing-stage",
    }
}

/// (file name, contents) of the example of `stage` in `lang`.
fn example(stage: Stage, lang: Lang) -> (&'static str, &'static str) {
    macro_rules! examples {
        ($($stage:ident => $dir:literal),*) => {
            match (stage, lang) {
                $(
                    (Stage::$stage, Lang::Rust) => ("src/lib.rs", include_str!(concat!("../../../../examples/plugins/rust/", $dir, "/src/lib.rs"))),
                    (Stage::$stage, Lang::Python) => ("app.py", include_str!(concat!("../../../../examples/plugins/python/", $dir, "/app.py"))),
                    (Stage::$stage, Lang::Js) => ("plugin.js", include_str!(concat!("../../../../examples/plugins/js/", $dir, "/plugin.js"))),
                )*
            }
        };
    }
    examples!(ApiKey => "api-key", Cors => "cors", Quota => "quota", DbRouting => "db-routing")
}

/// (config.toml, vectors.toml) of the example of `stage`.
fn example_cases(stage: Stage) -> (&'static str, &'static str) {
    macro_rules! cases {
        ($dir:literal) => {
            (
                include_str!(concat!(
                    "../../../../examples/plugins/vectors/",
                    $dir,
                    "/config.toml"
                )),
                include_str!(concat!(
                    "../../../../examples/plugins/vectors/",
                    $dir,
                    "/vectors.toml"
                )),
            )
        };
    }
    match stage {
        Stage::ApiKey => cases!("api-key"),
        Stage::Cors => cases!("cors"),
        Stage::Quota => cases!("quota"),
        Stage::DbRouting => cases!("db-routing"),
    }
}

/// The commands that build the plugin in `lang`, run in its folder; the module lands in
/// `<stage>.wasm` (Rust: under `target/`).
pub fn build_commands(stage: Stage, lang: Lang, crate_name: &str) -> Vec<String> {
    let world = world(stage);
    let out = format!("{}.wasm", stage.key());
    match lang {
        Lang::Rust => vec![
            "rustup target add wasm32-wasip2".to_owned(),
            "cargo build --release --target wasm32-wasip2".to_owned(),
            format!(
                "cp target/wasm32-wasip2/release/{}.wasm {out}",
                crate_name.replace('-', "_")
            ),
        ],
        Lang::Python => vec![
            format!("python3 -m pip install componentize-py=={COMPONENTIZE_PY}"),
            format!("componentize-py -d wit -w {world} componentize app -o {out}"),
        ],
        Lang::Js => vec![
            format!("npm install @bytecodealliance/componentize-js@{COMPONENTIZE_JS}"),
            // `wasi:http` is not granted to plugins: leave it out of the component.
            format!(
                "npx componentize-js --wit wit --world-name {world} --disable http fetch-event --out {out} plugin.js"
            ),
        ],
    }
}

/// Writes a new plugin of `stage` in `lang` into `dir` (which must not exist or be empty):
/// the example's source, `wit/gateway.wit`, `config.toml`, `vectors.toml` and a `README.md`
/// with the build and check commands. Returns the files written.
pub fn scaffold(stage: Stage, lang: Lang, dir: &Path) -> Result<Vec<PathBuf>, String> {
    if dir
        .read_dir()
        .map(|mut entries| entries.next().is_some())
        .unwrap_or(false)
    {
        return Err(format!(
            "{}: exists and is not empty; choose a new folder",
            dir.display()
        ));
    }
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .map(crate_name)
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| format!("{}-plugin", stage.key().replace('_', "-")));
    let (source_path, source) = example(stage, lang);
    // The example points at the repository's WIT (bindings, build comment); the new plugin has
    // its own copy.
    let source = source.replace("../../../../wit", "wit");
    let (config, vectors) = example_cases(stage);
    let mut files: Vec<(PathBuf, String)> = vec![
        (source_path.into(), source),
        (
            "wit/gateway.wit".into(),
            wit("0.5.0").unwrap_or_default().to_owned(),
        ),
        ("config.toml".into(), config.to_owned()),
        ("vectors.toml".into(), vectors.to_owned()),
        ("README.md".into(), readme(stage, lang, &name)),
    ];
    if lang == Lang::Rust {
        files.push(("Cargo.toml".into(), cargo_toml(&name)));
    }
    let mut written = Vec::new();
    for (path, contents) in files {
        let path = dir.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        write_new(&path, contents.as_bytes()).map_err(|e| format!("{}: {e}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

/// Creates `path` with `contents`; fails if anything is there already — a file, or a link
/// planted to make the write land elsewhere (`O_EXCL | O_NOFOLLOW`).
pub fn write_new(path: &std::path::Path, contents: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .mode(0o644)
        .open(path)?;
    file.write_all(contents)?;
    file.sync_all()
}

/// Writes `contents` to `path`, replacing what is there: through a new file beside it
/// ([`write_new`]) renamed over `path`, so that a link planted at `path` is replaced, never
/// followed.
pub fn replace_file(path: &std::path::Path, contents: &[u8]) -> std::io::Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", uuid::Uuid::new_v4().simple()));
    write_new(&tmp, contents)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// A Cargo package name made of a folder name.
fn crate_name(folder: &str) -> String {
    let name: String = folder
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let name = name.trim_matches('-').to_owned();
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        format!("plugin-{name}")
    } else {
        name
    }
}

fn cargo_toml(name: &str) -> String {
    format!(
        r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"
publish = false

[workspace]

[lib]
crate-type = ["cdylib"]

[dependencies]
wit-bindgen = {{ version = "0.61", default-features = false, features = ["macros", "realloc"] }}
serde = {{ version = "1", features = ["derive"] }}
serde_json = "1"

[profile.release]
opt-level = "s"
lto = true
panic = "abort"
strip = true
"#
    )
}

fn readme(stage: Stage, lang: Lang, name: &str) -> String {
    let commands = build_commands(stage, lang, name).join("\n");
    let key = stage.key();
    format!(
        "# {name}\n\n\
         A plugin for the `{key}` stage of Aura gateway (`aura:gateway@0.5.0`, world `{world}`).\n\
         `wit/gateway.wit` is the plugin API (`aura-gateway wit` prints it); `config.toml` is the\n\
         stage's configuration; `vectors.toml` holds test cases: an input and the decision expected.\n\n\
         Build:\n\n```sh\n{commands}\n```\n\n\
         Check (loads it as the gateway would, runs the gateway's conformance vectors and yours):\n\n\
         ```sh\naura-gateway plugin check {key}.wasm --stage {key} --config config.toml --vectors vectors.toml\n```\n\n\
         Put it in force: name it in the gateway's configuration\n\
         (`[data_plane.plugins.{key}] module = \"{key}.wasm\"`, with the contents of `config.toml`\n\
         as its `config`), or install it for one project through the policy API\n\
         (`PUT /v1/projects/{{ref}}/policies/{key}`). `docs/plugin-guide.md` has the details.\n",
        world = world(stage),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_planted_link_is_replaced_never_written_through() {
        let dir = tempfile::tempdir().expect("tempdir");
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "keep").expect("write");
        let out = dir.path().join("gateway.wit");
        std::os::unix::fs::symlink(&victim, &out).expect("link");
        assert!(
            write_new(&out, b"x").is_err(),
            "a link is not written through"
        );
        replace_file(&out, b"wit").expect("replaced");
        assert_eq!(std::fs::read_to_string(&victim).expect("read"), "keep");
        assert_eq!(std::fs::read_to_string(&out).expect("read"), "wit");
        assert!(!std::fs::symlink_metadata(&out).expect("meta").is_symlink());
        replace_file(&out, b"again").expect("replaced again");
        assert_eq!(std::fs::read_to_string(&out).expect("read"), "again");
        assert_eq!(
            std::fs::read_dir(dir.path()).expect("dir").count(),
            2,
            "no temporary left"
        );
    }

    #[test]
    fn the_five_wit_versions_are_served_and_others_refused() {
        for version in ["0.5.0", "0.4.0", "0.3.0", "0.2.0", "0.1.0"] {
            let package = format!("package aura:gateway@{version};");
            assert!(
                wit(version).is_some_and(|w| w.contains(&package)),
                "{version}"
            );
        }
        assert!(wit("0.6.0").is_none());
        assert!(wit("0.3").is_none());
    }

    #[test]
    fn folder_names_become_package_names() {
        assert_eq!(crate_name("My CORS"), "my-cors");
        assert_eq!(crate_name("2fa"), "plugin-2fa");
    }

    #[test]
    fn a_scaffold_is_complete_and_never_overwrites() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("my-cors");
        let files = scaffold(Stage::Cors, Lang::Rust, &target).expect("scaffold");
        assert_eq!(files.len(), 6);
        let lib = std::fs::read_to_string(target.join("src/lib.rs")).expect("lib.rs");
        assert!(lib.contains("path: \"wit\""), "the WIT path is the copy's");
        assert!(
            std::fs::read_to_string(target.join("Cargo.toml"))
                .expect("Cargo.toml")
                .contains("name = \"my-cors\"")
        );
        let err = scaffold(Stage::Cors, Lang::Python, &target).expect_err("refused");
        assert!(err.contains("not empty"), "{err}");
        for lang in [Lang::Python, Lang::Js] {
            let d = dir.path().join(format!("{lang:?}"));
            scaffold(Stage::Quota, lang, &d).expect("scaffold");
            let readme = std::fs::read_to_string(d.join("README.md")).expect("readme");
            assert!(readme.contains("quota-stage"), "{readme}");
        }
    }
}
