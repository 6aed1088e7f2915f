//! Per-store resource limits of a plugin instance.

use wasmtime::ResourceLimiter;

/// Caps linear memory and table growth, and remembers whether a cap was hit so that a failed
/// call can be reported as a memory excess rather than a plain trap.
#[derive(Debug)]
pub struct PluginLimiter {
    memory_cap: usize,
    /// Set when the guest asked for more memory than the cap during the current call.
    pub memory_exceeded: bool,
    /// The largest linear memory the instance has had, in bytes.
    pub peak_memory: usize,
    /// The linear memory the instance has now, all memories together, in bytes.
    pub memory: usize,
    /// The elements of its tables, all tables together.
    pub table_elements: usize,
}

/// Largest table a plugin may grow to (function references).
const TABLE_CAP: usize = 100_000;

impl PluginLimiter {
    /// A limiter allowing `memory_cap` bytes of linear memory.
    pub fn new(memory_cap: usize) -> Self {
        Self {
            memory_cap,
            memory_exceeded: false,
            peak_memory: 0,
            memory: 0,
            table_elements: 0,
        }
    }
}

impl ResourceLimiter for PluginLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_cap {
            self.memory_exceeded = true;
            // An error (rather than `Ok(false)`) traps at once instead of letting the guest
            // continue with a failed allocation.
            wasmtime::bail!(
                "plugin memory cap exceeded: {desired} bytes requested, {} allowed",
                self.memory_cap
            );
        }
        self.peak_memory = self.peak_memory.max(desired);
        // Asked when a memory is made too (from 0): the sum covers every memory of the instance.
        self.memory = (self.memory + desired).saturating_sub(current);
        Ok(true)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > TABLE_CAP {
            return Ok(false);
        }
        self.table_elements = (self.table_elements + desired).saturating_sub(current);
        Ok(true)
    }
}
