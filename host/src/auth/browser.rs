//! Secret keys never from a browser: a `service_role` key on a request a browser made is refused
//! (`401 secret_key_from_browser`), unless the operator allows it everywhere
//! (`auth.secret_keys_from_browsers = "allow"`) or the key's project allows it
//! (`browser_secret_keys`). Whoever opens a page can read every key it holds; a browser must
//! only ever hold a project's `anon` key.
//!
//! What marks a request as a browser's is `auth.browser_signals`: by default an `Origin` header
//! (browsers send it on every cross-origin request and every non-GET request) or a
//! `Sec-Fetch-Site` header (a forbidden header name: a page's scripts can neither set nor remove
//! it, and server-side clients do not send it). `Sec-Fetch-Mode: cors` alone is not a browser by
//! default: Node's built-in `fetch` sends it from servers too.

use http::HeaderMap;

use crate::config::{AuthConfig, BrowserSignal, SecretKeysFromBrowsers};
use crate::error::GatewayError;

/// The rule, from `[auth]`.
#[derive(Debug, Clone)]
pub struct BrowserRule {
    refuse: bool,
    signals: Vec<BrowserSignal>,
}

impl BrowserRule {
    /// The rule `config` sets.
    pub fn new(config: &AuthConfig) -> Self {
        Self {
            refuse: config.secret_keys_from_browsers == SecretKeysFromBrowsers::Refuse,
            signals: config.browser_signals.clone(),
        }
    }

    /// The signal that makes `headers` a browser's request, if any.
    pub fn browser_signal(&self, headers: &HeaderMap) -> Option<BrowserSignal> {
        self.signals.iter().copied().find(|s| s.seen_in(headers))
    }

    /// Checks a request authenticated by a `service_role` key whose project allows secret keys
    /// from browsers (`project_allows`) or not.
    pub fn check_secret_key(
        &self,
        headers: &HeaderMap,
        project_allows: bool,
    ) -> Result<(), GatewayError> {
        if !self.refuse || project_allows {
            return Ok(());
        }
        match self.browser_signal(headers) {
            None => Ok(()),
            Some(signal) => Err(GatewayError::unauthorized(
                "secret_key_from_browser",
                format!(
                    "a service_role key may not be used from a browser (the request carries {}); \
                     use the project's anon key, or allow secret keys from browsers for the \
                     project (auth-settings)",
                    signal.header()
                ),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(list: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in list {
            map.append(*name, http::HeaderValue::from_static(value));
        }
        map
    }

    fn rule(allow: bool, signals: &[BrowserSignal]) -> BrowserRule {
        let mut config = AuthConfig::default();
        if allow {
            config.secret_keys_from_browsers = SecretKeysFromBrowsers::Allow;
        }
        if !signals.is_empty() {
            config.browser_signals = signals.to_vec();
        }
        BrowserRule::new(&config)
    }

    #[test]
    fn browsers_are_told_from_servers_by_the_configured_signals() {
        let default = rule(false, &[]);
        // What a browser's fetch sends, same-origin GET included (Sec-Fetch-Site).
        let browser = headers(&[
            ("origin", "https://app.example"),
            ("sec-fetch-site", "cross-site"),
            ("sec-fetch-mode", "cors"),
        ]);
        let same_origin_get = headers(&[("sec-fetch-site", "same-origin")]);
        let null_origin = headers(&[("origin", "null")]);
        // Node's fetch (undici) on a server: Sec-Fetch-Mode: cors, no Origin, no Sec-Fetch-Site.
        let node = headers(&[("sec-fetch-mode", "cors"), ("user-agent", "node")]);
        let curl = headers(&[("user-agent", "curl/8")]);
        for refused in [&browser, &same_origin_get, &null_origin] {
            let e = default
                .check_secret_key(refused, false)
                .expect_err("refused");
            assert_eq!(e.code, "secret_key_from_browser");
            assert_eq!(e.status, http::StatusCode::UNAUTHORIZED);
        }
        for server in [&node, &curl] {
            assert!(default.check_secret_key(server, false).is_ok());
        }
        // The project's opt-in, and the operator's.
        assert!(default.check_secret_key(&browser, true).is_ok());
        assert!(rule(true, &[]).check_secret_key(&browser, false).is_ok());
        // The literal rule, for an operator whose servers never use Node's fetch.
        let strict = rule(false, &[BrowserSignal::Origin, BrowserSignal::SecFetchMode]);
        assert!(strict.check_secret_key(&node, false).is_err());
        let other_mode = headers(&[("sec-fetch-mode", "navigate")]);
        assert!(strict.check_secret_key(&other_mode, false).is_ok());
        // Only Origin: Sec-Fetch-Site alone is then not a browser.
        let origin_only = rule(false, &[BrowserSignal::Origin]);
        assert!(
            origin_only
                .check_secret_key(&same_origin_get, false)
                .is_ok()
        );
        assert!(origin_only.check_secret_key(&null_origin, false).is_err());
    }

    #[test]
    fn the_refusal_names_the_signal() {
        let e = rule(false, &[])
            .check_secret_key(&headers(&[("sec-fetch-site", "none")]), false)
            .expect_err("refused");
        assert!(e.to_string().contains("sec-fetch-site"), "{e}");
    }
}
