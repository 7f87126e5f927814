//! The flat form of a [`Retry`] in configuration files, one table with the backoff's kind,
//! its durations, an optional jitter and an optional limit:
//! `retry = { backoff = "exponential", min = "10ms", max = "1s", jitter = "full", retries = 5 }`.
//! Used by [`Config`](crate::Config) (`#[serde(with = ...)]`); `Retry`'s own serde form, the
//! nested one, is unchanged.

use std::time::Duration;

use humantime_serde::Serde;
use serde::de::Error as _;
use serde::ser::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::model::retry::{Jitter, Retry};

/// The kinds of backoff the flat form names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Kind {
    /// No retry.
    None,
    Linear,
    Exponential,
    Intervals,
}

/// One table: the backoff and what it needs, plus jitter and a limit.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Flat {
    backoff: Kind,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "humantime_serde"
    )]
    interval: Option<Duration>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "humantime_serde"
    )]
    min: Option<Duration>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "humantime_serde"
    )]
    max: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    intervals: Option<Vec<Serde<Duration>>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    jitter: Option<Jitter>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    retries: Option<u32>,
}

impl Flat {
    fn new(backoff: Kind) -> Self {
        Self {
            backoff,
            interval: None,
            min: None,
            max: None,
            intervals: None,
            jitter: None,
            retries: None,
        }
    }

    /// The strategy, or why the table does not describe one.
    fn into_retry(self) -> Result<Retry, String> {
        let name = self.backoff_name();
        let needs = |what: &str| format!("backoff = \"{name}\" needs `{what}`");
        // Each duration belongs to one kind of backoff; one given for another is a slip.
        let given = [
            ("interval", self.interval.is_some(), Kind::Linear),
            ("min", self.min.is_some(), Kind::Exponential),
            ("max", self.max.is_some(), Kind::Exponential),
            ("intervals", self.intervals.is_some(), Kind::Intervals),
        ];
        if let Some((field, ..)) = given
            .iter()
            .find(|(_, set, kind)| *set && *kind != self.backoff)
        {
            return Err(format!("`{field}` does not go with backoff = \"{name}\""));
        }
        // A zero wait retries without a pause, hammering the server until the deadline:
        // in a file, more likely a slip than a wish.
        let zero = [("interval", self.interval), ("max", self.max)]
            .into_iter()
            .find(|(_, wait)| *wait == Some(Duration::ZERO));
        if let Some((field, _)) = zero {
            return Err(format!(
                "`{field}` of 0 retries without a pause; give a wait such as \"10ms\""
            ));
        }
        if self.intervals.as_ref().is_some_and(Vec::is_empty) {
            return Err("`intervals` is empty; for no retry write backoff = \"none\"".to_owned());
        }
        let base = match self.backoff {
            Kind::None => Retry::NoRetry,
            Kind::Linear => Retry::linear(self.interval.ok_or_else(|| needs("interval"))?),
            Kind::Exponential => Retry::exponential(
                self.min.ok_or_else(|| needs("min"))?,
                self.max.ok_or_else(|| needs("max"))?,
            ),
            Kind::Intervals => Retry::intervals(
                self.intervals
                    .ok_or_else(|| needs("intervals"))?
                    .into_iter()
                    .map(Serde::into_inner),
            ),
        };
        let jittered = match self.jitter {
            Some(jitter) => base.jitter(jitter),
            None => base,
        };
        Ok(match self.retries {
            Some(retries) => jittered.limit(retries),
            None => jittered,
        })
    }

    /// The table for `retry`: at most one limit and one jitter around a base strategy.
    fn from_retry(mut retry: &Retry) -> Option<Self> {
        let (mut jitter, mut retries) = (None, None);
        loop {
            match retry {
                Retry::Limit {
                    retries: n,
                    strategy,
                } if retries.is_none() => {
                    retries = Some(*n);
                    retry = strategy;
                }
                Retry::Jitter {
                    jitter: j,
                    strategy,
                } if jitter.is_none() => {
                    jitter = Some(*j);
                    retry = strategy;
                }
                _ => break,
            }
        }
        let mut flat = match retry {
            Retry::NoRetry => Self::new(Kind::None),
            Retry::Linear { interval } => Self {
                interval: Some(*interval),
                ..Self::new(Kind::Linear)
            },
            Retry::Exponential { min, max } => Self {
                min: Some(*min),
                max: Some(*max),
                ..Self::new(Kind::Exponential)
            },
            Retry::Intervals { intervals } => Self {
                intervals: Some(intervals.iter().copied().map(Serde::from).collect()),
                ..Self::new(Kind::Intervals)
            },
            _ => return None,
        };
        flat.jitter = jitter;
        flat.retries = retries;
        Some(flat)
    }

    fn backoff_name(&self) -> &'static str {
        match self.backoff {
            Kind::None => "none",
            Kind::Linear => "linear",
            Kind::Exponential => "exponential",
            Kind::Intervals => "intervals",
        }
    }
}

/// Writes `retry` in the flat form; a custom strategy, or two limits or jitters stacked,
/// have none.
pub(crate) fn serialize<S: Serializer>(retry: &Retry, s: S) -> Result<S::Ok, S::Error> {
    Flat::from_retry(retry)
        .ok_or_else(|| {
            S::Error::custom(
                "this retry strategy has no flat form (a custom strategy, or more than one limit or jitter)",
            )
        })?
        .serialize(s)
}

/// Reads a retry strategy in the flat form.
pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Retry, D::Error> {
    Flat::deserialize(d)?.into_retry().map_err(D::Error::custom)
}
