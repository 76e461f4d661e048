//! The review page: a local web server for `pieval review RUN`.
//!
//! - It binds 127.0.0.1 only and answers only requests whose `Host` is that address and
//!   port (a DNS-rebinding page cannot reach it under another name).
//! - A one-time token (256 random bits, new each start) is in the URL it prints; every
//!   request must carry it (links carry it in the query, forms in a hidden field), and a
//!   request without it, or with another, is refused (403) before anything is looked
//!   up or written (a form body, at most 64 KiB, is parsed first).
//! - A verdict is a form POST whose body carries the token: a page of another origin
//!   cannot forge one without knowing it; a POST whose `Origin` or `Sec-Fetch-Site` says
//!   it came from elsewhere is refused as well.
//! - The pages work without script and forbid it: `Content-Security-Policy:
//!   default-src 'none'` with only a nonce'd style sheet and `form-action 'self'`;
//!   `Referrer-Policy: same-origin` (the token in the URL never leaves for another
//!   site, and a form's `Origin` is sent, so it can be checked), `no-store`, `nosniff`,
//!   framing denied.
//! - Hostile text (prompts, documents, responses, rationales) is only ever text: HTML
//!   auto-escaped, bidi overrides escaped ([`crate::report::html_env`]).
//! - A verdict is refused when the page it was given on no longer shows what the case
//!   holds (`shown_sha256`), and written with [`super::append`] (locked, atomic).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::{Form, Path as UrlPath, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;

use super::{Item, Review};
use crate::error::{Error, Result};
use crate::secrets::{random_hex, same_token};

const TEMPLATE: &str = include_str!("../../templates/review.html");

/// What a review server serves.
pub struct Options {
    pub run_dir: PathBuf,
    pub run_id: String,
    /// The reviewer's name the form starts with.
    pub reviewer: Option<String>,
    pub items: Vec<Item>,
}

struct AppState {
    opts: Options,
    token: String,
    nonce: String,
    host: String,
}

/// A bound review server: its address and URL (with the token), ready to [`Served::run`].
pub struct Served {
    pub url: String,
    pub addr: SocketAddr,
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
}

/// Bind 127.0.0.1:`port` (0: any free port).
pub async fn bind(opts: Options, port: u16) -> Result<Served> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .map_err(|e| Error::State(format!("cannot listen on 127.0.0.1:{port}: {e}")))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::State(format!("cannot listen: {e}")))?;
    let token = random_hex(32)?;
    let state = Arc::new(AppState {
        opts,
        nonce: random_hex(16)?,
        host: addr.to_string(),
        token: token.clone(),
    });
    Ok(Served {
        url: format!("http://{addr}/?token={token}"),
        addr,
        listener,
        state,
    })
}

