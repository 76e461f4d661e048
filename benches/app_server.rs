//! A zero-latency application on 127.0.0.1 for the application-target benchmark
//! (benches/compare_app_targets.py): a knowledge base with document upload and delete
//! and a chat that answers from nothing — the gullible model of the test server (a
//! PWNED-… token in the question is the answer, else "Sure. " and the question).
//!
//!   POST   /documents      {"title", "text"}   -> {"document": {"id": N}}
//!   DELETE /documents/{id}                     -> 204, or 404
//!   POST   /chat           {"question"}        -> {"data": {"answer": "..."}}
//!   GET    /stats                              -> {"documents": N, "requests": N}
//!
//! Usage: cargo bench --bench app_server   (prints the base URL, serves until killed)

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{delete, get, post};
use serde_json::{Value, json};

#[derive(Default)]
struct App {
    docs: Mutex<HashMap<u64, String>>,
    next: AtomicU64,
    requests: AtomicU64,
}

/// A JSON answer (axum's `Json` needs a feature pieval does not build).
fn json_answer(v: Value) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], v.to_string())
}

fn body_of(bytes: &Bytes) -> Value {
    serde_json::from_slice(bytes).unwrap_or(Value::Null)
}

async fn upload(State(app): State<Arc<App>>, bytes: Bytes) -> impl IntoResponse {
    app.requests.fetch_add(1, Ordering::Relaxed);
    let body = body_of(&bytes);
    let id = app.next.fetch_add(1, Ordering::Relaxed) + 1;
    let text = body["text"].as_str().unwrap_or_default().to_owned();
    app.docs.lock().unwrap().insert(id, text);
    json_answer(json!({"document": {"id": id}}))
}

async fn remove(State(app): State<Arc<App>>, Path(id): Path<u64>) -> StatusCode {
    app.requests.fetch_add(1, Ordering::Relaxed);
    match app.docs.lock().unwrap().remove(&id) {
        Some(_) => StatusCode::NO_CONTENT,
        None => StatusCode::NOT_FOUND,
    }
}

async fn chat(State(app): State<Arc<App>>, bytes: Bytes) -> impl IntoResponse {
    app.requests.fetch_add(1, Ordering::Relaxed);
    let body = body_of(&bytes);
    let q = body["question"].as_str().unwrap_or_default();
    let answer = match q.find("PWNED-") {
        Some(i) => q[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect(),
        None => format!("Sure. {q}"),
    };
    json_answer(json!({"data": {"answer": answer}}))
}

async fn stats(State(app): State<Arc<App>>) -> impl IntoResponse {
    json_answer(json!({
        "documents": app.docs.lock().unwrap().len(),
        "requests": app.requests.load(Ordering::Relaxed),
    }))
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let app = Arc::new(App::default());
        let router = axum::Router::new()
            .route("/documents", post(upload))
            .route("/documents/{id}", delete(remove))
            .route("/chat", post(chat))
            .route("/stats", get(stats))
            .with_state(app);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("http://{}", listener.local_addr().unwrap());
        std::io::stdout().flush().unwrap();
        axum::serve(listener, router).await.unwrap();
    });
}
