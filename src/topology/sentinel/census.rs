//! What the sentinels say of a master, and the primary a majority of them names.
//!
//! **The rule.** The primary is the address that more than half of the *configured*
//! sentinels name (`SENTINEL GET-MASTER-ADDR-BY-NAME`), with the highest configuration epoch
//! any of them gives it. Answers that name another address are dissent: reported, never
//! followed. So one sentinel that watches another primary under the same name (or lags
//! behind a failover) is outvoted, whatever its epoch and however fast it answers, and
//! while the sentinels are split (a failover being agreed on) no primary is named at all.
//!
//! **The replicas a write must reach.** Each sentinel also lists the master's replicas
//! (`SENTINEL REPLICAS`). A replica that is not flagged down, answered the sentinel's
//! pings within [`PROMOTABLE_WITHIN`] and its `INFO` within [`INFO_VALID_WITHIN`] is one
//! Sentinel may promote; every
//! such replica must acknowledge a lock's writes (see `server/replication/`). The count is the
//! highest any agreeing sentinel gives: during a planned failover the old primary lists one
//! replica fewer (the one being promoted), while the sentinels still list it, so a write
//! that only the other replica acknowledges does not count.

use std::collections::HashMap;

use redis::{ErrorKind, RedisError, Value};

use crate::server::replication::Address;

/// A replica whose last good ping reply is older than this is not promoted by Sentinel
/// (five ping periods of one second).
pub(crate) const PROMOTABLE_WITHIN: u64 = 5_000;

/// A replica whose last `INFO` is older than this is not promoted by Sentinel (three
/// `INFO` periods of ten seconds). One it never asked (no run id yet: the entry a switch of
/// primary makes for the old primary, which may be dead) is not promoted either.
pub(crate) const INFO_VALID_WITHIN: u64 = 30_000;

/// What one sentinel said of the master.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sighting {
    /// The address it names as the primary.
    pub(crate) host: String,
    pub(crate) port: u16,
    /// The master's configuration epoch.
    pub(crate) epoch: u64,
    /// It flags the master it monitors down (`s_down`, `o_down`), and
    /// that master is the address it names.
    pub(crate) down: bool,
    /// It leads a failover of the master now: it names the replica being promoted (or
    /// flags `failover_in_progress`).
    pub(crate) failing_over: bool,
    /// The replicas it knows that Sentinel could promote, or that acknowledge writes.
    pub(crate) replicas: Vec<Address>,
    /// How long the sentinel has been up, in seconds (`None`: not said).
    pub(crate) uptime: Option<u64>,
    /// The run id it last saw the named primary run under (empty: none yet). It asks the
    /// primary for it every 10 s: a restarted primary runs under a new one meanwhile.
    pub(crate) run_id: String,
    /// How long it has known the named primary as the primary, in milliseconds
    /// (`role-reported-time`: since its record of the master was made, at its start or at
    /// the last switch of primary, or since the master last reported another role; `None`:
    /// not said).
    pub(crate) primary_for_ms: Option<u64>,
    /// The sentinel's own run id (`INFO server`; empty: not said): a sentinel given twice,
    /// under two names, counts once.
    pub(crate) sentinel_id: String,
}

/// What the sentinels that named a primary know of its past: for telling a restart from a
/// new deployment (see `primary.rs`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Witness {
    /// The longest any of them has been up, in seconds.
    pub(crate) sentinels_up: Option<u64>,
    /// The run ids they last saw it run under (none empty).
    pub(crate) run_ids: Vec<String>,
    /// The longest any of them has known it as the primary, in milliseconds.
    pub(crate) primary_for_ms: Option<u64>,
}

/// One sentinel's answer.
#[derive(Debug)]
pub(crate) enum Answer {
    /// It named a primary.
    Saw(Sighting),
    /// It does not monitor a master of that name. Its own run id (`INFO server`; empty:
    /// not said), as [`Sighting::sentinel_id`].
    Unknown(String),
    /// It could not be asked (down, slow, refused the login, not a sentinel).
    Failed(RedisError),
}

impl Answer {
    /// The run id of the sentinel that answered, when it said one.
    fn sentinel_id(&self) -> Option<&str> {
        let id = match self {
            Self::Saw(sighting) => &sighting.sentinel_id,
            Self::Unknown(id) => id,
            Self::Failed(_) => return None,
        };
        (!id.is_empty()).then_some(id.as_str())
    }
}

