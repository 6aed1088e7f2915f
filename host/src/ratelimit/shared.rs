//! Quotas shared by every gateway instance through Redis: a sliding-window log in one atomic
//! Lua script, on Redis server time, with a unique member per request and an expiry per key.
//!
//! Semantics next to the local token bucket: a rule of `rate` per second with `burst` becomes a
//! window of `burst / rate` seconds admitting `burst` requests. Both admit at most `burst` at
//! once and `rate` per second over the long run; after a full burst the token bucket admits
//! again at once at `rate`, while the window admits again as the burst ages out of it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::ConnectionManager;

use super::{Decision, Rule};

const SCRIPT: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local count = redis.call('ZCARD', KEYS[1])
if count + cost <= limit then
  for i = 1, cost do
    redis.call('ZADD', KEYS[1], now, ARGV[4] .. ':' .. i)
  end
  redis.call('PEXPIRE', KEYS[1], window)
  return {1, limit - count - cost, window}
end
local need = count + cost - limit
local oldest = redis.call('ZRANGE', KEYS[1], need - 1, need - 1, 'WITHSCORES')
local retry = window
if oldest[2] then retry = tonumber(oldest[2]) + window - now end
if retry < 1 then retry = 1 end
return {0, limit - count, retry}
"#;

/// The Redis side of the quota limiter.
pub struct RedisWindow {
    conn: ConnectionManager,
    script: redis::Script,
    prefix: String,
    instance: String,
    counter: AtomicU64,
}

impl std::fmt::Debug for RedisWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisWindow")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisWindow {
    /// Connects (bounded by `timeout`).
    pub async fn connect(url: &str, prefix: &str, timeout: Duration) -> Result<Self, String> {
        let client = redis::Client::open(url).map_err(|e| e.to_string())?;
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
            instance: uuid::Uuid::new_v4().simple().to_string(),
            counter: AtomicU64::new(0),
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

    /// Takes `rule.cost` slots of the rule's window in Redis.
    pub async fn check(&self, rule: &Rule) -> Result<Decision, redis::RedisError> {
        let rate = rule.rate_per_second.max(1);
        let burst = rule.burst.max(1);
        let window_ms = (u64::from(burst) * 1000).div_ceil(u64::from(rate)).max(1);
        let cost = rule.cost.clamp(1, burst);
        let member = format!(
            "{}:{}",
            self.instance,
            self.counter.fetch_add(1, Ordering::Relaxed)
        );
        let key = format!("{}{}|{}|{}", self.prefix, rule.bucket, rate, burst);
        let mut conn = self.conn.clone();
        let (allowed, remaining, wait_ms): (i64, i64, i64) = self
            .script
            .key(key)
            .arg(window_ms)
            .arg(burst)
            .arg(cost)
            .arg(member)
            .invoke_async(&mut conn)
            .await?;
        let remaining = remaining.max(0) as u32;
        let wait = Duration::from_millis(wait_ms.max(0) as u64);
        Ok(if allowed == 1 {
            Decision::allowed(burst, remaining, wait)
        } else {
            Decision::denied(burst, wait)
        })
    }
}
