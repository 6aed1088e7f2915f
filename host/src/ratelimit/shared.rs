//! Quotas shared by every gateway instance through Redis: GCRA (the generic cell rate
//! algorithm, a token bucket) in one small Lua script, on Redis server time.
//!
//! One key per bucket holds its theoretical arrival time (TAT); a request of cost `c` moves it
//! by `c` emission intervals (`1/rate`) and is admitted while the TAT stays within `burst`
//! intervals of now. The work per request is O(1) whatever the rule's figures: one `GET`, at
//! most one `SET`, a key of a few bytes with an expiry of the time the bucket takes to refill
//! (at most `rate_limit.max_bucket_ttl_secs`). The semantics are those of the local limiter
//! (governor, also GCRA): at most `burst` at once, `rate` per second over the long run, and
//! after a full burst admission again at `rate`.

use std::time::Duration;

use redis::aio::ConnectionManager;

use super::{Decision, Rule};

const SCRIPT: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = 1000000 / tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local max_ttl = tonumber(ARGV[4])
local tolerance = interval * burst
local tat = now
local stored = redis.call('GET', KEYS[1])
if stored then
  tat = tonumber(stored) or now
  if tat < now then tat = now end
end
local new_tat = tat + interval * cost
local allow_at = new_tat - tolerance
if allow_at > now then
  local remaining = math.floor((now - (tat - tolerance)) / interval)
  if remaining < 0 then remaining = 0 end
  return {0, remaining, math.ceil((allow_at - now) / 1000)}
end
local ttl = math.ceil((new_tat - now) / 1000)
if ttl > max_ttl then ttl = max_ttl end
if ttl < 1 then ttl = 1 end
redis.call('SET', KEYS[1], string.format('%.0f', new_tat), 'PX', ttl)
local remaining = math.floor((now - (new_tat - tolerance)) / interval)
if remaining < 0 then remaining = 0 end
return {1, remaining, math.ceil((new_tat - now) / 1000)}
"#;

/// The Redis side of the quota limiter.
pub struct RedisBuckets {
    conn: ConnectionManager,
    script: redis::Script,
    prefix: String,
    max_ttl_ms: u64,
}

impl std::fmt::Debug for RedisBuckets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBuckets")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisBuckets {
    /// Connects (bounded by `timeout`).
    pub async fn connect(
        url: &str,
        tls: Option<&crate::config::ClientTlsConfig>,
        prefix: &str,
        timeout: Duration,
        max_ttl: Duration,
    ) -> Result<Self, String> {
        crate::tls::install_crypto_provider();
        let client = match tls {
            None => redis::Client::open(url).map_err(|e| e.to_string())?,
            Some(tls) => {
                let read = |key: &str, path: &Option<String>| {
                    path.as_ref()
                        .map(|p| {
                            std::fs::read(p)
                                .map_err(|e| format!("rate_limit.redis_tls.{key}: {p}: {e}"))
                        })
                        .transpose()
                };
                let root_cert = read("ca_file", &tls.ca_file)?;
                let client_tls = match (
                    read("cert_file", &tls.cert_file)?,
                    read("key_file", &tls.key_file)?,
                ) {
                    (Some(client_cert), Some(client_key)) => Some(redis::ClientTlsConfig {
                        client_cert,
                        client_key,
                    }),
                    _ => None,
                };
                redis::Client::build_with_tls(
                    url,
                    redis::TlsCertificates {
                        client_tls,
                        root_cert,
                    },
                )
                .map_err(|e| e.to_string())?
            }
        };
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(timeout)
            .set_number_of_retries(1);
        let conn = tokio::time::timeout(
            timeout * 4,
            ConnectionManager::new_with_config(client, config),
        )
        .await
        .map_err(|_| "connection timed out".to_owned())?
        .map_err(|e| e.to_string())?;
        Ok(Self {
            conn,
            script: redis::Script::new(SCRIPT),
            prefix: prefix.to_owned(),
            max_ttl_ms: u64::try_from(max_ttl.as_millis()).unwrap_or(u64::MAX),
        })
    }

    /// Checks that Redis answers.
    pub async fn ping(&self) -> Result<(), redis::RedisError> {
        let mut conn = self.conn.clone();
        redis::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
            .map(|_| ())
    }

    /// Takes `rule.cost` tokens from the rule's bucket in Redis.
    pub async fn check(&self, rule: &Rule) -> Result<Decision, redis::RedisError> {
        let rate = rule.rate_per_second.max(1);
        let burst = rule.burst.max(1);
        let cost = rule.cost.clamp(1, burst);
        let key = format!("{}{}|{}|{}", self.prefix, rule.bucket, rate, burst);
        let mut conn = self.conn.clone();
        let (allowed, remaining, wait_ms): (i64, i64, i64) = self
            .script
            .key(key)
            .arg(rate)
            .arg(burst)
            .arg(cost)
            .arg(self.max_ttl_ms)
            .invoke_async(&mut conn)
            .await?;
        let remaining = u32::try_from(remaining.max(0)).unwrap_or(u32::MAX);
        let wait = Duration::from_millis(wait_ms.max(0) as u64);
        Ok(if allowed == 1 {
            Decision::allowed(burst, remaining.min(burst), wait)
        } else {
            Decision::denied(burst, wait)
        })
    }
}
