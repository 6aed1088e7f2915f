//! A hostile `cors` stage plugin for the gateway's sandbox tests. Not shipped in the binary.
//!
//! The behaviour is chosen per request by the origin's host, so one module exercises every
//! failure while other requests keep being answered:
//! - `https://trap.test` traps (`unreachable`);
//! - `https://loop.test` loops forever (stopped by the epoch deadline);
//! - `https://grow.test` grows memory without bound (stopped by the memory cap);
//! - `https://recurse.test` recurses without bound (stack overflow trap);
//! - `https://log.test` writes a `log` line, a stdout line and a stderr line, then allows;
//! - `https://flood.test` writes 1,000 `log` lines of 1 MiB each and 1 MiB to stdout, then
//!   allows;
//! - `https://sleep.test` sleeps for 10 s (WASI monotonic clock), then allows;
//! - `https://file.test` tries to open `/etc/passwd` and reads the environment: allows with
//!   `allow-headers` naming what it could do (`file`, `env`), denies when it could do neither;
//! - `https://random.test` asks the host for 1 MiB of random bytes in one call;
//! - `https://socket.test` tries to connect a TCP socket to 127.0.0.1:4222, allows only when it
//!   could;
//! - any other origin is allowed by echoing it, with `x-testing-plugin` exposed, so a test can
//!   tell this module's answers from the default plugin's.
//!
//! `configure` checks the configuration against its schema's types (`config-schema`), and
//! declares its inputs when `"declare": [...]` names them (`"max_age_ms"`, default 60 s; without
//! it the module declares nothing); with `"expose_path": true` every origin is echoed with a
//! header naming the request's path exposed (a decision that depends on the path).
//! `configure` refuses a configuration containing `"refuse": true`; with `"trap_always": true`
//! every call traps; with `"spin_always": true` every call loops until its deadline; with `"echo_all": true` every origin is echoed (none is hostile); with
//! `"spin_configure_after_ms": T` (milliseconds since the epoch) every
//! instance set up from `T` on spins in `configure` (a module that sets up slowly once in
//! force).

#[cfg(target_arch = "wasm32")]
mod component;

/// What the plugin does for a given origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    Trap,
    Loop,
    Grow,
    Recurse,
    Log,
    Flood,
    Sleep,
    File,
    Random,
    Socket,
    Echo,
}

/// Picks the behaviour for an origin.
pub fn behaviour(origin: &str) -> Behaviour {
    match origin {
        "https://trap.test" => Behaviour::Trap,
        "https://loop.test" => Behaviour::Loop,
        "https://grow.test" => Behaviour::Grow,
        "https://recurse.test" => Behaviour::Recurse,
        "https://log.test" => Behaviour::Log,
        "https://flood.test" => Behaviour::Flood,
        "https://sleep.test" => Behaviour::Sleep,
        "https://file.test" => Behaviour::File,
        "https://random.test" => Behaviour::Random,
        "https://socket.test" => Behaviour::Socket,
        _ => Behaviour::Echo,
    }
}
