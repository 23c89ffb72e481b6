//! Tidemark: a SQL-first streaming database with Spark Structured Streaming semantics,
//! spoken to over the Postgres wire.
//!
//! # Layout
//!
//! - [`server`]: the Postgres wire (pgwire through datafusion-postgres); splits query
//!   strings, runs Tidemark's statements on the engine, delegates the rest.
//! - [`http`]: `--http`: Prometheus metrics, the queries as JSON, the live dashboard.
//! - [`sql`]: statement splitting, Tidemark's statements, options, SQL types.
//! - [`auth`]: roles, stored passwords (SCRAM-SHA-256, md5) and the proof of a login.
//! - [`catalog`]: streams and sinks as declared, durable in `catalog.json`.
//! - [`engine`]: executes statements, runs one trigger loop per sink, keeps status and
//!   progress, exposes `tidemark.queries`, `tidemark.progress`, `tidemark.sources` and
//!   `tidemark.state_operators`, posts listener events.
//! - [`source`]: the file source (listing, reading JSON/CSV/Parquet/text into Arrow).
//! - [`sink`]: the Delta Lake sink, idempotent by (query id, batch id); the Kafka sink.
//! - [`kafka`]: the Kafka client (rdkafka), for the Kafka source and sink.
//! - [`state`]: state stores of stateful operators (in memory with durable deltas).
//! - [`checkpoint`]: the offsets log, commit log and source log, in Spark's layout.
//! - [`fsutil`]: atomic, durable file writes.
//! - [`error`]: the error type and its SQLSTATEs.
//! - [`testing`]: crash points for crash tests.
//!
//! See `ARCHITECTURE.md` for the life of a micro-batch and the invariants.

pub mod auth;
pub mod catalog;
pub mod checkpoint;
pub mod clock;
pub mod config;
pub mod engine;
pub mod error;
pub mod format;
pub mod fsutil;
pub mod http;
pub mod kafka;
pub mod server;
pub mod sink;
pub mod source;
pub mod spark;
pub mod sql;
pub mod state;
pub mod testing;
pub mod types;
