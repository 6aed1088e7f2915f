//! End-to-end tests of the gateway: the chain without sockets, the policy runtime on the built
//! components, and both planes over real sockets against a real `nats-server`.

mod support;

mod admin;
mod backends;
mod chain;
mod cli;
mod client_faults;
mod control_store;
mod decisions;
mod edge;
mod examples;
mod fleet;
mod forwarding;
mod hostile;
mod hot_swap;
mod http1;
mod identity;
mod issuers;
mod jwks;
mod keep_alive;
mod listener;
mod nats;
mod nats_cluster;
mod operability;
mod paths;
mod plugins;
mod policy_history;
mod policy_rollout;
mod quota_rules;
mod ratelimit;
mod readiness;
mod resolver;
mod secret_keys;
mod shutdown;
mod tenant_scale;
mod tenant_uploads;
mod tenants;
mod timeouts;
mod tls;
mod tls_backends;
mod trace_context;
mod upstream_pool;