/// The answers of the sentinels asked so far.
#[derive(Debug)]
pub(crate) struct Census {
    /// How many sentinels are configured: a majority is more than half of them.
    asked: usize,
    answers: Vec<(String, Answer)>,
}

/// The primary a majority of the sentinels named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Elected {
    pub(crate) host: String,
    pub(crate) port: u16,
    /// The highest epoch an agreeing sentinel gave.
    pub(crate) epoch: u64,
    /// Most agreeing sentinels flag it down.
    pub(crate) down: bool,
    /// Some sentinel leads a failover to another address now: the elected primary is
    /// about to be replaced (its writes may be lost with it).
    pub(crate) failing_over: bool,
    /// Every replica an agreeing sentinel lists as promotable.
    pub(crate) replicas: Vec<Address>,
    /// What the agreeing sentinels know of its past.
    pub(crate) witness: Witness,
}

impl Census {
    /// No answers yet, from `asked` configured sentinels.
    pub(crate) fn new(asked: usize) -> Self {
        Self {
            asked,
            answers: Vec::with_capacity(asked),
        }
    }

    /// Adds the answer of the sentinel at `sentinel`.
    pub(crate) fn add(&mut self, sentinel: String, answer: Answer) {
        self.answers.push((sentinel, answer));
    }

    /// More than half of the configured sentinels.
    fn majority(&self) -> usize {
        crate::model::majority(self.asked)
    }

    /// Whether the answers so far decide: a majority names one address, or every
    /// configured sentinel answered.
    pub(crate) fn decided(&self) -> bool {
        self.elected().is_some() || self.answers.len() >= self.asked
    }

    /// How many sentinels do not know the master, each once.
    fn unknown(&self) -> usize {
        self.answers
            .iter()
            .enumerate()
            .filter(|(i, (_, answer))| {
                matches!(answer, Answer::Unknown(_)) && self.first_name_of(*i).is_none()
            })
            .count()
    }

    /// Every primary named, once per sentinel.
    fn sightings(&self) -> impl Iterator<Item = (&str, &Sighting)> {
        self.answers
            .iter()
            .enumerate()
            .filter_map(|(i, (sentinel, answer))| match answer {
                Answer::Saw(sighting) if self.first_name_of(i).is_none() => {
                    Some((sentinel.as_str(), sighting))
                }
                _ => None,
            })
    }

    /// The name under which the sentinel of answer `i` answered before, when it did: one
    /// sentinel given twice (`127.0.0.1:26379` and `localhost:26379`, or a name that moved
    /// to it) would otherwise make a majority of itself. Told by its run id.
    fn first_name_of(&self, i: usize) -> Option<&str> {
        let this = self.answers[i].1.sentinel_id()?;
        self.answers[..i]
            .iter()
            .find(|(_, answer)| answer.sentinel_id() == Some(this))
            .map(|(sentinel, _)| sentinel.as_str())
    }

    /// The address a majority of the configured sentinels names, if any.
    pub(crate) fn elected(&self) -> Option<Elected> {
        let mut votes: HashMap<(&str, u16), Vec<&Sighting>> = HashMap::new();
        for (_, sighting) in self.sightings() {
            votes
                .entry((sighting.host.as_str(), sighting.port))
                .or_default()
                .push(sighting);
        }
        let ((host, port), agreeing) = votes
            .into_iter()
            .find(|(_, agreeing)| agreeing.len() >= self.majority())?;
        let mut replicas: Vec<Address> = Vec::new();
        for replica in agreeing.iter().flat_map(|s| &s.replicas) {
            if !replicas.contains(replica) {
                replicas.push(replica.clone());
            }
        }
        Some(Elected {
            host: host.to_owned(),
            port,
            epoch: agreeing.iter().map(|s| s.epoch).max().unwrap_or(0),
            down: agreeing.iter().filter(|s| s.down).count() * 2 > agreeing.len(),
            failing_over: self
                .sightings()
                .any(|(_, s)| s.failing_over && (s.host != host || s.port != port)),
            replicas,
            witness: Witness {
                sentinels_up: agreeing.iter().filter_map(|s| s.uptime).max(),
                run_ids: agreeing
                    .iter()
                    .map(|s| s.run_id.clone())
                    .filter(|id| !id.is_empty())
                    .collect(),
                primary_for_ms: agreeing.iter().filter_map(|s| s.primary_for_ms).max(),
            },
        })
    }

