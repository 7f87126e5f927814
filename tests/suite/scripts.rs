//! The scripts' spec table: each row a state before, a call, the reply and the state after,
//! read as "It should ...". Rows drive the public API (an obtain in some modes, a release, a
//! refresh, a ttl) against a real server and check the raw keys, so that they outlive any
//! refactor of the Lua; what only a script reaches (another client's holder, a queued
//! waiter's record, a writer's mark) is written by hand in the state before.
//!
//! `{now+N}` in a raw command is the server's clock in ms plus N (a set member's expiry).
//! One server for the whole table, flushed before each row; every failing row is reported.

mod harness;

use crate::support::Env;
use harness::{Call, Given, Reply, Row, Then, run};
use lockset::Mode;

const X: Mode = Mode::Exclusive;
const S: Mode = Mode::Shared;
const P1: Mode = Mode::Permit { limit: 1 };
const P2: Mode = Mode::Permit { limit: 2 };
const P3: Mode = Mode::Permit { limit: 3 };

use Given::{Hold, Raw};

/// Someone else ("5:other") shares "{d}doc" for 60 s.
const READER: Given = Raw(&["ZADD", "{d}doc", "-inf", "=s", "{now+60000}", "5:other"]);
/// A writer waits for "{d}doc"'s holders to leave, for 60 s more.
const WRITER_WAITS: Given = Raw(&["ZADD", "{d}doc", "{now+60000}", "=x"]);
/// "{d}doc" lives for 60 s.
const DOC_LIVES: Given = Raw(&["PEXPIRE", "{d}doc", "60000"]);

