//! A hostile `cors` stage plugin for the gateway's sandbox tests. Not shipped in the binary.
//!
//! The behaviour is chosen per request by the origin's host, so one module exercises every
//! failure while other requests keep being answered:
//! - `https://trap.test` traps (`unreachable`);
//! - `https://loop.test` loops forever (stopped by the epoch deadline);
//! - `https://grow.test` grows memory without bound (stopped by the memory cap);
//! - `https://recurse.test` recurses without bound (stack overflow trap);
//! - any other origin is allowed by echoing it, with `x-testing-plugin` exposed, so a test can
//!   tell this module's answers from the default plugin's.
//!
//! `configure` refuses a configuration containing `"refuse": true`; with `"trap_always": true`
//! every call traps.

#[cfg(target_arch = "wasm32")]
mod component;

/// What the plugin does for a given origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    Trap,
    Loop,
    Grow,
    Recurse,
    Echo,
}

/// Picks the behaviour for an origin.
pub fn behaviour(origin: &str) -> Behaviour {
    match origin {
        "https://trap.test" => Behaviour::Trap,
        "https://loop.test" => Behaviour::Loop,
        "https://grow.test" => Behaviour::Grow,
        "https://recurse.test" => Behaviour::Recurse,
        _ => Behaviour::Echo,
    }
}
