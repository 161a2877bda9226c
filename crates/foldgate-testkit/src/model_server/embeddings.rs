//! OpenAI's Embeddings API (`POST {base}embeddings`), answered with
//! deterministic vectors from a feature-hashing embedder, so that tests of
//! ranking by embeddings measure something: texts that share words or
//! parts of words (character trigrams, which catch "deadlock" and
//! "deadlocked") get similar vectors, others nearly orthogonal ones.

use super::*;

/// The dimension of the vectors, unless a test sets another.
pub const HASHING_DIMS: usize = 512;

/// How the embeddings endpoint behaves: what a test scripts.
#[derive(Debug, Clone)]
pub(super) struct EmbeddingsScript {
    pub dims: usize,
    /// Every request waits this long before its answer.
    pub delay: Option<Duration>,
    /// Every request fails with this status (and the provider's error body).
    pub status: Option<u16>,
}

impl Default for EmbeddingsScript {
    fn default() -> Self {
        Self { dims: HASHING_DIMS, delay: None, status: None }
    }
}

/// A text's vector by feature hashing: each lower-cased word (runs of
/// letters and digits) but the commonest function words ([`STOP_WORDS`]),
/// and each character trigram of the word with its
/// boundaries marked (`#dead`, `dea`, …, `ck#`) adds ±1 (by the hash's
/// sign bit) to the dimension its FNV-1a hash picks; the result has unit
/// length (all zeros for a text without words).
pub fn hashing_embedding(text: &str, dims: usize) -> Vec<f32> {
    let mut vector = vec![0.0_f32; dims.max(1)];
    let mut add = |feature: &[u8], weight: f32| {
        let hash = fnv1a(feature);
        #[expect(clippy::cast_possible_truncation, reason = "reduced modulo the dimension")]
        let at = (hash % vector.len() as u64) as usize;
        let sign = if hash >> 63 == 0 { 1.0 } else { -1.0 };
        vector[at] += sign * weight;
    };
    for word in text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()) {
        let word = word.to_lowercase();
        if STOP_WORDS.contains(&word.as_str()) {
            continue;
        }
        add(format!("w:{word}").as_bytes(), 1.0);
        let marked: Vec<char> = format!("#{word}#").chars().collect();
        for gram in marked.windows(3) {
            let gram: String = gram.iter().collect();
            add(format!("g:{gram}").as_bytes(), 0.5);
        }
    }
    let norm = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        vector.iter_mut().for_each(|x| *x /= norm);
    }
    vector
}

