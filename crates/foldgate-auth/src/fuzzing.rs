//! JWKS documents as the key cache reads them, for the fuzz targets in
//! `fuzz/`: compiled only with `--cfg fuzzing`, which `cargo fuzz` sets.

use jsonwebtoken::Algorithm;

/// Each key of the document that can verify signatures, by its position
/// among the document's `keys`: its `kid` and the algorithms it may verify.
pub fn key_set(body: &[u8]) -> Result<Vec<(Option<String>, Vec<Algorithm>)>, String> {
    super::jwks::key_summaries(body).map_err(|e| e.to_string())
}
