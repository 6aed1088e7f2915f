//! A data-plane user token: which keys verify it, chosen by its `iss`, then its `kid` — never
//! "the first key that fits".
//!
//! 1. The token's `iss` equals (byte for byte) one of the issuers the request's project trusts
//!    (the project of its API key): verified against that issuer's keys only, with that
//!    issuer's algorithms, audience and role rules.
//! 2. Otherwise, when `[auth.user_jwt]` has keys and either names no `issuer` or names this
//!    one: the platform's token, verified as before (`aud` exactly `authenticated`, `ref` the
//!    key's project).
//! 3. Otherwise: refused as `untrusted_issuer`, with no fetch and no key lookup.
//!
//! Every outcome is counted in `aura_user_jwts_total{issuer, outcome}`.

use std::sync::Arc;

use super::Authenticator;
use super::jwt::{JwtError, Peeked, peek, project_ref_claim, refuse, validate};
use crate::actor::{IssuerLabel, Role};
use crate::control::{IssuerRecord, ProjectRecord};

/// A verified user.
#[derive(Debug, Clone)]
pub struct UserIdentity {
    /// `sub`.
    pub subject: String,
    /// `authenticated`, or `anon` when a trusted issuer's role claim says so.
    pub role: Role,
    /// Every claim of the token.
    pub claims: Arc<serde_json::Value>,
    pub issuer: IssuerLabel,
}

/// A refused user token: why, and whose it claimed to be.
#[derive(Debug, Clone)]
pub struct Refused {
    pub error: JwtError,
    pub issuer: IssuerLabel,
}

impl Authenticator {
    /// Verifies `token` for a request authenticated by a key of `project_ref` (`project`: its
    /// record, with its trusted issuers).
    pub async fn verify_user_token(
        &self,
        token: &str,
        project_ref: &str,
        project: Option<&ProjectRecord>,
    ) -> Result<UserIdentity, Refused> {
        let trusted = project.map_or(&[][..], |p| p.issuers.as_slice());
        let platform_issuer = self.user_jwt.as_ref().and_then(|v| v.issuer());
        // `iss` is read only when it selects something.
        let need_iss = !trusted.is_empty() || platform_issuer.is_some();
        let result = match peek(token, need_iss) {
            Err(error) => Err(Refused {
                error,
                issuer: IssuerLabel::Untrusted,
            }),
            Ok(peeked) => {
                let record = peeked
                    .iss
                    .as_deref()
                    .and_then(|iss| trusted.iter().find(|r| r.issuer == iss));
                match (record, &self.user_jwt) {
                    (Some(record), _) => {
                        self.verify_project_token(token, &peeked, record, project_ref)
                            .await
                    }
                    (None, Some(verifier))
                        if platform_issuer.is_none()
                            || peeked.iss.as_deref() == platform_issuer =>
                    {
                        match verifier.verify_peeked(token, &peeked).await {
                            Ok(claims) if claims.project_ref.as_deref() == Some(project_ref) => {
                                Ok(UserIdentity {
                                    subject: claims.subject,
                                    role: Role::Authenticated,
                                    claims: claims.claims,
                                    issuer: IssuerLabel::Platform,
                                })
                            }
                            Ok(_) => Err(Refused {
                                error: refuse(
                                    "wrong_project",
                                    "the token was issued for another project",
                                ),
                                issuer: IssuerLabel::Platform,
                            }),
                            Err(error) => Err(Refused {
                                error,
                                issuer: IssuerLabel::Platform,
                            }),
                        }
                    }
                    (None, _) => Err(Refused {
                        error: refuse(
                            "untrusted_issuer",
                            "the token's issuer is not trusted by this project",
                        ),
                        issuer: IssuerLabel::Untrusted,
                    }),
                }
            }
        };
        match &result {
            Ok(user) => self.count_token(&user.issuer, "ok"),
            Err(refused) => self.count_token(&refused.issuer, refused.error.outcome),
        }
        result
    }

    fn count_token(&self, issuer: &IssuerLabel, outcome: &'static str) {
        let label = match issuer {
            IssuerLabel::Project { iss, .. } => self.issuers.label(iss),
            other => other.as_str().to_owned(),
        };
        self.issuers.count_token(&label, outcome);
    }

    async fn verify_project_token(
        &self,
        token: &str,
        peeked: &Peeked,
        record: &IssuerRecord,
        project_ref: &str,
    ) -> Result<UserIdentity, Refused> {
        let issuer = IssuerLabel::Project {
            id: record.id,
            iss: Arc::from(record.issuer.as_str()),
        };
        let refused = |error: JwtError| Refused {
            error,
            issuer: issuer.clone(),
        };
        let alg = peeked.alg;
        let accepted = record
            .algorithms
            .iter()
            .filter_map(|a| super::jwt::parse_algorithm(a))
            .any(|a| a == alg);
        if !accepted {
            return Err(refused(refuse(
                "algorithm",
                format!("algorithm {alg:?} is not accepted for this issuer"),
            )));
        }
        let source = self.issuers.source(record).map_err(|e| {
            refused(refuse(
                "unknown_kid",
                format!("the issuer's keys are not usable ({})", e.outcome),
            ))
        })?;
        let key = source.key(peeked.kid.as_deref(), alg).await.map_err(|_| {
            refused(refuse(
                "unknown_kid",
                "no signing key of this issuer matches",
            ))
        })?;
        let claims =
            validate(token, &key, alg, self.leeway, Some(&record.issuer)).map_err(refused)?;
        check_audience(record, &claims).map_err(refused)?;
        let role = role_of(record, &claims).map_err(refused)?;
        match project_ref_claim(&claims).map_err(refused)? {
            Some(r) if r != project_ref => {
                return Err(refused(refuse(
                    "wrong_project",
                    "the token was issued for another project",
                )));
            }
            _ => {}
        }
        let subject = claims
            .get("sub")
            .and_then(|s| s.as_str())
            .unwrap_or_default()
            .to_owned();
        Ok(UserIdentity {
            subject,
            role,
            claims: Arc::new(claims),
            issuer,
        })
    }
}

