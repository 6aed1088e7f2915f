//! The default plugins, built from `plugins/` by `host/build.rs` and embedded in the binary:
//! each stage's is its [`PolicyStage::BUILTIN`]; two are named here for tools and tests.

use super::{Cors, PolicyStage, Quota};

/// The default `cors` stage component.
pub const CORS: &[u8] = Cors::BUILTIN;
/// The default `quota` stage component.
pub const QUOTA: &[u8] = Quota::BUILTIN;

/// Path of the hostile test plugin (`plugins/testing`), for the gateway's own tests. It is not
/// embedded in the binary.
#[doc(hidden)]
pub const TESTING_PLUGIN_PATH: &str = concat!(env!("OUT_DIR"), "/testing.wasm");

/// Path of the hostile quota test plugin (`plugins/testing-quota`), for the gateway's own tests.
/// It is not embedded in the binary.
#[doc(hidden)]
pub const TESTING_QUOTA_PLUGIN_PATH: &str = concat!(env!("OUT_DIR"), "/testing_quota.wasm");

/// Path of the `0.2.0` test plugin (`plugins/testing-legacy`), for the gateway's own tests that
/// plugins of every accepted version load. Not embedded.
pub const TESTING_LEGACY_PLUGIN_PATH: &str = concat!(env!("OUT_DIR"), "/testing_legacy.wasm");

/// Path of the hostile db-routing test plugin (`plugins/testing-db`), for the gateway's own
/// tests. Not embedded.
pub const TESTING_DB_PLUGIN_PATH: &str = concat!(env!("OUT_DIR"), "/testing_db.wasm");

/// Path of the hostile `0.3.0` quota test plugin (`plugins/testing-quota-inputs`), for the
/// gateway's own tests of the quota inputs' bounds, denials and schemas. Not embedded.
pub const TESTING_QUOTA_INPUTS_PLUGIN_PATH: &str =
    concat!(env!("OUT_DIR"), "/testing_quota_inputs.wasm");

/// Path of the `0.3.0` api-key test plugin (`plugins/testing-api-key`), for the gateway's own
/// tests that an `api-key` module of that version loads with its declaration. Not embedded.
pub const TESTING_API_KEY_PLUGIN_PATH: &str = concat!(env!("OUT_DIR"), "/testing_api_key.wasm");
