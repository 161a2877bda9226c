//! Who may see and change what: `foldgate:admin` reaches every tenant,
//! `tenant:admin` only the token's own. Another tenant's resources answer
//! exactly as missing ones do (404), so a tenant admin learns nothing of
//! other tenants, not even whether they exist.

use axum::{
    extract::{FromRequestParts, Request, State},
    middleware::Next,
    response::{IntoResponse, Response},
};
use foldgate_auth::{
    AuthState, Authenticated, SCOPE_ADMIN, SCOPE_TENANT_ADMIN, auth_error_headers,
};
use foldgate_domain::{Principal, TenantId};
use http::request::Parts;

use crate::error::AdminError;

/// Authenticates an admin request as `/mcp` requests are (the same tokens
/// and keys), answering a refusal in the admin API's shape.
pub async fn authenticate(
    State(auth): State<AuthState>,
    mut request: Request,
    next: Next,
) -> Response {
    match auth.authenticate(request.headers_mut()).await {
        Ok(authenticated) => {
            request.extensions_mut().insert(authenticated);
            next.run(request).await
        }
        Err(error) => {
            let headers = auth_error_headers(&error, auth.resource_metadata_url());
            AdminError::Unauthenticated(Box::new((error, headers))).into_response()
        }
    }
}

/// The caller of an admin request, and its reach.
#[derive(Debug, Clone)]
pub struct Operator {
    pub principal: Principal,
    /// `true` with `foldgate:admin`: every tenant.
    deployment: bool,
}

impl Operator {
    /// The tenant named in a path, if the operator may reach it.
    pub fn tenant(&self, raw: &str) -> Result<TenantId, AdminError> {
        let tenant = TenantId::parse(raw).map_err(|_| AdminError::NotFound("tenant"))?;
        if self.deployment || tenant == self.principal.tenant {
            Ok(tenant)
        } else {
            Err(AdminError::NotFound("tenant"))
        }
    }

    /// The one tenant a tenant admin sees; `None` for a deployment admin.
    pub fn only_tenant(&self) -> Option<&TenantId> {
        (!self.deployment).then_some(&self.principal.tenant)
    }

    /// Whether the operator reaches the whole deployment.
    pub fn is_deployment_admin(&self) -> bool {
        self.deployment
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Operator {
    type Rejection = AdminError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, AdminError> {
        // Every admin route is behind `authenticate`.
        let authenticated = parts
            .extensions
            .get::<Authenticated>()
            .ok_or_else(|| AdminError::Internal("an admin route without authentication".into()))?;
        let deployment = authenticated.has_scope(SCOPE_ADMIN);
        if !deployment && !authenticated.has_scope(SCOPE_TENANT_ADMIN) {
            return Err(AdminError::Forbidden);
        }
        Ok(Self { principal: authenticated.principal.clone(), deployment })
    }
}
