//! Tokens and the value stored in every locked key.
//!
//! A key's value is `"<token length>:<token><metadata>"`. The part up to the end of the
//! token is the *owner tag*; since it spells out the token's length, comparing a value's
//! prefix with our tag is an exact token comparison. A token that is a prefix of another
//! holder's token (or of token + metadata) can never pass for it, which is how
//! bsm/redislock's custom tokens can take over someone else's lock.
//!
//! A waiter that finds a key held marks the holder's value with a leading `!`
//! ([`WAITER_MARK`]): the holder's release reads its values anyway, and announces only the keys
//! that somebody waits for. The mark changes nothing about ownership or metadata.

use std::borrow::Cow;
use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::Rng as _;

use crate::model::invalid::InvalidInput;

/// Random bytes in a generated token.
const TOKEN_BYTES: usize = 16;
/// Characters of a generated token: 16 bytes in base64 without padding.
const RANDOM_TOKEN_LEN: usize = 22;
/// The owner tag's length prefix for a generated token.
const RANDOM_TAG_PREFIX: &str = "22:";

/// Leads a stored value when somebody waits for the key (see the module docs).
pub(crate) const WAITER_MARK: u8 = b'!';

/// Who owns a lock: its token, and the tag that starts every value it stores.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Owner {
    /// `"<token length>:<token>"`.
    tag: String,
    /// Where the token starts inside `tag`.
    token_at: usize,
    /// The caller chose the token: it may already hold keys (under other metadata).
    custom: bool,
}

impl Owner {
    /// A fresh owner with 16 bytes from the cryptographically secure thread RNG, base64
    /// URL-safe without padding.
    pub(crate) fn random() -> Self {
        let mut bytes = [0u8; TOKEN_BYTES];
        rand::rng().fill_bytes(&mut bytes);
        // Encoded straight after the length prefix: one allocation per lock.
        let mut tag = String::with_capacity(3 + RANDOM_TOKEN_LEN);
        tag.push_str(RANDOM_TAG_PREFIX);
        URL_SAFE_NO_PAD.encode_string(bytes, &mut tag);
        Self {
            tag,
            token_at: RANDOM_TAG_PREFIX.len(),
            custom: false,
        }
    }

    /// An owner with a caller-chosen token, for re-entrant re-obtain.
    pub(crate) fn custom(token: &str) -> Result<Self, InvalidInput> {
        if token.is_empty() {
            return Err(InvalidInput::EmptyToken);
        }
        Ok(Self::from_token(token))
    }

    fn from_token(token: &str) -> Self {
        let tag = format!("{}:{token}", token.len());
        let token_at = tag.len() - token.len();
        Self {
            tag,
            token_at,
            custom: true,
        }
    }

    /// The token.
    pub(crate) fn token(&self) -> &str {
        &self.tag[self.token_at..]
    }

    /// Whether the caller chose the token (see [`Options::token`](crate::Options::token)):
    /// then it may hold keys already, under other metadata. A random token holds nothing
    /// before its first obtain.
    pub(crate) fn is_custom(&self) -> bool {
        self.custom
    }

    /// The value to store: the tag followed by the metadata (the tag itself, without
    /// allocating, when there is no metadata).
    pub(crate) fn value(&self, metadata: &str) -> Cow<'_, str> {
        if metadata.is_empty() {
            return Cow::Borrowed(&self.tag);
        }
        let mut value = String::with_capacity(self.tag.len() + metadata.len());
        value.push_str(&self.tag);
        value.push_str(metadata);
        Cow::Owned(value)
    }

    /// True when `value` was stored by this owner (marked by a waiter or not).
    pub(crate) fn owns(&self, value: &[u8]) -> bool {
        unmarked(value).starts_with(self.tag.as_bytes())
    }
}

impl fmt::Debug for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Owner(<redacted>)")
    }
}

