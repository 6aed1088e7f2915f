//! Benchmark-only: the default policies compiled into the host (`--features native-policies`).
//!
//! Built with the feature and started with `BENCH_AURA_NATIVE_POLICIES=1`, the gateway answers
//! every stage that runs a built-in module with the same policy code called natively instead of
//! through the sandbox, so that `bench/run` can measure the price of the sandbox on one binary.
//! Each stage's adapter (`Native`) is in its file under [`crate::policy::stages`].
//! The wasm modules are still compiled, checked and configured as usual (a configuration the
//! module refuses is refused the same way); only the per-request call changes. Never for
//! production: a native policy has no deadline, memory cap or fault isolation.

use std::sync::OnceLock;

use crate::config;
use crate::plane::Plane;

/// Whether this process answers built-in stages natively (`BENCH_AURA_NATIVE_POLICIES=1`).
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        let on = std::env::var("BENCH_AURA_NATIVE_POLICIES").is_ok_and(|v| v == "1");
        if on {
            tracing::warn!(
                "BENCH_AURA_NATIVE_POLICIES=1: built-in policy stages run natively, without \
                 the sandbox (benchmark builds only)"
            );
        }
        on
    })
}

/// A default policy compiled into the host.
pub trait NativePolicy: Sized + Send + Sync + std::fmt::Debug {
    /// The policy configured with `config` on `plane`; `None` when the configuration is refused.
    fn configure(plane: Plane, config: &str) -> Option<Self>;

    /// The native policy standing for a module named `module` with `config` on `plane`, when
    /// this process answers built-in stages natively (and the configuration is accepted).
    fn load(module: &str, plane: Plane, config: &str) -> Option<Self> {
        wanted(module)
            .then(|| Self::configure(plane, config))
            .flatten()
    }
}

/// Whether a module named `module` is answered natively.
fn wanted(module: &str) -> bool {
    module == config::BUILTIN && enabled()
}

/// Declares a stage's native policy: `$name`, a newtype over its plugin crate's `Policy`,
/// configured by `$configure` (a `Result`; an error refuses the configuration).
macro_rules! native_policy {
    ($name:ident($policy:ty), |$plane:pat_param, $config:ident| $configure:expr) => {
        #[doc = concat!("The native policy of `", stringify!($name), "`.")]
        #[derive(Debug)]
        pub struct $name($policy);

        impl $crate::policy::stages::native::NativePolicy for $name {
            fn configure($plane: $crate::plane::Plane, $config: &str) -> Option<Self> {
                $configure.ok().map(Self)
            }
        }
    };
}
pub(crate) use native_policy;
