//! The one integration-test binary: end-to-end tests against real `tidemark` processes.

mod crash;
mod harness;
mod run;
mod slt;
mod wire;
