//! The gateway as it is shipped and measured, apart from how it behaves: the container image
//! built and run, the benchmark scripts' own checks, and the training load of the optimised
//! build. Slow and heavy on the machine, so `.ci/test` runs them on their own, after the rest.

#[path = "../e2e/support/mod.rs"]
mod support;

mod bench_binary;
mod image;
mod pgo;