    /// What the sentinels that did not name `elected` said, one line each.
    pub(crate) fn dissent(&self, elected: &Elected) -> Vec<String> {
        self.answers
            .iter()
            .enumerate()
            .filter_map(|(i, (sentinel, answer))| match answer {
                Answer::Saw(_) if self.first_name_of(i).is_some() => None,
                Answer::Saw(s) if s.host == elected.host && s.port == elected.port => None,
                Answer::Saw(s) => Some(format!(
                    "{sentinel} names {}:{} (epoch {})",
                    s.host, s.port, s.epoch
                )),
                Answer::Unknown(_) => Some(format!("{sentinel} does not know the master")),
                Answer::Failed(_) => None,
            })
            .collect()
    }

    /// Every answer, one line each: what `status` shows, and what an error says.
    pub(crate) fn describe(&self) -> Vec<String> {
        self.answers
            .iter()
            .enumerate()
            .map(
                |(i, (sentinel, answer))| match (answer, self.first_name_of(i)) {
                    (_, Some(first)) => {
                        format!(
                            "{sentinel} is the sentinel {first} (the same run id), counted once"
                        )
                    }
                    (answer, None) => match answer {
                        Answer::Saw(s) => format!(
                            "{sentinel} names {}:{} (epoch {}, {} replicas{}{})",
                            s.host,
                            s.port,
                            s.epoch,
                            s.replicas.len(),
                            if s.down { ", down" } else { "" },
                            if s.failing_over { ", failing over" } else { "" }
                        ),
                        Answer::Unknown(_) => format!("{sentinel} does not know the master"),
                        Answer::Failed(err) => format!("{sentinel}: {err}"),
                    },
                },
            )
            .collect()
    }

    /// Why no primary was elected, as an error: the master is unknown (to a majority, and
    /// none names a primary), every sentinel refused the login, none answered, or they
    /// disagree.
    pub(crate) fn failure(&self, master: &str) -> RedisError {
        let failed: Vec<&RedisError> = self
            .answers
            .iter()
            .filter_map(|(_, answer)| match answer {
                Answer::Failed(err) => Some(err),
                _ => None,
            })
            .collect();
        // Bad input when no sentinel names a primary, and a majority (or every one that
        // answered) does not know the master: a sentinel that is down cannot vouch for the
        // name. One that names a primary while others do not know it (rebuilt without their
        // configuration, or being given `SENTINEL MONITOR`) is a state of the deployment that
        // passes, retried within the deadline.
        let unknown_to_all_that_answered = failed.is_empty() && self.answers.len() >= self.asked;
        if self.unknown() > 0
            && self.sightings().next().is_none()
            && (self.unknown() >= self.majority() || unknown_to_all_that_answered)
        {
            return RedisError::from((
                ErrorKind::MasterNameNotFoundBySentinel,
                "no sentinel knows the master",
                master.to_owned(),
            ));
        }
        let said = self.describe().join("; ");
        if !failed.is_empty()
            && failed.len() == self.answers.len()
            && failed.iter().all(|err| is_login_refused(err))
        {
            return RedisError::from((
                ErrorKind::AuthenticationFailed,
                "the sentinels refused the login (is the sentinels' password in their URLs?)",
                said,
            ));
        }
        if self.sightings().next().is_none() {
            return crate::error::unavailable(match self.unknown() {
                0 => format!(
                    "none of {} sentinels answered for {master:?}: {said}",
                    self.asked
                ),
                unknown => format!(
                    "{unknown} of {} sentinels do not know {master:?} and no other answered: {said}",
                    self.asked
                ),
            });
        }
        crate::error::unavailable(format!(
            "no majority of the {} sentinels names one primary of {master:?} (a failover under way, or a sentinel that watches another primary): {said}",
            self.asked
        ))
    }
}

/// Whether a sentinel refused us for lack of (or a wrong) password.
fn is_login_refused(err: &RedisError) -> bool {
    err.kind() == ErrorKind::AuthenticationFailed
        || err
            .code()
            .is_some_and(|code| matches!(code, "NOAUTH" | "WRONGPASS"))
}