/// Splits a stored lock value into its token and metadata, or `None` when the value was
/// not written by this crate. A leading `!` (somebody waits for the lock) is skipped.
///
/// See the guide: [the wire format](crate::guide::wire_format).
///
/// Useful to see who holds a key:
///
/// ```
/// assert_eq!(lockset::parse_value("3:abcmeta"), Some(("abc", "meta")));
/// assert_eq!(lockset::parse_value("!3:abcmeta"), Some(("abc", "meta")));
/// assert_eq!(lockset::parse_value("not a lock"), None);
/// ```
pub fn parse_value(value: &str) -> Option<(&str, &str)> {
    let (token, metadata) = split_value(value.as_bytes())?;
    Some((
        std::str::from_utf8(token).ok()?,
        std::str::from_utf8(metadata).ok()?,
    ))
}

/// The one reading of the value format: a stored value's token and metadata, as bytes (see
/// [`parse_value`]); the scripts' `metadata_of` (`lua/owner.lua`) reads it the same way.
fn split_value(value: &[u8]) -> Option<(&[u8], &[u8])> {
    let value = unmarked(value);
    let colon = value.iter().position(|&b| b == b':')?;
    let (digits, rest) = (&value[..colon], &value[colon + 1..]);
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let len: usize = std::str::from_utf8(digits).ok()?.parse().ok()?;
    if len == 0 {
        return None;
    }
    rest.split_at_checked(len)
}

/// How much of a holder's metadata a refusal shows, in bytes: metadata may be up to
/// [`MAX_METADATA`](crate::MAX_METADATA), and a waiter may be refused often. The scripts
/// send no more (`HOLDER_SHOWN` in `lua/owner.lua`).
pub(crate) const HOLDER_SHOWN: usize = 256;

/// The metadata of another owner's stored `value` (never its token), when there is any:
/// what a refusal tells about who holds a key. Read as bytes, so that it agrees with the
/// scripts' `metadata_of` on every value, also one that is not UTF-8.
pub(crate) fn holder_metadata(value: &[u8]) -> Option<String> {
    let (_, metadata) = split_value(value)?;
    (!metadata.is_empty()).then(|| shown_metadata(metadata))
}

/// A holder's metadata as a refusal shows it: its first [`HOLDER_SHOWN`] bytes, made valid
/// UTF-8. A character the cut at [`HOLDER_SHOWN`] bytes split is left out (what is shown
/// is a prefix of the metadata); any other byte that is not UTF-8 is replaced.
pub(crate) fn shown_metadata(metadata: &[u8]) -> String {
    let metadata = match metadata.len() {
        len if len >= HOLDER_SHOWN => without_split_char(&metadata[..HOLDER_SHOWN]),
        _ => metadata,
    };
    String::from_utf8_lossy(metadata).into_owned()
}

/// `bytes` without a UTF-8 character that a cut at their end split (its first bytes).
fn without_split_char(bytes: &[u8]) -> &[u8] {
    // The last character's first byte: a continuation byte is 0b10xxxxxx, and a character
    // has at most three of them.
    let Some(first) = (bytes.len().saturating_sub(4)..bytes.len())
        .rev()
        .find(|&i| bytes[i] & 0xC0 != 0x80)
    else {
        return bytes;
    };
    let length = match bytes[first] {
        lead if lead >= 0xF0 => 4,
        lead if lead >= 0xE0 => 3,
        lead if lead >= 0xC0 => 2,
        _ => 1,
    };
    match bytes.len() - first < length {
        true => &bytes[..first],
        false => bytes,
    }
}

/// `value` without a waiter's mark.
fn unmarked(value: &[u8]) -> &[u8] {
    value.strip_prefix(&[WAITER_MARK]).unwrap_or(value)
}

#[cfg(test)]
mod tests {
    /// The scripts send no more of a holder's metadata than a refusal shows.
    #[test]
    fn the_scripts_cap_a_holders_metadata_as_a_refusal_shows_it() {
        let owner = include_str!("../../lua/owner.lua");
        let cap = format!("local HOLDER_SHOWN = {HOLDER_SHOWN}");
        assert!(owner.contains(&cap), "lua/owner.lua lacks `{cap}`");
    }

