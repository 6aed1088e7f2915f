//! Identity: API keys and user JWTs on the data plane ([`data_plane`]), console JWTs and org
//! roles on the management plane ([`management`]). The result is the request's
//! [`crate::actor::Actor`].

pub mod bearer;
pub mod browser;
pub mod data_plane;
pub mod issuers;
pub mod jwt;
pub mod keys;
pub mod keyset;
pub mod management;
pub mod user_token;

use std::sync::Arc;
use std::time::Duration;

use self::browser::BrowserRule;
use self::jwt::JwtVerifier;
use self::keys::KeyResolver;
use crate::config::AuthConfig;
use crate::control::{ControlStore, ProjectRecord};
use crate::error::GatewayError;

/// `aud` of user tokens.
pub const USER_AUDIENCE: &str = "authenticated";
/// `aud` of console tokens.
pub const CONSOLE_AUDIENCE: &str = "aurabase-control";

/// Everything authentication needs, shared by both planes.
#[derive(Debug)]
pub struct Authenticator {
    /// The control store.
    pub store: Arc<dyn ControlStore>,
    keys: KeyResolver,
    projects: keys::Lookups<String, ProjectRecord>,
    user_jwt: Option<JwtVerifier>,
    console_jwt: Option<JwtVerifier>,
    /// Secret keys never from a browser.
    browser: BrowserRule,
    /// Projects' trusted issuers and their keys.
    pub issuers: issuers::Issuers,
    /// Clock skew tolerated on `exp` and `nbf`, in seconds.
    leeway: u64,
}

pub use crate::control::store_failed;

impl Authenticator {
    /// Builds the authenticator over `store`, resolving JWKS and issuer hosts with `resolver`;
    /// `metrics` counts user tokens and issuer key fetches. Fails on an `[auth.issuers]` it
    /// cannot use (its TLS files).
    pub fn new(
        config: &AuthConfig,
        store: Arc<dyn ControlStore>,
        resolver: &crate::dns::Resolver,
        metrics: Option<&crate::metrics::Metrics>,
    ) -> Result<Self, String> {
        let leeway = Duration::from_secs(config.leeway_secs);
        let stale = Duration::from_secs(config.stale_if_error_secs);
        let health = keys::StoreHealth::default();
        Ok(Self {
            keys: KeyResolver::new(
                store.clone(),
                Duration::from_secs(config.key_cache_ttl_secs),
                config.key_cache_capacity,
                stale,
                health.clone(),
            ),
            projects: keys::Lookups::new(
                Duration::from_secs(config.project_cache_ttl_secs),
                config.key_cache_capacity,
                keys::LastKnown::new(stale, config.key_cache_capacity, health),
            ),
            user_jwt: JwtVerifier::new(&config.user_jwt, USER_AUDIENCE, leeway, resolver),
            console_jwt: JwtVerifier::new(&config.console_jwt, CONSOLE_AUDIENCE, leeway, resolver),
            browser: BrowserRule::new(config),
            issuers: issuers::Issuers::new(&config.issuers, resolver, metrics)?,
            leeway: config.leeway_secs,
            store,
        })
    }

    /// Resolves an API key (cached, positive and negative).
    pub async fn resolve_key(
        &self,
        key: &str,
    ) -> Result<Option<Arc<keys::ResolvedKey>>, GatewayError> {
        self.keys.resolve(key).await.map_err(|e| store_failed(&e))
    }

    /// Forgets the cached lookups of one key, by its SHA-256 (hex).
    pub async fn forget_key(&self, sha256_hex: &str) -> bool {
        self.keys.forget(sha256_hex).await
    }

    /// Forgets the cached record of one project.
    pub async fn forget_project(&self, project_ref: &str) {
        self.projects.forget(project_ref, project_ref).await;
    }

    /// Forgets every cached key and project.
    pub fn forget_all(&self) {
        self.keys.forget_all();
        self.projects.forget_all();
    }

    /// A project (cached), for the data plane.
    pub async fn cached_project(
        &self,
        project_ref: &str,
    ) -> Result<Option<Arc<ProjectRecord>>, GatewayError> {
        self.projects
            .get(
                project_ref,
                || project_ref.to_owned(),
                || {
                    let store = self.store.clone();
                    let lookup = project_ref.to_owned();
                    async move { store.project(&lookup).await }
                },
            )
            .await
            .map_err(|e| store_failed(&e))
    }
}
