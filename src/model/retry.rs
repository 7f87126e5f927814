//! Retry strategies: stateless descriptions that build a fresh sequence of delays per call.
//!
//! A [`Retry`] is plain data, kept in [`Options`](crate::Options) and shared freely. Every
//! operation asks it for a new [`Backoff`] iterator, so reusing one `Options` across calls
//! and tasks never shares or exhausts retry state (bsm/redislock's `LimitRetry` keeps its
//! counter inside the strategy and runs dry for every later call).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, RngExt as _, SeedableRng as _};
use serde::{Deserialize, Serialize};

/// The delays of one operation: item `n` is the wait before retry `n + 1`; the end of the
/// iterator means "give up".
pub type Backoff = Box<dyn Iterator<Item = Duration> + Send>;

/// A retry strategy you can plug in with [`Retry::custom`].
///
/// Implementations are descriptions: `backoff` is called once per operation and must return
/// an iterator with its own state.
///
/// ```
/// use std::time::Duration;
/// use lockset::{Backoff, Retry, RetryStrategy};
///
/// /// Retries every 10 ms, then every 100 ms.
/// #[derive(Debug)]
/// struct FastThenSlow;
///
/// impl RetryStrategy for FastThenSlow {
///     fn backoff(&self) -> Backoff {
///         let fast = std::iter::repeat_n(Duration::from_millis(10), 5);
///         Box::new(fast.chain(std::iter::repeat(Duration::from_millis(100))))
///     }
/// }
///
/// let retry = Retry::custom(FastThenSlow).limit(8);
/// assert_eq!(retry.backoff().count(), 8);
/// ```
pub trait RetryStrategy: Send + Sync + fmt::Debug {
    /// Builds the delays for one operation, with state of its own.
    fn backoff(&self) -> Backoff;
}

/// How random jitter spreads a delay `d`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Jitter {
    /// Uniform in `[0, d]` ("full jitter", AWS Architecture Blog).
    Full,
    /// `d/2` plus uniform in `[0, d/2]` ("equal jitter").
    Equal,
    /// Uniform in `[d/2, 3d/2]`: ±50% around the delay.
    PlusMinusHalf,
}

impl Jitter {
    fn apply(self, delay: Duration, rng: &mut impl Rng) -> Duration {
        let nanos = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
        let (low, span) = match self {
            Self::Full => (0, nanos),
            Self::Equal => (nanos / 2, nanos - nanos / 2),
            Self::PlusMinusHalf => (nanos / 2, nanos),
        };
        Duration::from_nanos(low.saturating_add(rng.random_range(0..=span)))
    }
}

/// A retry strategy: what to wait between attempts, and when to give up.
///
/// See the guide: [retries and deadlines](crate::guide::retries).
///
/// Strategies compose: [`Retry::limit`] caps the number of retries of any strategy and
/// [`Retry::jitter`] randomises its delays. The default is [`Retry::NoRetry`].
///
/// # Configuration files
///
/// Every variant but [`Retry::Custom`] (de)serializes with serde; durations are written in
/// [humantime](https://docs.rs/humantime) form (`"250ms"`, `"2s"`):
///
/// ```
/// use std::time::Duration;
/// use lockset::{Jitter, Retry};
///
/// let json = r#"{"limit": {"retries": 5, "strategy":
///     {"jitter": {"jitter": "full", "strategy":
///         {"exponential": {"min": "8ms", "max": "512ms"}}}}}}"#;
/// let from_config: Retry = serde_json::from_str(json)?;
///
/// let in_code = Retry::exponential(Duration::from_millis(8), Duration::from_millis(512))
///     .jitter(Jitter::Full)
///     .limit(5);
/// assert_eq!(serde_json::to_value(&from_config)?, serde_json::to_value(&in_code)?);
///
/// // The simple ones:
/// let _: Retry = serde_json::from_str(r#""no_retry""#)?;
/// let _: Retry = serde_json::from_str(r#"{"linear": {"interval": "100ms"}}"#)?;
/// let _: Retry = serde_json::from_str(r#"{"intervals": {"intervals": ["10ms", "50ms", "1s"]}}"#)?;
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Retry {
    /// Try once, never retry (bsm/redislock's `NoRetry`).
    #[default]
    NoRetry,
    /// Retry forever (until the deadline) every `interval` (bsm's `LinearBackoff`).
    Linear {
        /// The wait between attempts.
        #[serde(with = "humantime_serde")]
        interval: Duration,
    },
    /// Retry forever (until the deadline), waiting 4 ms, 8 ms, 16 ms, ... (`2 << n` ms for
    /// retry `n`, capped at `2 << 25` ms), each clamped to `[min, max]`
    /// (bsm's `ExponentialBackoff`). When `min > max`, every wait is `max`.
    Exponential {
        /// The shortest wait.
        #[serde(with = "humantime_serde")]
        min: Duration,
        /// The longest wait.
        #[serde(with = "humantime_serde")]
        max: Duration,
    },
    /// One retry after each listed interval, in order, then give up.
    Intervals {
        /// The waits, one per retry.
        #[serde(with = "duration_list")]
        intervals: Vec<Duration>,
    },
    /// At most `retries` retries of `strategy`, that is `retries + 1` attempts
    /// (bsm's `LimitRetry`).
    Limit {
        /// How many retries at most.
        retries: u32,
        /// The strategy being limited.
        strategy: Box<Self>,
    },
    /// The delays of `strategy`, randomised by `jitter`.
    Jitter {
        /// How to spread each delay.
        jitter: Jitter,
        /// The strategy whose delays are spread.
        strategy: Box<Self>,
    },
    /// A strategy of your own (see [`RetryStrategy`]). Not serializable.
    #[serde(skip)]
    Custom(Arc<dyn RetryStrategy>),
}