/// The audience rule of a trusted issuer: none configured, not checked; otherwise the claim
/// (`aud`, `azp` or `client_id`) is one of the accepted values, or an array holding at least
/// one (an identity provider adds audiences of its own, as Auth0 adds its `/userinfo`).
fn check_audience(record: &IssuerRecord, claims: &serde_json::Value) -> Result<(), JwtError> {
    if record.audiences.is_empty() {
        return Ok(());
    }
    let accepted = |v: &serde_json::Value| {
        v.as_str()
            .is_some_and(|a| record.audiences.iter().any(|x| x == a))
    };
    let ok = match claims.get(record.audience_claim.as_str()) {
        Some(serde_json::Value::Array(list)) => list.iter().any(accepted),
        Some(value) => accepted(value),
        None => false,
    };
    if ok {
        Ok(())
    } else {
        Err(refuse(
            "audience",
            format!(
                "the {} claim names no accepted audience",
                record.audience_claim
            ),
        ))
    }
}

/// The platform role a trusted issuer's token gives: `authenticated` without a role claim;
/// otherwise the claim (a dotted path) must be a string among the allowed roles.
fn role_of(record: &IssuerRecord, claims: &serde_json::Value) -> Result<Role, JwtError> {
    let Some(path) = &record.role_claim else {
        return Ok(Role::Authenticated);
    };
    let value = path
        .split('.')
        .try_fold(claims, |v, segment| v.get(segment))
        .and_then(|v| v.as_str());
    match value {
        Some(role) if record.allowed_roles.iter().any(|r| r == role) => match role {
            "anon" => Ok(Role::Anon),
            _ => Ok(Role::Authenticated),
        },
        _ => Err(refuse(
            "role",
            format!("the {path} claim names no allowed role"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(
        audiences: &[&str],
        claim: &str,
        role: Option<&str>,
        allowed: &[&str],
    ) -> IssuerRecord {
        IssuerRecord {
            id: uuid::Uuid::new_v4(),
            project_ref: "alpha".into(),
            issuer: "https://id.example".into(),
            jwks_url: None,
            keys: None,
            algorithms: vec!["RS256".into()],
            audience_claim: claim.into(),
            audiences: audiences.iter().map(|a| (*a).to_owned()).collect(),
            role_claim: role.map(str::to_owned),
            allowed_roles: allowed.iter().map(|a| (*a).to_owned()).collect(),
            created_at: None,
            created_by: None,
        }
    }

    #[test]
    fn an_audience_is_one_of_the_accepted_ones() {
        let r = record(&["api"], "aud", None, &["authenticated"]);
        assert!(check_audience(&r, &json!({ "aud": "api" })).is_ok());
        assert!(
            check_audience(
                &r,
                &json!({ "aud": ["https://id.example/userinfo", "api"] })
            )
            .is_ok()
        );
        for refused in [
            json!({}),
            json!({ "aud": "other" }),
            json!({ "aud": [] }),
            json!({ "aud": 3 }),
        ] {
            let e = check_audience(&r, &refused).expect_err("refused");
            assert_eq!(e.outcome, "audience");
        }
        let clerk = record(&["https://app.example"], "azp", None, &["authenticated"]);
        assert!(
            check_audience(&clerk, &json!({ "azp": "https://app.example", "aud": "x" })).is_ok()
        );
        assert!(check_audience(&clerk, &json!({ "aud": "https://app.example" })).is_err());
        let unchecked = record(&[], "aud", None, &["authenticated"]);
        assert!(check_audience(&unchecked, &json!({})).is_ok());
    }

    #[test]
    fn roles_come_from_the_claim_and_never_exceed_the_allowed_ones() {
        let none = record(&[], "aud", None, &["authenticated"]);
        assert_eq!(
            role_of(&none, &json!({ "role": "service_role" })).ok(),
            Some(Role::Authenticated)
        );
        let nested = record(
            &[],
            "aud",
            Some("metadata.role"),
            &["authenticated", "anon"],
        );
        assert_eq!(
            role_of(&nested, &json!({ "metadata": { "role": "anon" } })).ok(),
            Some(Role::Anon)
        );
        assert_eq!(
            role_of(&nested, &json!({ "metadata": { "role": "authenticated" } })).ok(),
            Some(Role::Authenticated)
        );
        for refused in [
            json!({ "metadata": { "role": "service_role" } }),
            json!({ "metadata": { "role": "console" } }),
            json!({ "metadata": "anon" }),
            json!({ "role": "anon" }),
            json!({}),
        ] {
            let e = role_of(&nested, &refused).expect_err("refused");
            assert_eq!(e.outcome, "role", "{refused}");
        }
        let only_users = record(&[], "aud", Some("role"), &["authenticated"]);
        assert!(role_of(&only_users, &json!({ "role": "anon" })).is_err());
    }
}