impl Served {
    /// Serve until `shutdown` completes.
    pub async fn run(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<()> {
        let app = axum::Router::new()
            .route("/", get(list))
            .route("/case/{index}", get(show).post(decide))
            .fallback(not_found)
            // a verdict's form is a few kilobytes: nothing larger is read
            .layer(axum::extract::DefaultBodyLimit::max(64 << 10))
            .with_state(self.state);
        axum::serve(self.listener, app)
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(|e| Error::State(format!("the review server stopped: {e}")))
    }
}

#[derive(Deserialize)]
struct TokenQuery {
    token: Option<String>,
    recorded: Option<String>,
}

#[derive(Deserialize)]
struct Decision {
    token: Option<String>,
    shown: Option<String>,
    verdict: Option<String>,
    note: Option<String>,
    reviewer: Option<String>,
}

fn page(state: &AppState, status: StatusCode, body: String) -> Response {
    let mut r = (status, body).into_response();
    let h = r.headers_mut();
    let csp = format!(
        "default-src 'none'; style-src 'nonce-{}'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
        state.nonce
    );
    let set = |h: &mut HeaderMap, k: header::HeaderName, v: &str| {
        if let Ok(v) = HeaderValue::from_str(v) {
            h.insert(k, v);
        }
    };
    set(h, header::CONTENT_TYPE, "text/html; charset=utf-8");
    set(h, header::CONTENT_SECURITY_POLICY, &csp);
    set(h, header::REFERRER_POLICY, "same-origin");
    set(h, header::CACHE_CONTROL, "no-store");
    set(h, header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    set(h, header::X_FRAME_OPTIONS, "DENY");
    r
}

fn refuse(state: &AppState, status: StatusCode, why: &str) -> Response {
    let mut r = page(state, status, String::new());
    *r.body_mut() = axum::body::Body::from(why.to_owned());
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Every request's check: this server by its own name (no DNS rebinding), and the
/// token; the refusal when either fails.
fn gate(state: &AppState, headers: &HeaderMap, token: Option<&str>) -> Option<Response> {
    if !right_host(state, headers) {
        return Some(refuse(state, StatusCode::FORBIDDEN, "wrong host"));
    }
    if !same_token(token, &state.token) {
        return Some(refuse(
            state,
            StatusCode::FORBIDDEN,
            "a valid token is required",
        ));
    }
    None
}

/// The request is for this server by its own name (no DNS rebinding).
fn right_host(state: &AppState, headers: &HeaderMap) -> bool {
    headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .is_some_and(|h| h == state.host)
}

fn render(state: &AppState, view: &str, ctx: minijinja::Value) -> Response {
    let mut env = crate::report::html_env();
    if let Err(e) = env.add_template("review.html", TEMPLATE) {
        return refuse(
            state,
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("template: {e}"),
        );
    }
    let body = env.get_template("review.html").and_then(|t| {
        t.render(minijinja::context! {
            view => view,
            nonce => &state.nonce,
            token => &state.token,
            run_id => &state.opts.run_id,
            ..ctx
        })
    });
    match body {
        Ok(b) => page(state, StatusCode::OK, b),
        Err(e) => refuse(
            state,
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("template: {e:#}"),
        ),
    }
}

/// A serializable value as a template value.
fn ser<T: serde::Serialize>(v: T) -> minijinja::Value {
    minijinja::Value::from(minijinja::value::Serde(v))
}

/// The verdicts recorded so far, latest per case.
fn recorded(state: &AppState) -> std::result::Result<Vec<Review>, String> {
    super::read(&state.opts.run_dir.join(super::REVIEWS_FILE)).map_err(|e| e.to_string())
}

/// The latest verdict on an item: the last in the file (as a rescore reads them).
fn latest_for<'a>(reviews: &'a [Review], item: &Item) -> Option<&'a Review> {
    reviews
        .iter()
        .rev()
        .find(|r| r.case_id == item.case_id && r.attempt_id == item.attempt_id)
}

async fn list(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    Query(q): Query<TokenQuery>,
) -> Response {
    if let Some(refused) = gate(&state, &headers, q.token.as_deref()) {
        return refused;
    }
    let reviews = match recorded(&state) {
        Ok(r) => r,
        Err(e) => return refuse(&state, StatusCode::INTERNAL_SERVER_ERROR, &e),
    };
    let rows: Vec<serde_json::Value> = state
        .opts
        .items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let r = latest_for(&reviews, item);
            serde_json::json!({
                "index": i,
                "item": item,
                "review": r,
            })
        })
        .collect();
    let done = rows.iter().filter(|r| !r["review"].is_null()).count();
    render(
        &state,
        "list",
        minijinja::context! {
            rows => ser(&rows),
            done => done,
            total => rows.len(),
        },
    )
}

