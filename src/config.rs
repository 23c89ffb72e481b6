//! Engine-wide settings in one place: how many threads a batch uses, how often idle
//! triggers look for new data, how many log entries a checkpoint keeps.

use std::time::Duration;

/// How often the default trigger looks for new files when idle. Sources that announce
/// arrivals (INSERT-fed streams) wake the trigger at once instead.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// The number of threads a batch uses to read files and execute.
pub fn parallelism() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
}

/// How many batches of logs and state versions are kept (Spark's `minBatchesToRetain`).
pub const MIN_BATCHES_TO_RETAIN: u64 = 100;

/// Bytes of decoded rows that Delta tables (sink tables, Delta streams) keep in memory
/// between queries, all tables together: a table that fits is scanned from memory, its new
/// commits decoded once; one that does not reads its Parquet files per query.
pub const READ_CACHE_BYTES: u64 = 512 << 20;

/// Bytes of files a file stream decodes ahead for its next batch while the current one runs
/// (the files' sizes on disk; their decoded rows take about as much again).
pub const READ_AHEAD_BYTES: u64 = 256 << 20;

/// The largest message a client may send (a query's text, a Bind's parameters, a COPY
/// chunk). Postgres allows up to 1 GB; a declared length past this cap is refused with
/// `08P01` before anything is buffered, so a bogus length cannot exhaust memory.
pub const MAX_MESSAGE_BYTES: usize = 256 << 20;

/// The PostgreSQL version Tidemark answers as: `version()`, `SHOW server_version`, the
/// `server_version` parameter status and `current_setting('server_version_num')` agree.
pub const PG_VERSION: &str = "17.6";

/// One of Postgres's run-time settings as Tidemark reports it (`SHOW`, `current_setting`,
/// `pg_settings`): its canonical name, its server-wide value, what it is.
pub struct PgSetting {
    pub name: &'static str,
    pub value: &'static str,
    pub description: &'static str,
}

const fn setting(name: &'static str, value: &'static str, description: &'static str) -> PgSetting {
    PgSetting {
        name,
        value,
        description,
    }
}

/// The settings clients read on connect and when browsing, with Tidemark's values. A
/// session's `SET` overrides the ones the wire lets a session change.
pub const PG_SETTINGS: &[PgSetting] = &[
    setting(
        "application_name",
        "",
        "Sets the application name to be reported in statistics and logs.",
    ),
    setting("bytea_output", "hex", "Sets the output format for bytea."),
    setting(
        "client_encoding",
        "UTF8",
        "Sets the client's character set encoding.",
    ),
    setting(
        "DateStyle",
        "ISO, MDY",
        "Sets the display format for date and time values.",
    ),
    setting(
        "default_transaction_isolation",
        "read committed",
        "Sets the transaction isolation level of each new transaction.",
    ),
    setting(
        "default_transaction_read_only",
        "off",
        "Sets the default read-only status of new transactions.",
    ),
    setting(
        "extra_float_digits",
        "1",
        "Sets the number of digits displayed for floating-point values.",
    ),
    setting(
        "in_hot_standby",
        "off",
        "Shows whether hot standby is currently active.",
    ),
    setting(
        "integer_datetimes",
        "on",
        "Shows whether datetimes are integer based.",
    ),
    setting(
        "IntervalStyle",
        "postgres",
        "Sets the display format for interval values.",
    ),
    setting(
        "is_superuser",
        "on",
        "Shows whether the current user is a superuser.",
    ),
    setting("lc_collate", "C", "Shows the collation order locale."),
    setting(
        "lc_ctype",
        "C",
        "Shows the character classification and case conversion locale.",
    ),
    setting(
        "max_connections",
        "100",
        "Sets the maximum number of concurrent connections.",
    ),
    setting(
        "max_identifier_length",
        "63",
        "Shows the maximum identifier length.",
    ),
    setting(
        "search_path",
        "\"$user\", public",
        "Sets the schema search order for names that are not schema-qualified.",
    ),
    setting(
        "server_encoding",
        "UTF8",
        "Shows the server (database) character set encoding.",
    ),
    setting("server_version", PG_VERSION, "Shows the server version."),
    setting(
        "server_version_num",
        "170006",
        "Shows the server version as an integer.",
    ),
    setting(
        "standard_conforming_strings",
        "on",
        "Causes '...' strings to treat backslashes literally.",
    ),
    setting(
        "statement_timeout",
        "0",
        "Sets the maximum allowed duration of any statement.",
    ),
    setting(
        "TimeZone",
        "UTC",
        "Sets the time zone for displaying and interpreting time stamps.",
    ),
    setting(
        "transaction_isolation",
        "read committed",
        "Sets the current transaction's isolation level.",
    ),
    setting(
        "transaction_read_only",
        "off",
        "Sets the current transaction's read-only status.",
    ),
    setting(
        "unix_socket_directories",
        "",
        "Sets the directories where Unix-domain sockets will be created.",
    ),
];

/// The setting called `name` (any case; `time zone` and `transaction isolation level` as
/// `SHOW` spells them).
pub fn pg_setting(name: &str) -> Option<&'static PgSetting> {
    let name = match name.to_ascii_lowercase().as_str() {
        "time zone" => "timezone".to_string(),
        "transaction isolation level" => "transaction_isolation".to_string(),
        other => other.to_string(),
    };
    PG_SETTINGS
        .iter()
        .find(|s| s.name.eq_ignore_ascii_case(&name))
}
