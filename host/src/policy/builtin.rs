//! The default plugins, built from `plugins/` by `host/build.rs` and embedded in the binary.

/// The default `api-key` stage component.
pub const API_KEY: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/api_key.wasm"));
/// The default `cors` stage component.
pub const CORS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/cors.wasm"));
/// The default `quota` stage component.
pub const QUOTA: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/quota.wasm"));
/// The default `db-routing` stage component.
pub const DB_ROUTING: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/db_routing.wasm"));

/// Path of the hostile test plugin (`plugins/testing`), for the gateway's own tests. It is not
/// embedded in the binary.
#[doc(hidden)]
pub const TESTING_PLUGIN_PATH: &str = concat!(env!("OUT_DIR"), "/testing.wasm");

/// Path of the hostile quota test plugin (`plugins/testing-quota`), for the gateway's own tests.
/// It is not embedded in the binary.
#[doc(hidden)]
pub const TESTING_QUOTA_PLUGIN_PATH: &str = concat!(env!("OUT_DIR"), "/testing_quota.wasm");
