//! Reading a request's path, query and body into types, each failure a
//! 400 in the admin API's shape that says what is wrong.

use axum::{
    Json,
    extract::{FromRequest, FromRequestParts, Path, Query, Request},
};
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
