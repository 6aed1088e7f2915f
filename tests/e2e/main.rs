//! End-to-end tests of the gateway: the chain without sockets, the policy runtime on the built
//! components, and both planes over real sockets against a real `nats-server`.

mod support;

mod admin;
mod backends;
mod bench_binary;
mod binary;
mod chain;
mod client_faults;
mod control_store;
mod decisions;
mod edge;
mod examples;
mod fleet;
mod hardening_edge;
mod hardening_fleet;
mod hardening_history;
mod hardening_isolation;
mod hardening_listener;
mod hardening_misc;
mod hardening_tenants;
mod hostile;
mod hot_swap;
mod http1;
mod identity;
mod image;
mod issuers;
mod jwks;
mod keep_alive;
mod nats;
mod nats_cluster;
mod operability;
mod pgo;
mod plugins;
mod policy_history;
mod policy_rollout;
mod ratelimit;
mod readiness;
mod resolver;
mod secret_keys;
mod tenants;
mod timeouts;
mod tls;
mod tls_backends;
mod trace_context;
mod upstream_pool;