/// Two strategies are equal when they are built alike; custom ones only when they are the
/// same strategy (one `Arc`, as clones of one [`Retry::custom`] are).
impl PartialEq for Retry {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::NoRetry, Self::NoRetry) => true,
            (Self::Linear { interval: a }, Self::Linear { interval: b }) => a == b,
            (Self::Exponential { min: a, max: x }, Self::Exponential { min: b, max: y }) => {
                a == b && x == y
            }
            (Self::Intervals { intervals: a }, Self::Intervals { intervals: b }) => a == b,
            (
                Self::Limit {
                    retries: a,
                    strategy: x,
                },
                Self::Limit {
                    retries: b,
                    strategy: y,
                },
            ) => a == b && x == y,
            (
                Self::Jitter {
                    jitter: a,
                    strategy: x,
                },
                Self::Jitter {
                    jitter: b,
                    strategy: y,
                },
            ) => a == b && x == y,
            (Self::Custom(a), Self::Custom(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Retry {
    /// Retry every `interval` until the deadline.
    pub fn linear(interval: Duration) -> Self {
        Self::Linear { interval }
    }

    /// Exponential backoff from 4 ms doubling per retry, clamped to `[min, max]`.
    pub fn exponential(min: Duration, max: Duration) -> Self {
        Self::Exponential { min, max }
    }

    /// One retry after each of `intervals`, then give up.
    pub fn intervals(intervals: impl IntoIterator<Item = Duration>) -> Self {
        Self::Intervals {
            intervals: intervals.into_iter().collect(),
        }
    }

    /// A strategy of your own.
    pub fn custom(strategy: impl RetryStrategy + 'static) -> Self {
        Self::Custom(Arc::new(strategy))
    }

    /// At most `retries` retries of this strategy (`retries + 1` attempts).
    #[must_use]
    pub fn limit(self, retries: u32) -> Self {
        Self::Limit {
            retries,
            strategy: Box::new(self),
        }
    }

    /// Randomises this strategy's delays.
    #[must_use]
    pub fn jitter(self, jitter: Jitter) -> Self {
        Self::Jitter {
            jitter,
            strategy: Box::new(self),
        }
    }

    /// Builds the delays for one operation, with jitter seeded from `seed`: the same seed
    /// gives the same delays (for tests).
    pub fn backoff_seeded(&self, seed: u64) -> Backoff {
        self.build(&mut SmallRng::seed_from_u64(seed))
    }

    fn build(&self, seeds: &mut impl Rng) -> Backoff {
        match self {
            Self::NoRetry => Box::new(std::iter::empty()),
            Self::Linear { interval } => Box::new(std::iter::repeat(*interval)),
            Self::Exponential { min, max } => {
                let (min, max) = (*min, *max);
                Box::new((1..).map(move |retry: u32| exponential_delay(retry, min, max)))
            }
            Self::Intervals { intervals } => Box::new(intervals.clone().into_iter()),
            Self::Limit { retries, strategy } => {
                let take = usize::try_from(*retries).unwrap_or(usize::MAX);
                Box::new(strategy.build(seeds).take(take))
            }
            Self::Jitter { jitter, strategy } => {
                let (jitter, mut rng) = (*jitter, SmallRng::seed_from_u64(seeds.next_u64()));
                Box::new(
                    strategy
                        .build(seeds)
                        .map(move |delay| jitter.apply(delay, &mut rng)),
                )
            }
            Self::Custom(strategy) => strategy.backoff(),
        }
    }
}

impl RetryStrategy for Retry {
    fn backoff(&self) -> Backoff {
        self.build(&mut rand::rng())
    }
}

/// bsm's schedule: `2 << retry` milliseconds, the exponent capped at 25.
fn exponential_delay(retry: u32, min: Duration, max: Duration) -> Duration {
    let delay = Duration::from_millis(2u64 << retry.min(25));
    delay.max(min).min(max)
}

/// Serde for a list of humantime durations (`["10ms", "1s"]`).
mod duration_list {
    use std::time::Duration;

    use humantime_serde::Serde;
    use serde::{Deserialize as _, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(list: &[Duration], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(list.iter().map(|d| Serde::from(*d)))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Duration>, D::Error> {
        let list = Vec::<Serde<Duration>>::deserialize(d)?;
        Ok(list.into_iter().map(Serde::into_inner).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn first(retry: &Retry, n: usize) -> Vec<Duration> {
        retry.backoff().take(n).collect()
    }

    #[test]
    fn no_retry_gives_up_at_once() {
        assert_eq!(Retry::NoRetry.backoff().next(), None);
        assert_eq!(Retry::default().backoff().next(), None);
    }

    #[test]
    fn linear_repeats_its_interval() {
        assert_eq!(first(&Retry::linear(ms(7)), 4), vec![ms(7); 4]);
    }

    #[test]
    fn exponential_doubles_from_four_ms_within_bounds() {
        let unbounded = Retry::exponential(Duration::ZERO, Duration::MAX);
        assert_eq!(
            first(&unbounded, 6),
            vec![ms(4), ms(8), ms(16), ms(32), ms(64), ms(128)]
        );
        let clamped = Retry::exponential(ms(10), ms(40));
        assert_eq!(
            first(&clamped, 6),
            vec![ms(10), ms(10), ms(16), ms(32), ms(40), ms(40)]
        );
    }

    #[test]
    fn exponential_caps_its_exponent_and_never_overflows() {
        let unbounded = Retry::exponential(Duration::ZERO, Duration::MAX);
        let last = unbounded.backoff().nth(100);
        assert_eq!(last, Some(ms(2 << 25)));
    }

    #[test]
    fn exponential_with_min_above_max_waits_max() {
        assert_eq!(
            first(&Retry::exponential(ms(50), ms(20)), 3),
            vec![ms(20); 3]
        );
    }

    #[test]
    fn intervals_retry_once_per_interval() {
        let retry = Retry::intervals([ms(1), ms(5), ms(3)]);
        assert_eq!(
            retry.backoff().collect::<Vec<_>>(),
            vec![ms(1), ms(5), ms(3)]
        );
    }

    #[test]
    fn limit_counts_retries_not_attempts() {
        assert_eq!(Retry::linear(ms(1)).limit(3).backoff().count(), 3);
        assert_eq!(Retry::linear(ms(1)).limit(0).backoff().count(), 0);
    }

    #[test]
    fn every_call_gets_fresh_state() {
        let retry = Retry::linear(ms(1)).limit(2);
        for _ in 0..3 {
            assert_eq!(retry.backoff().count(), 2);
        }
    }

    #[test]
    fn full_jitter_stays_within_zero_and_the_delay() {
        let retry = Retry::linear(ms(100)).jitter(Jitter::Full).limit(1000);
        let delays: Vec<_> = retry.backoff().collect();
        assert!(delays.iter().all(|d| *d <= ms(100)));
        assert!(delays.iter().any(|d| *d < ms(50)));
        assert!(delays.iter().any(|d| *d > ms(50)));
    }

    #[test]
    fn equal_jitter_keeps_at_least_half() {
        let retry = Retry::linear(ms(100)).jitter(Jitter::Equal).limit(1000);
        assert!(retry.backoff().all(|d| d >= ms(50) && d <= ms(100)));
    }

    #[test]
    fn plus_minus_half_jitter_spreads_around_the_delay() {
        let retry = Retry::linear(ms(100))
            .jitter(Jitter::PlusMinusHalf)
            .limit(1000);
        let delays: Vec<_> = retry.backoff().collect();
        assert!(delays.iter().all(|d| *d >= ms(50) && *d <= ms(150)));
        assert!(delays.iter().any(|d| *d > ms(100)));
    }

    #[test]
    fn seeded_jitter_is_repeatable() {
        let retry = Retry::linear(ms(100)).jitter(Jitter::Full).limit(20);
        let a: Vec<_> = retry.backoff_seeded(42).collect();
        let b: Vec<_> = retry.backoff_seeded(42).collect();
        let c: Vec<_> = retry.backoff_seeded(43).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn jitter_of_zero_is_zero() {
        let retry = Retry::linear(Duration::ZERO).jitter(Jitter::PlusMinusHalf);
        assert_eq!(retry.backoff().next(), Some(Duration::ZERO));
    }

    #[test]
    fn strategies_round_trip_through_serde() {
        let retry = Retry::intervals([ms(10), ms(1500)])
            .jitter(Jitter::PlusMinusHalf)
            .limit(2);
        let json = serde_json::to_string(&retry).unwrap();
        assert_eq!(
            json,
            r#"{"limit":{"retries":2,"strategy":{"jitter":{"jitter":"plus_minus_half","strategy":{"intervals":{"intervals":["10ms","1s 500ms"]}}}}}}"#
        );
        let back: Retry = serde_json::from_str(&json).unwrap();
        assert_eq!(serde_json::to_string(&back).unwrap(), json);
    }

    #[test]
    fn custom_strategies_are_not_serializable() {
        #[derive(Debug)]
        struct Never;
        impl RetryStrategy for Never {
            fn backoff(&self) -> Backoff {
                Box::new(std::iter::empty())
            }
        }
        assert!(serde_json::to_string(&Retry::custom(Never)).is_err());
    }
}