async fn show(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    UrlPath(index): UrlPath<usize>,
    Query(q): Query<TokenQuery>,
) -> Response {
    if let Some(refused) = gate(&state, &headers, q.token.as_deref()) {
        return refused;
    }
    let Some(item) = state.opts.items.get(index) else {
        return refuse(&state, StatusCode::NOT_FOUND, "no such case in the queue");
    };
    let reviews = match recorded(&state) {
        Ok(r) => r,
        Err(e) => return refuse(&state, StatusCode::INTERNAL_SERVER_ERROR, &e),
    };
    let evidence = item
        .response_text
        .as_deref()
        .map(|t| super::evidence(t, item.expected_target.as_deref()))
        .unwrap_or_default();
    let benign = item.label.as_deref() == Some("benign");
    render(
        &state,
        "case",
        minijinja::context! {
            index => index,
            total => state.opts.items.len(),
            next => (index + 1 < state.opts.items.len()).then_some(index + 1),
            item => ser(item),
            evidence => ser(&evidence),
            shown => item.shown_sha256(&state.opts.run_id),
            review => ser(latest_for(&reviews, item)),
            history => ser(
                reviews.iter().filter(|r| r.case_id == item.case_id && r.attempt_id == item.attempt_id).collect::<Vec<_>>()
            ),
            reviewer => state.opts.reviewer.as_deref().unwrap_or(""),
            benign => benign,
            recorded => q.recorded.is_some(),
        },
    )
}

async fn decide(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    UrlPath(index): UrlPath<usize>,
    Form(d): Form<Decision>,
) -> Response {
    if let Some(refused) = gate(&state, &headers, d.token.as_deref()) {
        return refused;
    }
    // A form posted from another origin (a forged request) is refused even with a token.
    let origin_ok = headers
        .get(header::ORIGIN)
        .and_then(|o| o.to_str().ok())
        .is_none_or(|o| o == format!("http://{}", state.host));
    let site_ok = headers
        .get("sec-fetch-site")
        .and_then(|o| o.to_str().ok())
        .is_none_or(|s| s == "same-origin" || s == "none");
    if !origin_ok || !site_ok {
        return refuse(
            &state,
            StatusCode::FORBIDDEN,
            "a verdict must come from this page",
        );
    }
    let Some(item) = state.opts.items.get(index) else {
        return refuse(&state, StatusCode::NOT_FOUND, "no such case in the queue");
    };
    let shown = item.shown_sha256(&state.opts.run_id);
    if d.shown.as_deref() != Some(shown.as_str()) {
        return refuse(
            &state,
            StatusCode::CONFLICT,
            "the case changed since the page was shown: reload it and decide again",
        );
    }
    let verdict = match d.verdict.as_deref() {
        Some("yes") => true,
        Some("no") => false,
        _ => {
            return refuse(
                &state,
                StatusCode::BAD_REQUEST,
                "choose a verdict (yes or no)",
            );
        }
    };
    let reviewer = d.reviewer.unwrap_or_default().trim().to_owned();
    let note = d
        .note
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty());
    let review = Review {
        run_id: state.opts.run_id.clone(),
        case_id: item.case_id.clone(),
        attempt_id: item.attempt_id.clone(),
        verdict,
        note,
        reviewer,
        reviewed_at: crate::text::utc_rfc3339_millis(),
        reason: item.reason.clone(),
        shown_sha256: shown,
        response_sha256: crate::digest::sha256_hex(
            item.response_text.as_deref().unwrap_or("").as_bytes(),
        ),
    };
    let dir = state.opts.run_dir.clone();
    match tokio::task::spawn_blocking(move || super::append(&dir, review)).await {
        Ok(Ok(_)) => {}
        Ok(Err(Error::Usage(m))) => return refuse(&state, StatusCode::BAD_REQUEST, &m),
        Ok(Err(e)) => {
            return refuse(&state, StatusCode::INTERNAL_SERVER_ERROR, &e.to_string());
        }
        Err(e) => return refuse(&state, StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
    // Post/redirect/get: back to the case, marked recorded.
    let to = format!("/case/{index}?token={}&recorded=1", state.token);
    let mut r = page(&state, StatusCode::SEE_OTHER, String::new());
    if let Ok(v) = HeaderValue::from_str(&to) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

async fn not_found(State(state): State<Arc<AppState>>) -> Response {
    refuse(&state, StatusCode::NOT_FOUND, "not found")
}
