//! Who asks: a tenant, and the scopes its token grants.

use crate::TenantId;

/// A caller as authorisation sees it: an agent's verified token, or the
/// grant a gateway-run branch was started with.
pub trait Caller {
    fn tenant(&self) -> &TenantId;
    fn has_scope(&self, scope: &str) -> bool;
}
