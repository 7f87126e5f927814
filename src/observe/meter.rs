//! The figures lockset records through the `metrics` crate's facade (feature `metrics`):
//! their names, units and labels, all in this file (the guide's
//! [metrics table](crate::guide::observing#metrics) lists the same), and the handles that
//! record them. Without the feature every type here is empty and
//! every call does nothing.
//!
//! Labels stay low-cardinality: an outcome or a cause from a fixed set, and the lock family
//! a caller names with `Options::metrics_label` (label `lock`); never a key or a token.
//! A family's handles are registered with the recorder once, at its first figure, and kept:
//! recording is then an atomic operation or two, not a registry lookup per operation. So the
//! recorder must be installed before the first lock operation (as exporters install theirs at
//! start-up); figures of a family registered before it go nowhere.

/// How an obtain ended (label `outcome` of `lockset_obtains_total` and
/// `lockset_obtain_wait_seconds`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ObtainEnd {
    Obtained,
    NotObtained,
    Deadline,
    /// Redis could not be reached or did not answer (`Error::is_unavailable`).
    Unavailable,
    /// Rejected before anything was sent.
    InvalidInput,
    /// Anything else: a wrong-typed key, scripts refused, a mode mismatch, another error.
    Error,
}

impl ObtainEnd {
    /// Every end, in the order of their handles.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    const ALL: [Self; 6] = [
        Self::Obtained,
        Self::NotObtained,
        Self::Deadline,
        Self::Unavailable,
        Self::InvalidInput,
        Self::Error,
    ];

    /// The word for this end, in the metrics' `outcome` label and the spans' `outcome` field.
    pub(crate) fn word(self) -> &'static str {
        match self {
            Self::Obtained => "obtained",
            Self::NotObtained => "not_obtained",
            Self::Deadline => "deadline",
            Self::Unavailable => "unavailable",
            Self::InvalidInput => "invalid_input",
            Self::Error => "error",
        }
    }
}

/// How a refresh ended (label `outcome` of `lockset_refreshes_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RefreshEnd {
    Refreshed,
    /// The lock was found lost (`Error::is_not_held`).
    NotHeld,
    Unavailable,
    InvalidInput,
    Error,
}

impl RefreshEnd {
    /// Every end, in the order of their handles.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    const ALL: [Self; 5] = [
        Self::Refreshed,
        Self::NotHeld,
        Self::Unavailable,
        Self::InvalidInput,
        Self::Error,
    ];

    /// The word for this end, as [`ObtainEnd::word`].
    pub(crate) fn word(self) -> &'static str {
        match self {
            Self::Refreshed => "refreshed",
            Self::NotHeld => "not_held",
            Self::Unavailable => "unavailable",
            Self::InvalidInput => "invalid_input",
            Self::Error => "error",
        }
    }
}

/// How a release ended (label `outcome` of `lockset_releases_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReleaseEnd {
    Released,
    NotHeld,
    Unavailable,
    Error,
}

impl ReleaseEnd {
    /// Every end, in the order of their handles.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    const ALL: [Self; 4] = [
        Self::Released,
        Self::NotHeld,
        Self::Unavailable,
        Self::Error,
    ];

    /// The word for this end, as [`ObtainEnd::word`].
    pub(crate) fn word(self) -> &'static str {
        match self {
            Self::Released => "released",
            Self::NotHeld => "not_held",
            Self::Unavailable => "unavailable",
            Self::Error => "error",
        }
    }
}

/// Why a lock was found lost (label `cause` of `lockset_locks_lost_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lost {
    /// A refresh found its keys gone or taken over.
    Refresh,
    /// A TTL query found its keys gone or taken over.
    Ttl,
    /// Its validity ran out before a refresh renewed it.
    Expired,
}

/// How a holding ended (label `end` of `lockset_hold_seconds`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum End {
    Released,
    Lost,
}

#[cfg(feature = "metrics")]
pub(crate) use on::{HoldTimer, Meter, Waiting};

#[cfg(not(feature = "metrics"))]
pub(crate) use off::{HoldTimer, Meter, Waiting};

#[cfg(feature = "metrics")]
mod on {
    use std::sync::{Arc, OnceLock};
    use std::time::Duration;

    use ::metrics::{Counter, Gauge, Histogram, Label, Unit};
    use tokio::time::Instant;

    use super::{End, Lost, ObtainEnd, RefreshEnd, ReleaseEnd};

