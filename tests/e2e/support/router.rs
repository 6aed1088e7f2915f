//! The data plane without sockets: a gateway's state with a project's module in force, and
//! requests as if from a client's address.

use std::net::SocketAddr;
use std::sync::Arc;

use aura_gateway::policy::Stage;
use aura_gateway::state::AppState;
use axum::body::Body;
use axum::extract::ConnectInfo;
use http::Request;

use super::fixture::Fixture;

/// `request`, without a body, as if it came from `peer`.
pub(crate) fn from(peer: &str, request: http::request::Builder) -> Request<Body> {
    let peer: SocketAddr = peer.parse().expect("addr");
    let mut request = request.body(Body::empty()).expect("request");
    request.extensions_mut().insert(ConnectInfo(peer));
    request
}

/// The state of a gateway over `fx`'s records with `config`, with `module` in force for
/// `stage` of alpha; and its digest.
pub(crate) async fn with_module(
    config: aura_gateway::config::Config,
    fx: &Fixture,
    stage: Stage,
    module: &[u8],
) -> (AppState, String, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(fx.file_store(dir.path()));
    let state = AppState::build_with_store(config, None, store);
    let state = state.await.expect("state");
    let tenants = &state.policies.tenants;
    let prepared = tenants.prepare("alpha", stage, module, "{}").await;
    let prepared = prepared.expect("module accepted");
    let digest = prepared.digest.clone();
    tenants.apply("alpha", stage, Some(prepared.installed));
    (state, digest, dir)
}
