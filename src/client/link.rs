//! The connection under a client: the caller's own (from [`Client::new`](crate::Client::new)),
//! or one a constructor made for its topology. One type for every topology, so that a
//! client's type does not say where its locks live (`Client` is `Client<ConnectionManager>`
//! whether it talks to one server, a Sentinel deployment, a Redlock quorum or a cluster).

use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use crate::topology::sentinel::SentinelConnection;

/// A client's connection: its own type `C`, or the one its topology needs.
#[derive(Clone)]
pub(crate) enum Link<C> {
    /// The caller's connection, or the connection manager of `Client::connect`.
    Own(C),
    /// A connection that follows the primary of a Sentinel deployment.
    Sentinel(SentinelConnection),
    /// A Redis Cluster connection.
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl<C: ConnectionLike> ConnectionLike for Link<C> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Own(conn) => conn.req_packed_command(cmd),
            Self::Sentinel(conn) => conn.req_packed_command(cmd),
            #[cfg(feature = "cluster")]
            Self::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Own(conn) => conn.req_packed_commands(cmd, offset, count),
            Self::Sentinel(conn) => conn.req_packed_commands(cmd, offset, count),
            #[cfg(feature = "cluster")]
            Self::Cluster(conn) => conn.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Own(conn) => conn.get_db(),
            Self::Sentinel(conn) => conn.get_db(),
            #[cfg(feature = "cluster")]
            Self::Cluster(conn) => conn.get_db(),
        }
    }
}