    const OBTAINS: &str = "lockset_obtains_total";
    const OBTAIN_WAIT: &str = "lockset_obtain_wait_seconds";
    const OBTAIN_ATTEMPTS: &str = "lockset_obtain_attempts";
    const REFRESHES: &str = "lockset_refreshes_total";
    const RELEASES: &str = "lockset_releases_total";
    const LOST: &str = "lockset_locks_lost_total";
    const HOLD: &str = "lockset_hold_seconds";
    const HANDOFFS: &str = "lockset_handoffs_total";
    const HANDOVER: &str = "lockset_handover_seconds";
    const WAITERS: &str = "lockset_waiters";

    /// The label a caller's lock family goes under.
    const FAMILY: &str = "lock";

    /// Where one lock family's figures go: its label (none for a client's default family)
    /// and its handles, registered at the first figure. Cheap to clone.
    #[derive(Clone, Default)]
    pub(crate) struct Meter(Arc<Family>);

    #[derive(Default)]
    struct Family {
        label: Option<String>,
        handles: OnceLock<Handles>,
    }

    /// Every series of one family.
    struct Handles {
        obtains: [Counter; 6],
        obtain_wait: [Histogram; 6],
        attempts: Histogram,
        refreshes: [Counter; 5],
        releases: [Counter; 4],
        lost: [Counter; 3],
        hold: [Histogram; 2],
        handoffs: Counter,
        handover: Histogram,
        waiters: Gauge,
    }

    impl Meter {
        /// The family `name`: every figure of its locks carries the label `lock="name"`.
        pub(crate) fn labelled(name: String) -> Self {
            Self(Arc::new(Family {
                label: Some(name),
                handles: OnceLock::new(),
            }))
        }

        /// The family's label, if it has one.
        pub(crate) fn label(&self) -> Option<&str> {
            self.0.label.as_deref()
        }

        fn handles(&self) -> &Handles {
            self.0
                .handles
                .get_or_init(|| Handles::register(self.0.label.as_deref()))
        }

        pub(crate) fn obtained(&self, end: ObtainEnd, waited: Duration, attempts: u32) {
            let handles = self.handles();
            handles.obtains[end as usize].increment(1);
            handles.obtain_wait[end as usize].record(waited);
            handles.attempts.record(attempts);
        }

        /// An obtain won on the wake-up of a release, `latency` after it.
        pub(crate) fn handed_over(&self, latency: Duration) {
            let handles = self.handles();
            handles.handoffs.increment(1);
            handles.handover.record(latency);
        }

        pub(crate) fn refreshed(&self, end: RefreshEnd) {
            self.handles().refreshes[end as usize].increment(1);
        }

        pub(crate) fn released(&self, end: ReleaseEnd) {
            self.handles().releases[end as usize].increment(1);
        }

        pub(crate) fn lost(&self, cause: Lost) {
            self.handles().lost[cause as usize].increment(1);
        }
    }