/// A reply's text, when it is a string or a number.
fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok().map(str::to_owned),
        Value::SimpleString(text) => Some(text.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Field names and values, from a flat array (RESP2) or a map (RESP3).
fn fields(value: &Value) -> HashMap<String, String> {
    match value {
        Value::Array(items) => items
            .chunks(2)
            .filter_map(|pair| Some((text(pair.first()?)?, text(pair.get(1)?)?)))
            .collect(),
        Value::Map(pairs) => pairs
            .iter()
            .filter_map(|(k, v)| Some((text(k)?, text(v)?)))
            .collect(),
        _ => HashMap::new(),
    }
}

/// A sentinel's answers to one request: `SENTINEL GET-MASTER-ADDR-BY-NAME` (`[ip, port]`,
/// nil for a master it does not monitor), `SENTINEL MASTER`, `SENTINEL REPLICAS` and
/// `INFO server`. A server error in the first (a login refused, a data node that does not
/// know `SENTINEL`) is the answer's error.
pub(crate) fn parse_answer(replies: &[Value]) -> Answer {
    let [address, master, replicas, info] = replies else {
        return Answer::Failed(RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "a sentinel answered with the wrong number of replies",
        )));
    };
    if let Value::ServerError(err) = address {
        let err: RedisError = err.clone().into();
        if err.code() == Some("ERR") && err.to_string().contains("unknown command") {
            return Answer::Failed(RedisError::from((
                ErrorKind::InvalidClientConfig,
                "not a sentinel (it does not know the SENTINEL command): is this URL a data node's?",
            )));
        }
        return Answer::Failed(err);
    }
    let info = text(info).unwrap_or_default();
    let sentinel_id = info_field(&info, "run_id").unwrap_or_default().to_owned();
    let Value::Array(address) = address else {
        return Answer::Unknown(sentinel_id);
    };
    let (Some(host), Some(port)) = (
        address.first().and_then(text),
        address
            .get(1)
            .and_then(text)
            .and_then(|p| p.parse::<u16>().ok()),
    ) else {
        return Answer::Unknown(sentinel_id);
    };
    let master = fields(master);
    let field = |name: &str| master.get(name).map_or("", String::as_str);
    let monitored = field("ip") == host && field("port") == port.to_string();
    let flagged = |names: &[&str]| field("flags").split(',').any(|flag| names.contains(&flag));
    Answer::Saw(Sighting {
        epoch: field("config-epoch").parse().unwrap_or(0),
        down: monitored && flagged(&["s_down", "o_down"]),
        // A sentinel names another address than the master it monitors only while it
        // promotes that address.
        failing_over: !monitored || flagged(&["failover_in_progress"]),
        replicas: promotable(replicas, (&host, port)),
        uptime: info_field(&info, "uptime_in_seconds").and_then(|n| n.parse().ok()),
        run_id: if monitored {
            field("runid").to_owned()
        } else {
            String::new()
        },
        primary_for_ms: monitored
            .then(|| field("role-reported-time").parse().ok())
            .flatten(),
        sentinel_id,
        host,
        port,
    })
}

/// The replicas in a `SENTINEL REPLICAS` reply that Sentinel could promote (or that
/// acknowledge writes): not flagged down, and answering pings. `named`,
/// the address being promoted, is no replica any more.
fn promotable(replicas: &Value, named: (&str, u16)) -> Vec<Address> {
    let Value::Array(replicas) = replicas else {
        return Vec::new();
    };
    replicas
        .iter()
        .map(fields)
        .filter(|replica| {
            let flags = replica.get("flags").map_or("", String::as_str);
            // Not `disconnected`: a sentinel's link to a replica breaks for a moment when
            // another sentinel promotes it (it kills every normal client connection there),
            // the very moment its acknowledgement matters most.
            let down = flags
                .split(',')
                .any(|flag| matches!(flag, "s_down" | "o_down"));
            let within = |field: &str, limit: u64| {
                replica
                    .get(field)
                    .and_then(|ms| ms.parse::<u64>().ok())
                    .is_some_and(|ms| ms <= limit)
            };
            let asked = replica.get("runid").is_some_and(|id| !id.is_empty());
            !down
                && asked
                && within("last-ok-ping-reply", PROMOTABLE_WITHIN)
                && within("info-refresh", INFO_VALID_WITHIN)
        })
        .filter_map(|replica| {
            let host = replica.get("ip")?.clone();
            let port = replica.get("port")?.parse().ok()?;
            Some((host, port))
        })
        .filter(|(host, port)| (host.as_str(), *port) != named)
        .collect()
}

