//! What every HTTP target shares: the requests-per-minute pacing, the retry loop
//! (full-jitter exponential backoff, `Retry-After` honoured up to 5 minutes), a response
//! read under [`super::MAX_BODY_BYTES`], and the client that never follows a redirect.

use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use super::CallError;
use crate::error::{Error, Result};

const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Why one try failed: the message, whether to try again, and the server's
/// `Retry-After`.
pub(crate) type TryError = (String, bool, Option<Duration>);

/// The requests-per-minute limit: the earliest instant the next request may start.
pub(crate) struct Pacing(Option<(Duration, Mutex<Instant>)>);

impl Pacing {
    pub(crate) fn new(requests_per_minute: Option<u32>) -> Self {
        Self(requests_per_minute.map(|rpm| {
            (
                Duration::from_secs_f64(60.0 / f64::from(rpm)),
                Mutex::new(Instant::now()),
            )
        }))
    }

    /// Wait for this request's slot.
    pub(crate) async fn pace(&self) {
        if let Some((interval, next)) = &self.0 {
            let slot = {
                let mut next = next.lock().await;
                let now = Instant::now();
                let slot = (*next).max(now);
                *next = slot + *interval;
                slot
            };
            tokio::time::sleep_until(slot.into()).await;
        }
    }
}

/// An HTTP client for a target: timeouts, a pool as large as the concurrency, and no
/// redirect followed (a credential goes only to the configured origin, on every hop; a
/// 3xx is the case's error).
pub(crate) fn client(timeout_s: f64, concurrency: usize) -> Result<reqwest::Client> {
    reqwest::Client::builder()
        .timeout(Duration::from_secs_f64(timeout_s))
        .connect_timeout(Duration::from_secs_f64(timeout_s.min(10.0)))
        .pool_max_idle_per_host(concurrency)
        .user_agent(concat!("pieval/", env!("CARGO_PKG_VERSION")))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| Error::Internal(format!("cannot build the HTTP client: {e}")))
}

/// Run `once` until it succeeds, fails for good, or `max_retries` retries are spent;
/// the answer, the latency in ms and the tries made. Messages are redacted.
pub(crate) async fn with_retries<T, F, Fut>(
    max_retries: u32,
    pacing: &Pacing,
    mut once: F,
) -> std::result::Result<(T, f64, u32), CallError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::result::Result<T, TryError>>,
{
    let start = Instant::now();
    let mut attempts = 0;
    loop {
        pacing.pace().await;
        attempts += 1;
        match once().await {
            Ok(answer) => return Ok((answer, start.elapsed().as_secs_f64() * 1e3, attempts)),
            Err((message, retryable, retry_after)) => {
                if !retryable || attempts > max_retries {
                    let tried = if attempts > 1 {
                        format!(" (after {attempts} attempts)")
                    } else {
                        String::new()
                    };
                    return Err(CallError {
                        message: crate::secrets::redact(&format!("{message}{tried}"))
                            .0
                            .into_owned(),
                        latency_ms: start.elapsed().as_secs_f64() * 1e3,
                        attempts,
                    });
                }
                let wait = retry_after.unwrap_or_else(|| backoff(attempts - 1));
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// Full-jitter exponential backoff for retry `n` (from 0).
pub(crate) fn backoff(n: u32) -> Duration {
    let cap = Duration::from_millis(500)
        .saturating_mul(1u32 << n.min(16))
        .min(MAX_BACKOFF);
    cap.mul_f64(fastrand::f64())
}

/// What an answer's head said.
pub(crate) struct Head {
    pub status: reqwest::StatusCode,
    pub headers: reqwest::header::HeaderMap,
    pub retry_after: Option<Duration>,
}

/// Send a built request; a failure to connect or a timeout is retryable.
pub(crate) async fn send(
    req: reqwest::RequestBuilder,
) -> std::result::Result<reqwest::Response, TryError> {
    req.send().await.map_err(|e| {
        let what = if e.is_timeout() {
            "timed out".to_owned()
        } else if e.is_connect() {
            format!("connection failed: {}", crate::text::error_chain(&e))
        } else {
            format!("request failed: {}", crate::text::error_chain(&e))
        };
        (what, true, None)
    })
}

/// The head of a response.
pub(crate) fn head(resp: &reqwest::Response) -> Head {
    Head {
        status: resp.status(),
        headers: resp.headers().clone(),
        retry_after: resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(super::openai::parse_retry_after),
    }
}

/// Read a body, at most [`super::MAX_BODY_BYTES`]; `each` sees every chunk as it comes
/// (a streamed answer is assembled from them).
pub(crate) async fn read_body(
    mut resp: reqwest::Response,
    retry_after: Option<Duration>,
) -> std::result::Result<Vec<u8>, TryError> {
    let mut body: Vec<u8> = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > super::MAX_BODY_BYTES {
                    return Err((
                        format!(
                            "the response body exceeds {} MiB; it was not read",
                            super::MAX_BODY_BYTES >> 20
                        ),
                        false,
                        None,
                    ));
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(body),
            Err(e) => {
                let what = if e.is_timeout() {
                    "timed out reading the response".to_owned()
                } else {
                    format!(
                        "the response body could not be read: {}",
                        crate::text::error_chain(&e)
                    )
                };
                return Err((what, true, retry_after));
            }
        }
    }
}

/// A redirect, said as the case's error (never followed).
pub(crate) fn redirect_error(head: &Head, configured: &str) -> TryError {
    let to = head
        .headers
        .get(reqwest::header::LOCATION)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .map_or_else(
            || "no Location".to_owned(),
            |l| {
                format!(
                    "to {}",
                    crate::text::excerpt(&crate::secrets::redact(&l).0, 200)
                )
            },
        );
    (
        format!(
            "HTTP {} redirect {to}: pieval does not follow redirects (credentials are sent only to the configured {configured}); set it to the address that answers",
            head.status.as_u16()
        ),
        false,
        None,
    )
}

/// `req` with what the attempt in scope tells its target: the W3C `traceparent` its
/// spans are to carry, and its world's address when one is served to it (`model.world`:
/// the `X-Pieval-World-*` headers an agent behind a chat endpoint reads).
pub fn with_attempt(mut req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
    let (traceparent, world) = super::ATTEMPT
        .try_with(|s| (s.traceparent.clone(), s.state().world.clone()))
        .unwrap_or_default();
    if let Some(t) = traceparent {
        req = req.header("traceparent", t);
    }
    if let Some(w) = world {
        req = req
            .header(super::WorldField::McpUrl.header(), w.mcp_url)
            .header(super::WorldField::HttpUrl.header(), w.http_url)
            .header(super::WorldField::Token.header(), w.token);
    }
    req
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_bounded() {
        for n in 0..40 {
            assert!(backoff(n) <= MAX_BACKOFF);
        }
    }
}
