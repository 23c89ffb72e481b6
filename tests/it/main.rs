//! The one integration-test binary: end-to-end tests against real `tidemark` processes.

mod architecture;
mod catalog;
mod clients;
mod crash;
mod dbt;
mod delta;
mod errors;
mod failure;
mod fuzz;
mod harness;
mod ingest;
mod kafka;
mod lookup;
mod monitoring;
mod oracle;
mod property;
mod replay;
mod restart;
mod run;
mod security;
mod slt;
mod soak;
mod spark;
mod wire;
