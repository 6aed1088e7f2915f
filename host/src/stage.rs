//! The policy stages as the rest of the host names them: the table of stages (key, planes,
//! whether projects may install a module, whether a candidate may be tried) and how a candidate
//! is tried. Syntax only: the configuration, the control store and the CLI read it, and
//! [`crate::policy`] runs what it names.

use crate::plane::Plane;

/// A policy stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    /// Which credential a data-plane request carries.
    ApiKey,
    /// The CORS answer to a request with an `Origin`.
    Cors,
    /// The per-actor quota rule of a request.
    Quota,
    /// Where a `/v1/db/*` request goes.
    DbRouting,
}

/// What the host allows of one stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageInfo {
    /// The stage.
    pub stage: Stage,
    /// Its configuration key (`data_plane.plugins.<key>`) and label value.
    pub key: &'static str,
    /// The WIT interface its modules export (`aura:gateway/<interface>`).
    pub interface: &'static str,
    /// The planes it runs on.
    pub planes: &'static [Plane],
    /// Whether a project may install its own module (data plane).
    pub tenant: bool,
    /// Whether a candidate may be tried next to its module in force (shadow or canary).
    pub trials: bool,
}

/// The table of stages, in [`Stage::index`] order: every list of stages in the host is this one.
pub const STAGES: [StageInfo; 4] = [
    StageInfo {
        stage: Stage::ApiKey,
        key: "api_key",
        interface: "api-key",
        planes: &[Plane::Data],
        tenant: false,
        trials: false,
    },
    StageInfo {
        stage: Stage::Cors,
        key: "cors",
        interface: "cors",
        planes: &[Plane::Data, Plane::Management],
        tenant: true,
        trials: true,
    },
    StageInfo {
        stage: Stage::Quota,
        key: "quota",
        interface: "quota",
        planes: &[Plane::Data, Plane::Management],
        tenant: true,
        trials: true,
    },
    StageInfo {
        stage: Stage::DbRouting,
        key: "db_routing",
        interface: "db-routing",
        planes: &[Plane::Data, Plane::Management],
        tenant: false,
        trials: false,
    },
];

impl Stage {
    /// Every stage, in table order.
    pub const ALL: [Stage; 4] = [Stage::ApiKey, Stage::Cors, Stage::Quota, Stage::DbRouting];

    /// The stage's position in [`STAGES`] and [`Stage::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The stage's row of the table.
    pub const fn info(self) -> &'static StageInfo {
        &STAGES[self.index()]
    }

    /// The stage of a configuration key (`api_key`, `cors`, `quota`, `db_routing`).
    pub fn parse(key: &str) -> Option<Stage> {
        STAGES.iter().find(|s| s.key == key).map(|s| s.stage)
    }

    /// The stage of a key when projects may install a module for it.
    pub fn parse_tenant(key: &str) -> Option<Stage> {
        Stage::parse(key).filter(|s| s.info().tenant)
    }

    /// The stage's configuration key (`api_key`, `cors`, `quota`, `db_routing`).
    pub const fn key(self) -> &'static str {
        self.info().key
    }

    /// Whether the stage runs on `plane`.
    pub fn runs_on(self, plane: Plane) -> bool {
        self.info().planes.contains(&plane)
    }

    /// The keys of the stages projects may install, for messages (`cors, quota`).
    pub fn tenant_keys() -> String {
        STAGES
            .iter()
            .filter(|s| s.tenant)
            .map(|s| s.key)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.key())
    }
}

/// How a module decides: in force, or a candidate tried next to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// The module in force: it decides.
    Enforce,
    /// Runs and is compared; never decides.
    Shadow,
    /// Decides for a share of actors.
    Canary,
}

