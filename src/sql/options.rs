//! `WITH (...)` options: the raw key/value list, durations and triggers.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The type of an option's value: what validation checks and what `SHOW OPTIONS` and the
/// docs print.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptionType {
    Text,
    /// One ASCII character (or `\t`).
    Char,
    /// An absolute path.
    Path,
    PositiveInt,
    NonNegativeInt,
    Boolean,
    /// An interval: `'10 minutes'`, `'1 day'` (no months or years).
    Duration,
    /// A trigger: `'default'`, `'processing_time 10 seconds'`, `'available_now'`, `'once'`.
    Trigger,
    /// `'column - interval'`.
    Watermark,
    /// One of these words, in any case.
    OneOf(&'static [&'static str]),
}

impl OptionType {
    /// How `SHOW OPTIONS` names it.
    pub fn describe(&self) -> String {
        match self {
            OptionType::Text => "text".into(),
            OptionType::Char => "character".into(),
            OptionType::Path => "absolute path".into(),
            OptionType::PositiveInt => "positive integer".into(),
            OptionType::NonNegativeInt => "non-negative integer".into(),
            OptionType::Boolean => "boolean".into(),
            OptionType::Duration => "interval".into(),
            OptionType::Trigger => "trigger".into(),
            OptionType::Watermark => "column - interval".into(),
            OptionType::OneOf(words) => words.join(" | "),
        }
    }

    /// Checks one value, with the error the option's own parser would give.
    pub fn check(&self, key: &str, value: &str) -> Result<()> {
        let one = Options(BTreeMap::from([(key.to_string(), value.to_string())]));
        match self {
            OptionType::Text => {}
            OptionType::Char => {
                if (value.len() != 1 || !value.is_ascii()) && value != "\\t" {
                    return Err(Error::invalid_option(format!(
                        "option \"{key}\" must be one ASCII character, got \"{value}\""
                    )));
                }
            }
            OptionType::Path => {
                if !std::path::Path::new(value).is_absolute() {
                    return Err(Error::invalid_option(format!(
                        "path \"{value}\" must be absolute"
                    )));
                }
            }
            OptionType::PositiveInt => {
                one.positive_int(key)?;
            }
            OptionType::NonNegativeInt => {
                one.non_negative_int(key)?;
            }
            OptionType::Boolean => {
                one.bool(key)?;
            }
            OptionType::Duration => {
                parse_duration(value)?;
            }
            OptionType::Trigger => {
                Trigger::parse(value)?;
            }
            OptionType::Watermark => {
                super::parser::parse_watermark_option(value)?;
            }
            OptionType::OneOf(words) => {
                if !words.iter().any(|w| w.eq_ignore_ascii_case(value.trim())) {
                    return Err(Error::InvalidOption {
                        message: format!("invalid {key} \"{value}\""),
                        hint: Some(format!("Use one of: {}.", words.join(", "))),
                    });
                }
            }
        }
        Ok(())
    }
}

/// One option of a connector.
#[derive(Debug, Clone, Copy)]
pub struct OptionSpec {
    pub name: &'static str,
    pub ty: OptionType,
    /// The value when the option is not given, as a user would write it; `None` when the
    /// option is required or has no default value.
    pub default: Option<&'static str>,
    pub required: bool,
    /// Whether `ALTER SINK ... SET` may change it (sinks only).
    pub alterable: bool,
    pub doc: &'static str,
}

impl OptionSpec {
    /// An optional option.
    pub const fn new(
        name: &'static str,
        ty: OptionType,
        default: Option<&'static str>,
        doc: &'static str,
    ) -> OptionSpec {
        OptionSpec {
            name,
            ty,
            default,
            required: false,
            alterable: false,
            doc,
        }
    }

    pub const fn required(mut self) -> OptionSpec {
        self.required = true;
        self
    }

    pub const fn alterable(mut self) -> OptionSpec {
        self.alterable = true;
        self
    }
}

/// The options one connector takes, in one place: validation, errors, `SHOW OPTIONS`,
/// `tidemark.options` and the docs all read it.
#[derive(Debug)]
pub struct OptionTable {
    /// `stream`, `sink` or `materialized view`.
    pub object: &'static str,
    /// The connector, or `""` for an object that has none (a materialized view).
    pub connector: &'static str,
    pub options: &'static [OptionSpec],
}

impl OptionTable {
    /// "a file stream", "a sink", … as errors name it.
    pub fn what(&self) -> String {
        if self.object == "sink" && (self.connector.is_empty() || self.connector.contains('|')) {
            "a sink".into()
        } else if self.connector.is_empty() {
            format!("a {}", self.object)
        } else {
            format!("a {} {}", self.connector, self.object)
        }
    }

    pub fn get(&self, name: &str) -> Option<&OptionSpec> {
        self.options.iter().find(|o| o.name == name)
    }

