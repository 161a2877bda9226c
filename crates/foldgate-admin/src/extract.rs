//! Reading a request's path, query and body into types, each failure a
//! 400 in the admin API's shape that says what is wrong.

use axum::{
    Json,
    extract::{FromRequest, FromRequestParts, Path, Query, Request},
};
use foldgate_domain::duration::{self, Renamed};
use http::request::Parts;
use serde::de::DeserializeOwned;

use crate::error::AdminError;

/// A path's values, or a 400 that says which is wrong.
#[derive(Debug)]
pub struct Params<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Params<T> {
    type Rejection = AdminError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, AdminError> {
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(value)| Self(value))
            .map_err(|e| AdminError::BadRequest(e.body_text()))
    }
}

/// A query string's values, or a 400 that says which is wrong.
#[derive(Debug)]
pub struct QueryOf<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for QueryOf<T> {
    type Rejection = AdminError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, AdminError> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(value)| Self(value))
            .map_err(|e| AdminError::BadRequest(e.body_text()))
    }
}

/// A JSON body, or a 400 that says what is wrong with it.
#[derive(Debug)]
pub struct BodyOf<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequest<S> for BodyOf<T> {
    type Rejection = AdminError;

    async fn from_request(req: Request, state: &S) -> Result<Self, AdminError> {
        Json::<T>::from_request(req, state)
            .await
            .map(|Json(value)| Self(value))
            .map_err(|e| AdminError::BadRequest(e.body_text()))
    }
}

/// The former names of a declaration's settings (`timeout_seconds` for
/// `timeout`), which its JSON may still use.
pub trait FormerNames {
    const RENAMED: &'static [Renamed];
}

/// A declaration's JSON body (`POST /upstreams`, `POST /models`): as
/// [`BodyOf`], and a setting given under both its name and its former name
/// is a 400 naming both.
#[derive(Debug)]
pub struct DeclarationOf<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send + FormerNames> FromRequest<S> for DeclarationOf<T> {
    type Rejection = AdminError;

    async fn from_request(req: Request, state: &S) -> Result<Self, AdminError> {
        let Json(body) = Json::<serde_json::Value>::from_request(req, state)
            .await
            .map_err(|e| AdminError::BadRequest(e.body_text()))?;
        if let Some(fields) = body.as_object() {
            duration::both_names(T::RENAMED, "", |name| fields.contains_key(name))
                .map_err(AdminError::BadRequest)?;
        }
        serde_path_to_error::deserialize(body).map(Self).map_err(|e| {
            let path = e.path().to_string();
            AdminError::BadRequest(match path.as_str() {
                "." => e.into_inner().to_string(),
                _ => format!("{path}: {}", e.into_inner()),
            })
        })
    }
}