/// Words that say nothing about what a text is about.
const STOP_WORDS: &[&str] = &[
    "a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "has", "in", "is", "it", "its",
    "of", "on", "or", "that", "the", "this", "to", "was", "were", "will", "with",
];

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| {
        (hash ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl ModelServer {
    /// Sets the dimension of the vectors the embeddings endpoint answers.
    pub fn embeddings_dims(&self, dims: usize) {
        lock(&self.script).embeddings.dims = dims.max(1);
    }

    /// Makes every embeddings request wait `wait` (`None`: answer at once).
    pub fn embeddings_delay(&self, wait: Option<Duration>) {
        lock(&self.script).embeddings.delay = wait;
    }

    /// Makes every embeddings request fail with `status` (`None`: answer).
    pub fn embeddings_fail(&self, status: Option<u16>) {
        lock(&self.script).embeddings.status = status;
    }

    /// Every embeddings request received, in order.
    pub fn embedding_requests(&self) -> Vec<RecordedRequest> {
        lock(&self.script).embedding_requests.clone()
    }
}

pub(super) async fn embeddings(
    State(script): State<Shared>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let body = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    let request = RecordedRequest { provider: Provider::OpenAi, headers, body, stream: false };
    let (behaviour, number) = {
        let mut script = lock(&script);
        script.embedding_requests.push(request.clone());
        script.answered += 1;
        (script.embeddings.clone(), script.answered)
    };
    if let Some(wait) = behaviour.delay {
        tokio::time::sleep(wait).await;
    }
    let error = |status: u16, message: &str| {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = Provider::OpenAi.error_body(status.as_u16(), message);
        plain_response(status, "application/json", body)
    };
    let mut response = match (behaviour.status, embedding_answer(&request, behaviour.dims)) {
        (Some(status), _) => error(status, "the embeddings request failed as scripted"),
        (None, Err(why)) => error(400, &why),
        (None, Ok(answer)) => json_response(&answer),
    };
    response.headers_mut().insert(
        Provider::OpenAi.request_id_header(),
        HeaderValue::from_str(&format!("req_{number}")).expect("ascii request id"),
    );
    response
}

/// The answer to a well-formed request: `input` is a string or an array of
/// strings; `encoding_format`, when given, is `float`.
fn embedding_answer(request: &RecordedRequest, dims: usize) -> Result<Value, String> {
    let body = &request.body;
    let model = request.model().ok_or("you must provide a model parameter")?;
    let inputs: Vec<&str> = match body.get("input") {
        Some(Value::String(one)) => vec![one.as_str()],
        Some(Value::Array(many)) if !many.is_empty() => many
            .iter()
            .map(|v| v.as_str().ok_or("'input' must be a string or an array of strings"))
            .collect::<Result<_, _>>()?,
        _ => return Err("'input' must be a non-empty string or array of strings".into()),
    };
    match body.get("encoding_format").and_then(Value::as_str) {
        None | Some("float") => {}
        Some(other) => return Err(format!("this server only answers float, not {other:?}")),
    }
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(index, text)| {
            json!({"object": "embedding", "index": index, "embedding": hashing_embedding(text, dims)})
        })
        .collect();
    // About a token per word, as the real API counts its own tokens.
    let tokens: usize = inputs.iter().map(|t| t.split_whitespace().count().max(1)).sum();
    Ok(json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cosine(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    #[test]
    fn hashing_vectors_are_unit_length_deterministic_and_similar_for_shared_words() {
        let a = hashing_embedding("Deadlock in the connection pool", HASHING_DIMS);
        assert_eq!(a.len(), HASHING_DIMS);
        assert!((cosine(&a, &a) - 1.0).abs() < 1e-5);
        assert_eq!(a, hashing_embedding("deadlock IN the connection-pool!", HASHING_DIMS));
        let near = hashing_embedding("Pools of connections deadlocked", HASHING_DIMS);
        let far = hashing_embedding("Render the invoice as a PDF", HASHING_DIMS);
        assert!(
            cosine(&a, &near) > cosine(&a, &far) + 0.2,
            "{} {}",
            cosine(&a, &near),
            cosine(&a, &far)
        );
        assert!(hashing_embedding("", 8).iter().all(|x| *x == 0.0));
    }

    #[test]
    fn answers_speak_openais_format() {
        let request = |body: Value| RecordedRequest {
            provider: Provider::OpenAi,
            headers: HeaderMap::new(),
            body,
            stream: false,
        };
        let answer =
            embedding_answer(&request(json!({"model": "e", "input": ["a b", "c"]})), 4).unwrap();
        assert_eq!(answer["object"], "list");
        assert_eq!(answer["model"], "e");
        assert_eq!(answer["data"][1]["object"], "embedding");
        assert_eq!(answer["data"][1]["index"], 1);
        assert_eq!(answer["data"][1]["embedding"].as_array().unwrap().len(), 4);
        assert_eq!(answer["usage"], json!({"prompt_tokens": 3, "total_tokens": 3}));
        let one = embedding_answer(&request(json!({"model": "e", "input": "a"})), 4).unwrap();
        assert_eq!(one["data"].as_array().unwrap().len(), 1);
        for bad in [
            json!({"input": "a"}),
            json!({"model": "e", "input": []}),
            json!({"model": "e", "input": [1, 2]}),
            json!({"model": "e", "input": "a", "encoding_format": "base64"}),
        ] {
            assert!(embedding_answer(&request(bad.clone()), 4).is_err(), "{bad}");
        }
    }
}