const ROWS: &[Row] = &[
    // The admission rule: exclusive, shared, counted.
    Row {
        it: "let a reader share a key with live readers",
        given: &[READER, DOC_LIVES],
        when: Call::Obtain("me", &[("{d}doc", S)], 10_000, ""),
        reply: Reply::Done,
        then: &[Then::Members("{d}doc", &["=s", "2:me", "5:other"])],
    },
    Row {
        it: "keep a writer out while a reader holds the key",
        given: &[READER, DOC_LIVES],
        when: Call::Obtain("me", &[("{d}doc", X)], 10_000, ""),
        reply: Reply::Held,
        then: &[Then::Members("{d}doc", &["=s", "5:other"])],
    },
    Row {
        it: "keep a reader out of an exclusively held key",
        given: &[Raw(&["SET", "{d}doc", "5:other", "PX", "60000"])],
        when: Call::Obtain("me", &[("{d}doc", S)], 10_000, ""),
        reply: Reply::Held,
        then: &[Then::Get("{d}doc", Some("5:other"))],
    },
    Row {
        it: "let a writer replace a set whose holders all expired",
        given: &[
            Raw(&["ZADD", "{d}doc", "-inf", "=s", "1", "5:other"]),
            DOC_LIVES,
        ],
        when: Call::Obtain("me", &[("{d}doc", X)], 10_000, ""),
        reply: Reply::Done,
        then: &[
            Then::Get("{d}doc", Some("2:me")),
            Then::LivesAtMost("{d}doc", 10_000),
        ],
    },
    Row {
        it: "let a reader replace a permit set whose holders all expired",
        given: &[
            Raw(&["ZADD", "{d}doc", "-inf", "=p2", "1", "5:other"]),
            DOC_LIVES,
        ],
        when: Call::Obtain("me", &[("{d}doc", S)], 10_000, ""),
        reply: Reply::Done,
        then: &[Then::Members("{d}doc", &["=s", "2:me"])],
    },
    Row {
        it: "refuse a reader on a key held as permits (another mode)",
        given: &[Raw(&[
            "ZADD",
            "{d}doc",
            "-inf",
            "=p2",
            "{now+60000}",
            "5:other",
        ])],
        when: Call::Obtain("me", &[("{d}doc", S)], 10_000, ""),
        reply: Reply::Mismatch,
        then: &[Then::Members("{d}doc", &["=p2", "5:other"])],
    },
    Row {
        it: "refuse a permit of another limit",
        given: &[Raw(&[
            "ZADD",
            "{d}doc",
            "-inf",
            "=p2",
            "{now+60000}",
            "5:other",
        ])],
        when: Call::Obtain("me", &[("{d}doc", P3)], 10_000, ""),
        reply: Reply::Mismatch,
        then: &[],
    },
    Row {
        it: "admit permit holders up to the limit",
        given: &[
            Raw(&["ZADD", "{d}doc", "-inf", "=p2", "{now+60000}", "5:other"]),
            DOC_LIVES,
        ],
        when: Call::Obtain("me", &[("{d}doc", P2)], 10_000, ""),
        reply: Reply::Done,
        then: &[Then::Members("{d}doc", &["=p2", "2:me", "5:other"])],
    },
    Row {
        it: "refuse a permit beyond the limit",
        given: &[
            Raw(&["ZADD", "{d}doc", "-inf", "=p2", "{now+60000}", "5:other"]),
            Raw(&["ZADD", "{d}doc", "{now+60000}", "6:other2"]),
        ],
        when: Call::Obtain("me", &[("{d}doc", P2)], 10_000, ""),
        reply: Reply::Held,
        then: &[Then::Members("{d}doc", &["=p2", "5:other", "6:other2"])],
    },
    Row {
        it: "prune expired permit holders and not count them",
        given: &[
            Raw(&["ZADD", "{d}doc", "-inf", "=p2", "{now+60000}", "5:other"]),
            Raw(&["ZADD", "{d}doc", "1", "6:other2"]),
            DOC_LIVES,
        ],
        when: Call::Obtain("me", &[("{d}doc", P2)], 10_000, ""),
        reply: Reply::Done,
        then: &[Then::Members("{d}doc", &["=p2", "2:me", "5:other"])],
    },
    Row {
        it: "keep readers out while a writer waits (writers first)",
        given: &[READER, WRITER_WAITS, DOC_LIVES],
        when: Call::Obtain("me", &[("{d}doc", S)], 10_000, ""),
        reply: Reply::Held,
        then: &[Then::Members("{d}doc", &["=s", "5:other", "=x"])],
    },
    Row {
        it: "keep permit holders out while a writer waits, with permits left",
        given: &[
            Raw(&["ZADD", "{d}doc", "-inf", "=p3", "{now+60000}", "5:other"]),
            WRITER_WAITS,
            DOC_LIVES,
        ],
        when: Call::Obtain("me", &[("{d}doc", P3)], 10_000, ""),
        reply: Reply::Held,
        then: &[],
    },
    Row {
        it: "keep readers out of a set nobody holds while a writer waits",
        given: &[
            Raw(&["ZADD", "{d}doc", "-inf", "=s", "{now+60000}", "=x"]),
            DOC_LIVES,
        ],
        when: Call::Obtain("me", &[("{d}doc", S)], 10_000, ""),
        reply: Reply::Held,
        then: &[],
    },
    Row {
        it: "let a lock that writes some key read past a waiting writer",
        given: &[READER, WRITER_WAITS, DOC_LIVES],
        when: Call::Obtain("me", &[("{d}doc", S), ("{d}out", X)], 10_000, ""),
        reply: Reply::Done,
        then: &[
            Then::Members("{d}doc", &["=s", "2:me", "5:other", "=x"]),
            Then::Get("{d}out", Some("2:me")),
        ],
    },
    Row {
        it: "ignore a writer's mark that has expired",
        given: &[READER, Raw(&["ZADD", "{d}doc", "1", "=x"]), DOC_LIVES],
        when: Call::Obtain("me", &[("{d}doc", S)], 10_000, ""),
        reply: Reply::Done,
        then: &[Then::Members("{d}doc", &["=s", "2:me", "5:other"])],
    },
    Row {
        it: "mark a writer's wait, so that new readers stay out, when the writer retries",
        given: &[READER, DOC_LIVES],
        when: Call::Retried("me", &[("{d}doc", X)]),
        reply: Reply::Held,
        then: &[Then::ScoreOver("{d}doc", "=x", 1_000.0)],
    },
    Row {
        it: "take no key when one of them is held (all or nothing)",
        given: &[READER, DOC_LIVES],
        when: Call::Obtain("me", &[("{d}free", P2), ("{d}doc", X)], 10_000, ""),
        reply: Reply::Held,
        then: &[Then::Exists("{d}free", false)],
    },
    Row {
        it: "report a key of another type",
        given: &[Raw(&["HSET", "{d}doc", "f", "v"])],
        when: Call::Obtain("me", &[("{d}doc", S)], 10_000, ""),
        reply: Reply::WrongType,
        then: &[],
    },
    // Re-obtain by the owner's own token.
    Row {
        it: "re-obtain an exclusive key by token, keeping the longer TTL",
        given: &[Raw(&["SET", "{d}a", "2:me", "PX", "60000"])],
        when: Call::Obtain("me", &[("{d}a", X), ("{d}b", X)], 1_000, ""),
        reply: Reply::Done,
        then: &[
            Then::LivesOver("{d}a", 30_000),
            Then::LivesAtMost("{d}b", 1_000),
        ],
    },
    Row {
        it: "re-obtain an exclusive key by token, keeping a waiter's mark",
        given: &[Raw(&["SET", "{d}a", "!2:me", "PX", "60000"])],
        when: Call::Obtain("me", &[("{d}a", X), ("{d}doc", S)], 1_000, "m"),
        reply: Reply::Done,
        then: &[
            Then::Get("{d}a", Some("!2:mem")),
            Then::LivesOver("{d}a", 30_000),
        ],
    },
    Row {
        it: "re-obtain a shared key by token under new metadata, never for less",
        given: &[
            Raw(&["ZADD", "{d}doc", "-inf", "=s", "{now+60000}", "2:me"]),
            DOC_LIVES,
        ],
        when: Call::Obtain("me", &[("{d}doc", S)], 1_000, "m"),
        reply: Reply::Done,
        then: &[
            Then::Members("{d}doc", &["=s", "2:mem"]),
            Then::ScoreOver("{d}doc", "2:mem", 30_000.0),
        ],
    },
    Row {
        it: "re-obtain a shared key by token for longer when asked for longer",
        given: &[
            Raw(&["ZADD", "{d}doc", "-inf", "=s", "{now+1000}", "2:me"]),
            DOC_LIVES,
        ],
        when: Call::Obtain("me", &[("{d}doc", S)], 60_000, ""),
        reply: Reply::Done,
        then: &[Then::ScoreOver("{d}doc", "2:me", 30_000.0)],
    },
    // Fencing.
    Row {
        it: "mint a fencing token above the counter and the clock, and leave it in the counter",
        given: &[Raw(&["SET", "{d}fence", "5"])],
        when: Call::Fenced("me", &[("{d}a", X)]),
        reply: Reply::Fence,
        then: &[],
    },
    Row {
        it: "mint a fencing token for a lock with modes",
        given: &[Raw(&["SET", "{d}fence", "5"])],
        when: Call::Fenced("me", &[("{d}doc", S), ("{d}a", X)]),
        reply: Reply::Fence,
        then: &[Then::Members("{d}doc", &["=s", "2:me"])],
    },
    Row {
        it: "refuse a fencing counter that is not a number, and take no key",
        given: &[Raw(&["SET", "{d}fence", "abc"])],
        when: Call::Fenced("me", &[("{d}doc", S)]),
        reply: Reply::Failed(String::new()),
        then: &[Then::Exists("{d}doc", false)],
    },
    // Expiry.
    Row {
        it: "report a lock whose shared member expired as held no more",
        given: &[
            Hold("me", &[("{d}doc", S)]),
            Raw(&["ZADD", "{d}doc", "XX", "1", "2:me"]),
        ],
        when: Call::Ttl("me"),
        reply: Reply::NotHeld,
        then: &[],
    },
    Row {
        it: "refresh a shared key, the set living as long as its latest holder",
        given: &[Hold("me", &[("{d}doc", S)]), READER],
        when: Call::Refresh("me", 120_000),
        reply: Reply::Done,
        then: &[
            Then::ScoreOver("{d}doc", "2:me", 90_000.0),
            Then::LivesOver("{d}doc", 90_000),
        ],
    },
    Row {
        it: "release a shared key, leaving the other readers",
        given: &[Hold("me", &[("{d}doc", S)]), READER],
        when: Call::Release("me"),
        reply: Reply::Done,
        then: &[Then::Members("{d}doc", &["=s", "5:other"])],
    },
    // The hand-off: a release gives a freed key to the queue's first waiter.
    Row {
        it: "hand a freed exclusive key to the queued waiter, marked",
        given: &[
            Hold("me", &[("{d}doc", X)]),
            Raw(&["SET", "{d}doc", "!2:me", "KEEPTTL"]),
            Given::Waiter("x", &["{d}doc"]),
        ],
        when: Call::Release("me"),
        reply: Reply::Done,
        then: &[
            Then::Get("{d}doc", Some("!1:w")),
            Then::Exists("{d}doc:lockset:queue:w", false),
        ],
    },
    Row {
        it: "keep a queued writer waiting while a reader is left",
        given: &[
            Hold("me", &[("{d}doc", S)]),
            Hold("you", &[("{d}doc", S)]),
            Raw(&["ZADD", "{d}doc", "-inf", "=w"]),
            Given::Waiter("x", &["{d}doc"]),
        ],
        when: Call::Release("me"),
        reply: Reply::Done,
        then: &[
            Then::Members("{d}doc", &["=s", "=w", "3:you"]),
            Then::Exists("{d}doc:lockset:queue:w", true),
        ],
    },
    Row {
        it: "hand a key to a queued writer when the last reader leaves",
        given: &[
            Hold("me", &[("{d}doc", S)]),
            Hold("you", &[("{d}doc", S)]),
            Raw(&["ZADD", "{d}doc", "-inf", "=w"]),
            Given::Waiter("x", &["{d}doc"]),
            Given::Release("you"),
        ],
        when: Call::Release("me"),
        reply: Reply::Done,
        then: &[Then::Get("{d}doc", Some("!1:w"))],
    },
    Row {
        it: "hand a freed permit to a queued permit waiter",
        given: &[
            Hold("me", &[("{d}doc", P1)]),
            Raw(&["ZADD", "{d}doc", "-inf", "=w"]),
            Given::Waiter("p1", &["{d}doc"]),
        ],
        when: Call::Release("me"),
        reply: Reply::Done,
        then: &[
            Then::Members("{d}doc", &["=p1", "=w", "1:w"]),
            Then::Exists("{d}doc:lockset:queue:w", false),
        ],
    },
    Row {
        it: "hand a reader nothing while a writer waits on its other key (writers first)",
        given: &[
            Hold("me", &[("{d}doc", X)]),
            Raw(&["SET", "{d}doc", "!2:me", "KEEPTTL"]),
            Raw(&[
                "ZADD",
                "{d}lib",
                "-inf",
                "=s",
                "{now+60000}",
                "5:other",
                "{now+60000}",
                "=x",
            ]),
            Given::Waiter("s,s", &["{d}doc", "{d}lib"]),
        ],
        when: Call::Release("me"),
        reply: Reply::Done,
        then: &[
            Then::Exists("{d}doc", false),
            Then::Exists("{d}doc:lockset:queue:w", true),
        ],
    },
    Row {
        it: "hand a reader both keys when the writer's mark on its other key has expired",
        given: &[
            Hold("me", &[("{d}doc", X)]),
            Raw(&["SET", "{d}doc", "!2:me", "KEEPTTL"]),
            Raw(&[
                "ZADD",
                "{d}lib",
                "-inf",
                "=s",
                "{now+60000}",
                "5:other",
                "1",
                "=x",
            ]),
            Given::Waiter("s,s", &["{d}doc", "{d}lib"]),
        ],
        when: Call::Release("me"),
        reply: Reply::Done,
        then: &[Then::Members("{d}doc", &["=s", "=w", "1:w"])],
    },
    Row {
        it: "hand a reader both keys when its other key has room",
        given: &[
            Hold("me", &[("{d}doc", X)]),
            Raw(&["SET", "{d}doc", "!2:me", "KEEPTTL"]),
            Raw(&["ZADD", "{d}lib", "-inf", "=s", "{now+60000}", "5:other"]),
            Given::Waiter("s,s", &["{d}doc", "{d}lib"]),
        ],
        when: Call::Release("me"),
        reply: Reply::Done,
        then: &[
            Then::Members("{d}doc", &["=s", "=w", "1:w"]),
            Then::Members("{d}lib", &["=s", "1:w", "5:other"]),
        ],
    },
];

/// It should ... every row of the table.
#[tokio::test]
async fn the_scripts_do_what_each_row_says() {
    let env = Env::start().await;
    let mut failed = Vec::new();
    for row in ROWS {
        if let Err(why) = run(&env, row).await {
            failed.push(format!("It should {}: {why}", row.it));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} rows failed:\n{}",
        failed.len(),
        ROWS.len(),
        failed.join("\n")
    );
}
