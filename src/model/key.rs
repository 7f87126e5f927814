//! The forms in which callers pass lock keys.

use std::borrow::Cow;

use crate::model::mode::Mode;

/// A lock key: anything string-like, so that [`Client::obtain_multi`](crate::Client::obtain_multi)
/// takes the keys callers have, without conversions.
///
/// ```no_run
/// # async fn demo(client: lockset::Client) -> Result<(), lockset::Error> {
/// use std::time::Duration;
/// use lockset::Options;
///
/// let (ttl, o) = (Duration::from_secs(10), Options::default());
/// let owned: Vec<String> = vec!["{u1}:cart".into(), "{u1}:wallet".into()];
/// client.obtain_multi(["a", "b"], ttl, &o).await?;          // an array of &str
/// client.obtain_multi(&["c", "d"], ttl, &o).await?;         // a reference to one
/// client.obtain_multi(&owned, ttl, &o).await?;              // &Vec<String>
/// client.obtain_multi(owned.as_slice(), ttl, &o).await?;    // &[String]
/// client.obtain_multi(owned.iter().map(String::as_str), ttl, &o).await?; // any iterator
/// client.obtain_multi(owned, ttl, &o).await?;               // Vec<String>, moved
/// # Ok(())
/// # }
/// ```
///
/// A key paired with a [`Mode`], `(key, mode)`, asks for the key in that mode; a key alone
/// is [`Mode::Exclusive`].
pub trait IntoKey {
    /// The key as an owned string (moved, not copied, when it already is one).
    fn into_key(self) -> String;

    /// The key and the mode it is asked for in: exclusive unless paired with a mode.
    fn into_key_and_mode(self) -> (String, Mode)
    where
        Self: Sized,
    {
        (self.into_key(), Mode::Exclusive)
    }
}

impl<K: IntoKey> IntoKey for (K, Mode) {
    fn into_key(self) -> String {
        self.0.into_key()
    }

    fn into_key_and_mode(self) -> (String, Mode) {
        (self.0.into_key(), self.1)
    }
}

impl<K: IntoKey + Clone> IntoKey for &(K, Mode) {
    fn into_key(self) -> String {
        self.0.clone().into_key()
    }

    fn into_key_and_mode(self) -> (String, Mode) {
        (self.0.clone().into_key(), self.1)
    }
}

impl IntoKey for String {
    fn into_key(self) -> String {
        self
    }
}

impl IntoKey for &String {
    fn into_key(self) -> String {
        self.clone()
    }
}

impl IntoKey for &str {
    fn into_key(self) -> String {
        self.to_owned()
    }
}

impl IntoKey for &&str {
    fn into_key(self) -> String {
        (*self).to_owned()
    }
}

impl IntoKey for Box<str> {
    fn into_key(self) -> String {
        self.into_string()
    }
}

impl IntoKey for Cow<'_, str> {
    fn into_key(self) -> String {
        self.into_owned()
    }
}

impl IntoKey for &Cow<'_, str> {
    fn into_key(self) -> String {
        self.as_ref().to_owned()
    }
}