    impl Handles {
        fn register(family: Option<&str>) -> Self {
            describe();
            let labels = |extra: &[(&'static str, &'static str)]| -> Vec<Label> {
                let family = family.map(|name| Label::new(FAMILY, name.to_owned()));
                extra
                    .iter()
                    .map(|(key, value)| Label::from_static_parts(key, value))
                    .chain(family)
                    .collect()
            };
            let counter = |name: &'static str, extra: &[(&'static str, &'static str)]| {
                ::metrics::counter!(name, labels(extra))
            };
            let histogram = |name: &'static str, extra: &[(&'static str, &'static str)]| {
                ::metrics::histogram!(name, labels(extra))
            };
            let outcome = |word: &'static str| [("outcome", word)];
            Self {
                obtains: ObtainEnd::ALL.map(|end| counter(OBTAINS, &outcome(end.word()))),
                obtain_wait: ObtainEnd::ALL.map(|end| histogram(OBTAIN_WAIT, &outcome(end.word()))),
                attempts: histogram(OBTAIN_ATTEMPTS, &[]),
                refreshes: RefreshEnd::ALL.map(|end| counter(REFRESHES, &outcome(end.word()))),
                releases: ReleaseEnd::ALL.map(|end| counter(RELEASES, &outcome(end.word()))),
                lost: ["refresh", "ttl", "expired"].map(|c| counter(LOST, &[("cause", c)])),
                hold: ["released", "lost"].map(|e| histogram(HOLD, &[("end", e)])),
                handoffs: counter(HANDOFFS, &[]),
                handover: histogram(HANDOVER, &[]),
                waiters: ::metrics::gauge!(WAITERS, labels(&[])),
            }
        }
    }

    /// Tells the recorder what each series means, and its unit.
    fn describe() {
        use ::metrics::{describe_counter, describe_gauge, describe_histogram};
        describe_counter!(OBTAINS, Unit::Count, "Obtain calls, by how they ended");
        describe_histogram!(
            OBTAIN_WAIT,
            Unit::Seconds,
            "Time from an obtain call to its result, by how it ended"
        );
        describe_histogram!(OBTAIN_ATTEMPTS, Unit::Count, "Attempts per obtain call");
        describe_counter!(
            REFRESHES,
            Unit::Count,
            "Refreshes (by hand and by the watchdog), by how they ended"
        );
        describe_counter!(RELEASES, Unit::Count, "Releases, by how they ended");
        describe_counter!(LOST, Unit::Count, "Locks found lost, by what found it");
        describe_histogram!(
            HOLD,
            Unit::Seconds,
            "Time from obtaining a lock to its release or loss"
        );
        describe_counter!(
            HANDOFFS,
            Unit::Count,
            "Obtains that won the lock on the wake-up of its release (a hand-off)"
        );
        describe_histogram!(
            HANDOVER,
            Unit::Seconds,
            "Time from the release event (or hand-off notice) that woke a waiting obtain to it holding the lock"
        );
        describe_gauge!(WAITERS, Unit::Count, "Obtains waiting for a held lock now");
    }

    /// One waiting obtain in the `lockset_waiters` gauge, from its first wait until dropped.
    #[derive(Default)]
    pub(crate) struct Waiting<'a> {
        meter: Option<&'a Meter>,
        counted: bool,
    }

    impl<'a> Waiting<'a> {
        pub(crate) fn of(meter: &'a Meter) -> Self {
            Self {
                meter: Some(meter),
                counted: false,
            }
        }

        /// The obtain waits (again): counted once.
        pub(crate) fn waits(&mut self) {
            if let (Some(meter), false) = (self.meter, self.counted) {
                self.counted = true;
                meter.handles().waiters.increment(1.0);
            }
        }
    }

    impl Drop for Waiting<'_> {
        fn drop(&mut self) {
            if let (Some(meter), true) = (self.meter, self.counted) {
                meter.handles().waiters.decrement(1.0);
            }
        }
    }

    /// A held lock's family, and since when it is held (for `lockset_hold_seconds`).
    pub(crate) struct HoldTimer {
        meter: Meter,
        since: Instant,
    }

    impl HoldTimer {
        /// A holding of a lock of the family `meter`, since `since`.
        pub(crate) fn new(meter: Meter, since: Instant) -> Self {
            Self { meter, since }
        }

        pub(crate) fn meter(&self) -> &Meter {
            &self.meter
        }

        /// The holding ended, `at`.
        pub(crate) fn ended(&self, end: End, at: Instant) {
            let held = at.saturating_duration_since(self.since);
            self.meter.handles().hold[end as usize].record(held);
        }
    }
}

#[cfg(not(feature = "metrics"))]
mod off {
    use std::marker::PhantomData;
    use std::time::Duration;

    use tokio::time::Instant;

    use super::{End, Lost, ObtainEnd, RefreshEnd, ReleaseEnd};

    /// Without the `metrics` feature: nothing.
    #[derive(Clone, Default)]
    pub(crate) struct Meter(());

    impl Meter {
        pub(crate) fn label(&self) -> Option<&str> {
            None
        }
        pub(crate) fn obtained(&self, _: ObtainEnd, _: Duration, _: u32) {}
        pub(crate) fn handed_over(&self, _: Duration) {}
        pub(crate) fn refreshed(&self, _: RefreshEnd) {}
        pub(crate) fn released(&self, _: ReleaseEnd) {}
        pub(crate) fn lost(&self, _: Lost) {}
    }

    /// Without the `metrics` feature: nothing.
    #[derive(Default)]
    pub(crate) struct Waiting<'a>(PhantomData<&'a Meter>);

    impl<'a> Waiting<'a> {
        pub(crate) fn of(_: &'a Meter) -> Self {
            Self(PhantomData)
        }
        pub(crate) fn waits(&mut self) {}
    }

    /// Without the `metrics` feature: nothing.
    pub(crate) struct HoldTimer(Meter);

    impl HoldTimer {
        pub(crate) fn new(meter: Meter, _: Instant) -> Self {
            Self(meter)
        }
        pub(crate) fn meter(&self) -> &Meter {
            &self.0
        }
        pub(crate) fn ended(&self, _: End, _: Instant) {}
    }
}