    pub fn names(&self) -> Vec<&'static str> {
        self.options.iter().map(|o| o.name).collect()
    }

    /// The options that must be given.
    pub fn check_required(&self, options: &Options) -> Result<()> {
        for o in self.options.iter().filter(|o| o.required) {
            if options.get(o.name).is_none() {
                return Err(Error::InvalidOption {
                    message: format!("missing required option \"{}\" for {}", o.name, self.what()),
                    hint: Some(format!("{}.", o.doc)),
                });
            }
        }
        Ok(())
    }
}

/// Options as written, keys lowercased, in a stable order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Options(pub BTreeMap<String, String>);

impl Options {
    /// Builds the map, refusing a key given twice.
    pub fn try_from_pairs(pairs: Vec<(String, String)>) -> Result<Options> {
        let mut map = BTreeMap::new();
        for (k, v) in pairs {
            if map.insert(k.clone(), v).is_some() {
                return Err(Error::invalid_option(format!("option \"{k}\" given twice")));
            }
        }
        Ok(Options(map))
    }

    /// Checks the options against a connector's table: every key known (else the valid
    /// ones are named), every value of its option's type.
    pub fn check(&self, table: &OptionTable) -> Result<()> {
        for (k, v) in &self.0 {
            let Some(spec) = table.get(k) else {
                return Err(Error::InvalidOption {
                    message: format!("unknown option \"{k}\" for {}", table.what()),
                    hint: Some(format!("Valid options are: {}.", table.names().join(", "))),
                });
            };
            spec.ty.check(k, v)?;
        }
        Ok(())
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// Options from pairs, as written (later pairs win).
    pub fn of(pairs: &[(&str, &str)]) -> Options {
        Options(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    /// A positive integer option.
    pub fn positive_int(&self, key: &str) -> Result<Option<u64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.trim().parse::<u64>() {
                Ok(n) if n > 0 => Ok(Some(n)),
                _ => Err(Error::invalid_option(format!(
                    "option \"{key}\" must be a positive integer, got \"{v}\""
                ))),
            },
        }
    }

    /// A non-negative integer option.
    pub fn non_negative_int(&self, key: &str) -> Result<Option<u64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.trim().parse::<u64>().map(Some).map_err(|_| {
                Error::invalid_option(format!(
                    "option \"{key}\" must be a non-negative integer, got \"{v}\""
                ))
            }),
        }
    }

    /// A boolean option (`true`/`false`, `on`/`off`, `yes`/`no`, `1`/`0`).
    pub fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.trim().to_ascii_lowercase().as_str() {
                "true" | "on" | "yes" | "1" => Ok(Some(true)),
                "false" | "off" | "no" | "0" => Ok(Some(false)),
                _ => Err(Error::invalid_option(format!(
                    "option \"{key}\" must be a boolean, got \"{v}\""
                ))),
            },
        }
    }
}

/// Parses a duration such as `30 seconds`, `1 minute`, `10m`, `INTERVAL '2 hours'`,
/// `1 hour 30 minutes`, `500 ms`. Months and years are refused: their length varies.
pub fn parse_duration(text: &str) -> Result<Duration> {
    let bad =
        |why: &str| Error::invalid_option(format!("invalid interval \"{}\": {why}", text.trim()));
    let mut s = text.trim().to_ascii_lowercase();
    if let Some(rest) = s.strip_prefix("interval") {
        s = rest.trim().trim_matches('\'').trim().to_string();
    }
    if s.is_empty() {
        return Err(bad("it is empty"));
    }
    // Split "10m" into "10 m" and so on, then read (number, unit) pairs.
    let mut tokens: Vec<String> = Vec::new();
    for word in s.split_whitespace() {
        let split_at = word
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(word.len());
        let (num, unit) = word.split_at(split_at);
        if !num.is_empty() {
            tokens.push(num.to_string());
        }
        if !unit.is_empty() {
            tokens.push(unit.to_string());
        }
    }
    if !tokens.len().is_multiple_of(2) {
        return Err(bad("expected pairs of a number and a unit"));
    }
    let mut total_us: f64 = 0.0;
    for pair in tokens.chunks(2) {
        let n: f64 = pair[0]
            .parse()
            .map_err(|_| bad(&format!("\"{}\" is not a number", pair[0])))?;
        let unit_us: f64 = match pair[1].as_str() {
            "us" | "microsecond" | "microseconds" => 1.0,
            "ms" | "millisecond" | "milliseconds" => 1e3,
            "s" | "sec" | "secs" | "second" | "seconds" => 1e6,
            "m" | "min" | "mins" | "minute" | "minutes" => 60e6,
            "h" | "hour" | "hours" => 3600e6,
            "d" | "day" | "days" => 86400e6,
            "w" | "week" | "weeks" => 7.0 * 86400e6,
            "month" | "months" | "mon" | "mons" | "year" | "years" => {
                return Err(bad("months and years have no fixed length; use days"));
            }
            other => return Err(bad(&format!("unknown unit \"{other}\""))),
        };
        total_us += n * unit_us;
    }
    if !total_us.is_finite() || !(0.0..=1e17).contains(&total_us) {
        return Err(bad("out of range"));
    }
    Ok(Duration::from_micros(total_us.round() as u64))
}

