//! Clean-up after an obtain that was cancelled or got no reply: release its keys by its token
//! in the background, and leave the waiter queues it joined.

use super::*;

/// The first pause before a clean-up that could not reach Redis is tried again.
pub(super) const CLEAN_UP_PAUSE: Duration = Duration::from_millis(50);
/// The longest pause between tries of a clean-up.
pub(super) const CLEAN_UP_PAUSE_AT_MOST: Duration = Duration::from_secs(1);

/// Releases by token in the background when an attempt is dropped mid-flight, or ends
/// without an intact reply (random tokens only).
pub(super) struct CleanupOnDrop<'a, 'b, C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    pub(super) attempt: Option<(&'a Client<C>, &'a Claim<'b>)>,
}

impl<C> Drop for CleanupOnDrop<'_, '_, C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn drop(&mut self) {
        if let Some((client, claim)) = self.attempt {
            clean_up_later(client, claim.to_shared());
        }
    }
}

/// Leaves the queues of a fair obtain that ends without the lock (see [`Fair::to_leave`]).
pub(super) struct LeaveOnDrop<'a, C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    pub(super) client: &'a Client<C>,
    pub(super) fair: Option<&'a Fair>,
}

impl<C> Drop for LeaveOnDrop<'_, C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn drop(&mut self) {
        if let Some(claim) = self.fair.and_then(Fair::to_leave) {
            clean_up_later(self.client, claim);
        }
    }
}

/// Releases `claim` by token in the background, leaving its queues too: sent on the same
/// connection after the obtain's last attempt, so it runs after it.
///
/// A clean-up that cannot reach the server (a failover under way, a restart) is tried
/// again, with growing pauses, until what it removes would have expired anyway: the keys'
/// TTL, and a fair waiter's lease. Its queue entry would otherwise stay behind, and a
/// release hand the lock to a waiter that started over under another token, which nobody
/// then holds or releases until it expires.
pub(super) fn clean_up_later<C>(client: &Client<C>, claim: Arc<OwnedClaim>)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let client = client.clone();
    let tasks = client.tasks().clone();
    let spawned = tasks.spawn(async move {
        let claim = claim.claim();
        let lease = claim.ticket.map_or(Duration::ZERO, |ticket| ticket.lease.duration);
        let expired = Instant::now() + claim.ttl.duration.max(lease);
        let mut pause = CLEAN_UP_PAUSE;
        loop {
            match client.backend().clean_up(&claim).await {
                Err(err) if err.is_unavailable() && Instant::now() + pause < expired => {
                    tracing::debug!(%err, "clean-up could not reach Redis; trying again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(CLEAN_UP_PAUSE_AT_MOST);
                }
                Err(err) => {
                    tracing::warn!(%err, "clean-up after an obtain that was cancelled or got no reply failed; the keys expire with their TTL");
                    return;
                }
                Ok(()) => return,
            }
        }
    });
    if spawned.is_none() {
        tracing::warn!("obtain cancelled outside a tokio runtime: its keys expire with their TTL");
    }
}
