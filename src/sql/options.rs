//! `WITH (...)` options: the raw key/value list, durations and triggers.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

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

    /// Refuses keys outside `allowed`, naming the valid ones.
    pub fn check_known(&self, what: &str, allowed: &[&str]) -> Result<()> {
        for k in self.0.keys() {
            if !allowed.contains(&k.as_str()) {
                return Err(Error::InvalidOption {
                    message: format!("unknown option \"{k}\" for {what}"),
                    hint: Some(format!("Valid options are: {}.", allowed.join(", "))),
                });
            }
        }
        Ok(())
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
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