/// When a streaming query runs its micro-batches (spec §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// The next batch starts as soon as the previous one ends and new data exists.
    Default,
    /// Batches start on a grid of this interval since the epoch.
    ProcessingTime(#[serde(with = "duration_us")] Duration),
    /// Everything available at start, in as many batches as the rate limit needs; then stop.
    AvailableNow,
    /// One batch with everything available, ignoring the rate limit; then stop.
    Once,
}

impl Trigger {
    /// Parses the `trigger` option.
    pub fn parse(text: &str) -> Result<Trigger> {
        let t = text.trim().to_ascii_lowercase();
        let words: Vec<&str> = t.split_whitespace().collect();
        match words.first().copied() {
            Some("default") if words.len() == 1 => Ok(Trigger::Default),
            Some("available_now" | "availablenow") if words.len() == 1 => Ok(Trigger::AvailableNow),
            Some("once") if words.len() == 1 => Ok(Trigger::Once),
            Some("processing_time" | "processingtime") if words.len() > 1 => {
                let d = parse_duration(&words[1..].join(" "))?;
                if d.is_zero() {
                    Ok(Trigger::Default)
                } else {
                    Ok(Trigger::ProcessingTime(d))
                }
            }
            Some("continuous") => Err(Error::Unsupported {
                message: "the continuous trigger is not supported".into(),
                hint: Some("Use trigger = 'processing_time 1 second' for low latency.".into()),
            }),
            _ => Err(Error::InvalidOption {
                message: format!("invalid trigger \"{}\"", text.trim()),
                hint: Some(
                    "Use 'default', 'processing_time <interval>', 'available_now' or 'once'."
                        .into(),
                ),
            }),
        }
    }

    /// Whether the query stops by itself once it has caught up.
    pub fn is_bounded(&self) -> bool {
        matches!(self, Trigger::AvailableNow | Trigger::Once)
    }
}

impl std::fmt::Display for Trigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Trigger::Default => write!(f, "default"),
            Trigger::ProcessingTime(d) => write!(f, "processing_time {}", format_duration(*d)),
            Trigger::AvailableNow => write!(f, "available_now"),
            Trigger::Once => write!(f, "once"),
        }
    }
}

/// Formats a duration with the largest unit that divides it: `30 seconds`, `1 minute`.
pub fn format_duration(d: Duration) -> String {
    let us = d.as_micros();
    for (unit, size) in [
        ("day", 86_400_000_000u128),
        ("hour", 3_600_000_000),
        ("minute", 60_000_000),
        ("second", 1_000_000),
        ("millisecond", 1_000),
        ("microsecond", 1),
    ] {
        if us >= size && us.is_multiple_of(size) {
            let n = us / size;
            return format!("{n} {unit}{}", if n == 1 { "" } else { "s" });
        }
    }
    "0 seconds".to_string()
}

/// A duration as whole microseconds in the catalog.
mod duration_us {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_micros() as u64)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_micros(u64::deserialize(d)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_duration_accepts_common_forms() {
        assert_eq!(
            parse_duration("30 seconds").unwrap(),
            Duration::from_secs(30)
        );
        assert_eq!(parse_duration("1 minute").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert_eq!(
            parse_duration("INTERVAL '2 hours'").unwrap(),
            Duration::from_secs(7200)
        );
        assert_eq!(
            parse_duration("1 hour 30 minutes").unwrap(),
            Duration::from_secs(5400)
        );
        assert_eq!(
            parse_duration("500 ms").unwrap(),
            Duration::from_millis(500)
        );
        assert!(parse_duration("1 month").is_err());
        assert!(parse_duration("ten minutes").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn trigger_parses_spark_triggers() {
        assert_eq!(Trigger::parse("default").unwrap(), Trigger::Default);
        assert_eq!(
            Trigger::parse("processing_time 30 seconds").unwrap(),
            Trigger::ProcessingTime(Duration::from_secs(30))
        );
        assert_eq!(
            Trigger::parse("AVAILABLE_NOW").unwrap(),
            Trigger::AvailableNow
        );
        assert_eq!(Trigger::parse("once").unwrap(), Trigger::Once);
        assert_eq!(
            Trigger::parse("continuous 1 second")
                .unwrap_err()
                .sqlstate()
                .code(),
            "0A000"
        );
        assert_eq!(
            Trigger::parse("sometimes").unwrap_err().sqlstate().code(),
            "22023"
        );
        assert_eq!(
            Trigger::ProcessingTime(Duration::from_secs(30)).to_string(),
            "processing_time 30 seconds"
        );
        assert_eq!(format_duration(Duration::from_secs(60)), "1 minute");
        assert_eq!(
            format_duration(Duration::from_millis(1500)),
            "1500 milliseconds"
        );
    }
}