impl Mode {
    /// `enforce`, `shadow` or `canary`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Shadow => "shadow",
            Mode::Canary => "canary",
        }
    }

    /// The mode named `enforce`, `shadow` or `canary`.
    pub fn parse(name: &str) -> Option<Mode> {
        [Mode::Enforce, Mode::Shadow, Mode::Canary]
            .into_iter()
            .find(|m| m.as_str() == name)
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whose module: the operator's (a plane's, in force or tried) or a project's. The host acts on
/// a module by its owner: where its calls run, what a failure does, which rules bound its answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Owner {
    /// The operator's, from the configuration.
    Operator,
    /// A project's own.
    Tenant,
}

impl Owner {
    /// Label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Owner::Operator => "operator",
            Owner::Tenant => "tenant",
        }
    }
}

/// How a candidate module is tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trial {
    /// Runs and is compared; never decides.
    Shadow,
    /// Decides for this share of actors (1–100).
    Canary { percent: u8 },
}

impl Trial {
    /// The trial of a `mode` and `percent` as an API or a record gives them; `None` for
    /// `enforce`. The error names the field and the problem.
    pub fn parse(mode: &str, percent: Option<u8>) -> Result<Option<Trial>, String> {
        match (mode, percent) {
            ("enforce", None) => Ok(None),
            ("shadow", None | Some(0)) => Ok(Some(Trial::Shadow)),
            ("canary", Some(p @ 1..=100)) => Ok(Some(Trial::Canary { percent: p })),
            ("enforce" | "shadow", Some(_)) => {
                Err(format!("percent: only a canary has one, not mode {mode:?}"))
            }
            ("canary", _) => Err("percent: a canary needs a percent from 1 to 100".to_owned()),
            (other, _) => Err(format!(
                "mode: {other:?} is not one of enforce, shadow, canary"
            )),
        }
    }

    /// The mode of a candidate tried this way.
    pub const fn mode(self) -> Mode {
        match self {
            Trial::Shadow => Mode::Shadow,
            Trial::Canary { .. } => Mode::Canary,
        }
    }

    /// The mode of a module tried as `trial` (`None`: in force).
    pub fn mode_of(trial: Option<Trial>) -> Mode {
        trial.map_or(Mode::Enforce, Trial::mode)
    }

    /// The canary's share, 0 for a shadow.
    pub const fn percent(self) -> u8 {
        match self {
            Trial::Shadow => 0,
            Trial::Canary { percent } => percent,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_in_index_order_and_keys_round_trip() {
        for (i, stage) in Stage::ALL.into_iter().enumerate() {
            assert_eq!(stage.index(), i);
            assert_eq!(STAGES[i].stage, stage);
            assert_eq!(Stage::parse(stage.key()), Some(stage));
        }
        assert_eq!(Stage::parse("db-routing"), None);
        assert_eq!(Stage::parse_tenant("cors"), Some(Stage::Cors));
        assert_eq!(Stage::parse_tenant("api_key"), None);
        assert_eq!(Stage::tenant_keys(), "cors, quota");
        assert!(!Stage::ApiKey.runs_on(Plane::Management));
        assert!(Stage::DbRouting.runs_on(Plane::Management));
        for mode in [Mode::Enforce, Mode::Shadow, Mode::Canary] {
            assert_eq!(Mode::parse(mode.as_str()), Some(mode));
        }
    }

    #[test]
    fn trials_parse_and_name_the_field() {
        assert_eq!(Trial::parse("enforce", None), Ok(None));
        assert_eq!(Trial::parse("shadow", None), Ok(Some(Trial::Shadow)));
        assert_eq!(
            Trial::parse("canary", Some(10)),
            Ok(Some(Trial::Canary { percent: 10 }))
        );
        for (mode, percent) in [
            ("canary", None),
            ("canary", Some(0)),
            ("canary", Some(101)),
            ("shadow", Some(5)),
            ("enforce", Some(5)),
        ] {
            let e = Trial::parse(mode, percent).expect_err("refused");
            assert!(e.starts_with("percent:"), "{e}");
        }
        assert!(
            Trial::parse("dry-run", None)
                .expect_err("refused")
                .starts_with("mode:")
        );
    }
}