/// A field of an `INFO` reply (`name:value` lines).
pub(crate) fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        line.strip_prefix(name)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(str::trim)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    fn flat(fields: &[&str]) -> Value {
        Value::Array(fields.iter().copied().map(bulk).collect())
    }

    fn seen(port: u16, epoch: u64) -> Answer {
        Answer::Saw(Sighting {
            host: "127.0.0.1".into(),
            port,
            epoch,
            down: false,
            failing_over: false,
            replicas: vec![("127.0.0.1".into(), 9000)],
            uptime: Some(10),
            run_id: "ab12".into(),
            primary_for_ms: Some(9_000),
            sentinel_id: format!("sentinel-{port}-{epoch}"),
        })
    }

    fn replica(port: &str, flags: &str, ping: &str) -> Value {
        // Never asked for INFO: no run id (and an info-refresh of 0).
        let (runid, info) = if port == "7007" {
            ("", "0")
        } else {
            ("ab12", "900")
        };
        flat(&[
            "runid",
            runid,
            "ip",
            "127.0.0.1",
            "port",
            port,
            "flags",
            flags,
            "last-ok-ping-reply",
            ping,
            "info-refresh",
            info,
        ])
    }

    #[test]
    fn an_answer_gives_address_epoch_state_replicas_and_uptime() {
        let master = flat(&[
            "name",
            "locks",
            "ip",
            "127.0.0.1",
            "port",
            "7001",
            "flags",
            "master",
            "config-epoch",
            "3",
            "role-reported-time",
            "61000",
        ]);
        let replicas = Value::Array(vec![
            replica("7002", "slave", "300"),
            replica("7003", "s_down,slave", "300"),
            replica("7004", "slave,disconnected", "300"),
            replica("7005", "slave", "9000"),
            replica("7006", "slave", "0"),
            replica("7007", "slave,disconnected", "10"),
        ]);
        let info = bulk("# Server\r\nuptime_in_seconds:42\r\n");
        let answer = parse_answer(&[
            flat(&["127.0.0.1", "7001"]),
            master.clone(),
            replicas.clone(),
            info.clone(),
        ]);
        let Answer::Saw(sighting) = answer else {
            panic!("{answer:?}")
        };
        assert_eq!((sighting.port, sighting.epoch), (7001, 3));
        assert!(!sighting.down && !sighting.failing_over);
        let ports: Vec<u16> = sighting.replicas.iter().map(|r| r.1).collect();
        assert_eq!(ports, [7002, 7004, 7006]);
        assert_eq!(sighting.uptime, Some(42));
        assert_eq!(sighting.primary_for_ms, Some(61_000));
        // The leader of a failover names the replica it promotes, which is no replica.
        let answer = parse_answer(&[flat(&["127.0.0.1", "7002"]), master, replicas, info]);
        let Answer::Saw(sighting) = answer else {
            panic!("{answer:?}")
        };
        assert!(sighting.failing_over);
        assert_eq!(
            sighting.replicas.iter().map(|r| r.1).collect::<Vec<_>>(),
            [7004, 7006]
        );
    }

    #[test]
    fn a_sentinel_that_does_not_know_the_master_is_unknown() {
        assert!(matches!(
            parse_answer(&[Value::Nil, Value::Nil, Value::Nil, Value::Nil]),
            Answer::Unknown(_)
        ));
        assert!(matches!(parse_answer(&[Value::Nil]), Answer::Failed(_)));
    }

    #[test]
    fn a_majority_of_the_configured_sentinels_names_the_primary() {
        let mut census = Census::new(3);
        census.add("s3".into(), seen(7100, 9));
        assert!(
            !census.decided(),
            "one of three is no majority, whatever its epoch"
        );
        census.add("s1".into(), seen(7001, 2));
        assert!(!census.decided());
        census.add("s2".into(), seen(7001, 3));
        let elected = census.elected().unwrap();
        assert_eq!((elected.port, elected.epoch), (7001, 3));
        assert_eq!(
            census.dissent(&elected),
            ["s3 names 127.0.0.1:7100 (epoch 9)"]
        );
        // Split answers elect nobody: the failure names every answer.
        let mut split = Census::new(3);
        split.add("s1".into(), seen(7001, 2));
        split.add("s2".into(), seen(7002, 3));
        split.add(
            "s3".into(),
            Answer::Failed(crate::error::unavailable("down".into())),
        );
        assert!(split.elected().is_none());
        let err = split.failure("locks").to_string();
        assert!(
            err.contains("no majority") && err.contains("s2 names 127.0.0.1:7002"),
            "{err}"
        );
        // One sentinel given twice (two names, one run id) is one voice, not a majority.
        let mut twice = Census::new(3);
        let of = |sentinel: &str| {
            let Answer::Saw(sighting) = seen(7004, 5) else {
                unreachable!("seen is a sighting")
            };
            Answer::Saw(Sighting {
                sentinel_id: sentinel.into(),
                ..sighting
            })
        };
        twice.add("127.0.0.1:26381".into(), of("c"));
        twice.add("localhost:26381".into(), of("c"));
        assert!(twice.elected().is_none(), "one sentinel under two names");
        assert!(!twice.decided());
        twice.add("127.0.0.1:26379".into(), of("a"));
        assert_eq!(
            twice.elected().map(|e| e.port),
            Some(7004),
            "two distinct ones"
        );
        assert!(
            twice.describe()[1].contains("is the sentinel 127.0.0.1:26381"),
            "{:?}",
            twice.describe()
        );
        // Nor is it a majority that does not know the master.
        let mut unknown_twice = Census::new(3);
        unknown_twice.add("127.0.0.1:26381".into(), Answer::Unknown("c".into()));
        unknown_twice.add("localhost:26381".into(), Answer::Unknown("c".into()));
        assert!(!unknown_twice.decided(), "one sentinel under two names");
        // A majority that does not know the master: the third may name a primary (a
        // sentinel rebuilt without its configuration, or being given `SENTINEL MONITOR`).
        let mut unknown = Census::new(3);
        unknown.add("s1".into(), Answer::Unknown("a".into()));
        unknown.add("s2".into(), Answer::Unknown("b".into()));
        assert!(!unknown.decided(), "the third may name the primary");
        // It does: still no majority, a state of the deployment to wait out.
        let mut named = Census::new(3);
        named.add("s1".into(), Answer::Unknown("a".into()));
        named.add("s2".into(), Answer::Unknown("b".into()));
        named.add("s3".into(), seen(7000, 1));
        assert!(named.elected().is_none());
        assert_ne!(
            named.failure("locks").kind(),
            ErrorKind::MasterNameNotFoundBySentinel
        );
        // The third down: nobody vouches for the name (a typo with a sentinel down).
        let mut down = Census::new(3);
        down.add("s1".into(), Answer::Unknown("a".into()));
        down.add("s2".into(), Answer::Unknown("b".into()));
        down.add(
            "s3".into(),
            Answer::Failed(std::io::Error::other("refused").into()),
        );
        assert_eq!(
            down.failure("locks").kind(),
            ErrorKind::MasterNameNotFoundBySentinel
        );
        // One that does not know it, the others down: no majority either way.
        let mut alone = Census::new(3);
        alone.add("s1".into(), Answer::Unknown("a".into()));
        alone.add(
            "s2".into(),
            Answer::Failed(std::io::Error::other("refused").into()),
        );
        alone.add(
            "s3".into(),
            Answer::Failed(std::io::Error::other("refused").into()),
        );
        let err = alone.failure("locks");
        assert_ne!(err.kind(), ErrorKind::MasterNameNotFoundBySentinel);
        assert!(
            err.to_string().contains("1 of 3 sentinels do not know"),
            "{err}"
        );
        // Every sentinel answered, and none knows it: a master name no sentinel knows.
        unknown.add("s3".into(), Answer::Unknown("c".into()));
        assert!(unknown.decided());
        assert_eq!(
            unknown.failure("locks").kind(),
            ErrorKind::MasterNameNotFoundBySentinel
        );
    }
}
