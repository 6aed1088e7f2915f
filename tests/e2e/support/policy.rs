//! Projects' policy modules: the modules the tests install, and a console user's calls on
//! `/v1/projects/{project}/policies/{stage}`.

use std::time::Duration;

use base64::Engine as _;
use reqwest::Method;
use serde_json::{Value, json};

use super::call::{Answer, Call};
use super::fixture::{Fixture, console_token};

/// `bytes` in base64, as an upload carries a module.
pub fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The testing CORS module (it traps, spins, sleeps… on the origins that ask it to).
pub fn testing_cors() -> Vec<u8> {
    std::fs::read(aura_gateway::policy::stages::builtin::TESTING_PLUGIN_PATH)
        .expect("testing plugin")
}

/// The testing quota module.
pub fn testing_quota() -> Vec<u8> {
    std::fs::read(aura_gateway::policy::stages::builtin::TESTING_QUOTA_PLUGIN_PATH)
        .expect("testing quota plugin")
}

/// A module's digest.
pub fn digest(bytes: &[u8]) -> String {
    aura_gateway::policy::digest_of(bytes)
}

/// `GET /health` (`health`: its URL on a data plane) with `key` and a CORS `Origin`: what a
/// project's CORS decision looks like.
pub async fn cors_probe(health: String, key: &str) -> Answer {
    let health = Call::get(health).key(key);
    health.origin("https://a.example").read().await
}

/// A console user's calls on one project's policies (`alpha` unless told).
#[derive(Debug, Clone)]
pub struct Policies {
    root: String,
    token: String,
    project: String,
    timeout: Option<Duration>,
}

impl Policies {
    /// On the management plane at `root` (`gw.mgmt_url("")`), with the console token `token`.
    pub fn new(root: String, token: impl Into<String>) -> Self {
        Self {
            root,
            token: token.into(),
            project: "alpha".into(),
            timeout: None,
        }
    }

    /// The same user on `project`.
    pub fn of(&self, project: &str) -> Self {
        Self {
            project: project.into(),
            ..self.clone()
        }
    }

    /// Every call given up after `timeout`.
    pub fn timeout(self, timeout: Duration) -> Self {
        Self {
            timeout: Some(timeout),
            ..self
        }
    }

    /// `…/policies/{stage}{tail}`.
    pub fn url(&self, stage: &str, tail: &str) -> String {
        format!(
            "{}/v1/projects/{}/policies/{stage}{tail}",
            self.root, self.project
        )
    }

    /// `method …/policies/{stage}{tail}` with the token.
    pub fn call(&self, method: Method, stage: &str, tail: &str) -> Call {
        let call = Call::new(method, self.url(stage, tail)).bearer(&self.token);
        match self.timeout {
            Some(timeout) => call.timeout(timeout),
            None => call,
        }
    }

    /// `PUT` of `body`.
    pub async fn put(&self, stage: &str, body: Value) -> Answer {
        self.call(Method::PUT, stage, "").json(&body).read().await
    }

    /// `PUT` of `module` with `config`.
    pub async fn install(&self, stage: &str, module: &[u8], config: Value) -> Answer {
        let body = json!({ "module": b64(module), "config": config });
        self.put(stage, body).await
    }

    /// [`Policies::install`], which must succeed.
    pub async fn install_ok(&self, stage: &str, module: &[u8], config: Value) -> Answer {
        let answer = self.install(stage, module, config).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        answer
    }

    /// `GET`.
    pub async fn get(&self, stage: &str) -> Answer {
        self.call(Method::GET, stage, "").read().await
    }

    /// The body of `GET`, which must succeed.
    pub async fn body(&self, stage: &str) -> Value {
        let (status, body) = self.get(stage).await.parts();
        assert_eq!(status, 200, "{body}");
        body
    }

    /// `POST …/{action}`.
    pub async fn post(&self, stage: &str, action: &str) -> Answer {
        self.call(Method::POST, stage, &format!("/{action}"))
            .read()
            .await
    }

    /// `DELETE`.
    pub async fn delete(&self, stage: &str) -> Answer {
        self.call(Method::DELETE, stage, "").read().await
    }

    /// The events of `GET …/history{query}`, which must succeed.
    pub async fn history_of(&self, stage: &str, query: &str) -> Vec<Value> {
        let tail = format!("/history{query}");
        let body = self
            .call(Method::GET, stage, &tail)
            .expect(200)
            .await
            .json();
        body["events"].as_array().expect("events").clone()
    }

    /// The events of `GET …/history`, which must succeed.
    pub async fn history(&self, stage: &str) -> Vec<Value> {
        self.history_of(stage, "").await
    }
}

/// The fixture's admin on `gw`'s alpha, uploads given up after a minute.
pub(crate) fn admin(gw_mgmt: String, fx: &Fixture) -> Policies {
    Policies::new(gw_mgmt, console_token(fx.admin)).timeout(Duration::from_secs(60))
}