    use super::*;

    #[test]
    fn a_holders_metadata_never_includes_its_token() {
        let cases: [(&[u8], Option<&str>); 12] = [
            (b"3:abcmeta", Some("meta")),
            (b"!3:abcmeta", Some("meta")),
            (b"3:abc", None),
            (b"3:ab", None),
            (b"0:meta", None),
            (b":meta", None),
            (b"x3:abcmeta", None),
            (b"5:3:abc:meta", Some(":meta")),
            (b"99999999999999999999999:abc", None),
            (b"3:\xff\xfeam", Some("m")),
            (b"1:\xc3\xa9meta", Some("\u{fffd}meta")),
            (b"3:abc\xff", Some("\u{fffd}")),
        ];
        for (value, metadata) in cases {
            assert_eq!(holder_metadata(value).as_deref(), metadata, "{value:?}");
        }
        let long = format!("3:abc{}", "m".repeat(300));
        assert_eq!(holder_metadata(long.as_bytes()), Some("m".repeat(256)));
        // A character the cut splits is left out: what is shown is a prefix.
        let accented = format!("3:abcm{}", "é".repeat(200));
        let shown = holder_metadata(accented.as_bytes()).unwrap();
        assert_eq!(shown.len(), 255);
        assert!(accented.ends_with(&shown[shown.len() - 2..]) && !shown.contains('\u{fffd}'));
        // As the scripts send it: already cut at 256 bytes.
        let sent = &accented.as_bytes()[5..5 + 256];
        assert_eq!(shown_metadata(sent), shown);
    }

    #[test]
    fn random_tokens_are_22_url_safe_characters() {
        let owner = Owner::random();
        assert_eq!(owner.token().len(), RANDOM_TOKEN_LEN);
        assert_eq!(owner.value(""), format!("22:{}", owner.token()));
        assert!(
            owner
                .token()
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        );
        assert_ne!(owner.token(), Owner::random().token());
    }

    #[test]
    fn value_is_tag_then_metadata() {
        let owner = Owner::custom("abc").unwrap();
        assert_eq!(owner.value(""), "3:abc");
        assert_eq!(owner.value("meta"), "3:abcmeta");
        assert_eq!(parse_value(&owner.value("meta")), Some(("abc", "meta")));
    }

    #[test]
    fn a_token_prefix_never_owns_a_longer_token() {
        let holder = Owner::custom("abcdef").unwrap();
        let stored = holder.value("xyz");
        for prefix in ["a", "abc", "abcde"] {
            assert!(!Owner::custom(prefix).unwrap().owns(stored.as_bytes()));
        }
        // Nor can token + metadata pass for the token.
        assert!(!Owner::custom("abcdefxyz").unwrap().owns(stored.as_bytes()));
        assert!(holder.owns(stored.as_bytes()));
        // A waiter's mark changes nothing.
        assert!(holder.owns(format!("!{stored}").as_bytes()));
        assert!(
            !Owner::custom("abc")
                .unwrap()
                .owns(format!("!{stored}").as_bytes())
        );
    }

    #[test]
    fn empty_custom_token_is_rejected() {
        assert_eq!(Owner::custom(""), Err(InvalidInput::EmptyToken));
    }

    #[test]
    fn debug_never_shows_the_token() {
        let owner = Owner::custom("secret-token").unwrap();
        assert!(!format!("{owner:?}").contains("secret"));
    }

    #[test]
    fn parse_value_rejects_foreign_values() {
        for value in ["", ":x", "x:abc", "5:abc", "0:", "-1:a"] {
            assert_eq!(parse_value(value), None, "{value}");
        }
        assert_eq!(parse_value("2:ab"), Some(("ab", "")));
        assert_eq!(parse_value("2:é"), Some(("é", "")));
        assert_eq!(parse_value("1:é"), None);
    }
}
