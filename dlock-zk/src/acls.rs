//! The ACLs of the nodes dlock creates: open, or the URL's digest identity's alone.

use zookeeper_client::{Acls, CreateMode, CreateOptions};

/// The ACLs of the nodes dlock creates: open, or — when the URL carries digest
/// credentials — full rights for that identity only, so a root an operator secured
/// stays secured below the lock nodes dlock creates.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NodeAcls(Acls<'static>);

impl NodeAcls {
    pub(crate) fn new(authenticated: bool) -> Self {
        NodeAcls(if authenticated {
            Acls::creator_all()
        } else {
            Acls::anyone_all()
        })
    }

    pub(crate) fn contender(self) -> CreateOptions<'static> {
        CreateMode::EphemeralSequential.with_acls(self.0)
    }

    /// A contender placed at a sequence of dlock's choosing (a writer's read node,
    /// at its write node's sequence).
    pub(crate) fn placed(self) -> CreateOptions<'static> {
        CreateMode::Ephemeral.with_acls(self.0)
    }

    pub(crate) fn lock_node(self) -> CreateOptions<'static> {
        CreateMode::Container.with_acls(self.0)
    }

    pub(crate) fn root(self) -> CreateOptions<'static> {
        CreateMode::Persistent.with_acls(self.0)
    }
}
