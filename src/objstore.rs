//! Object storage: `s3://bucket/prefix` locations for inputs, run folders and the
//! warehouse export, through the `object_store` crate DataFusion itself reads with
//! (docs/object-storage.md).
//!
//! **Credentials come from the environment only** (`AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`, `AWS_ENDPOINT_URL`,
//! `AWS_ALLOW_HTTP`, … as `object_store`'s `AmazonS3Builder::from_env` reads them). A
//! location is the URL alone; one that carries credentials (`s3://KEY:SECRET@bucket`)
//! is refused, so no credential can reach a summary, a manifest or a log.
//!
//! **A run folder on object storage is committed all or nothing.** Object stores have no
//! rename; a single PUT (or a completed multipart upload) of one object is their atomic
//! step. So a run `s3://b/results/r1` is laid out as
//!
//! ```text
//! s3://b/results/r1/_pieval_commit.json          ← the run: its commit id and files
//! s3://b/results/r1/v/COMMIT_ID/case_results.parquet
//! s3://b/results/r1/v/COMMIT_ID/…
//! ```
//!
//! Every file of a new scoring goes under a fresh `v/COMMIT_ID/`; only when all of them
//! are uploaded is `_pieval_commit.json` replaced (one PUT), naming each file with its
//! size and SHA-256. A reader starts from that object and reads only the files it names,
//! checking both: a client killed or a server failing mid-write leaves the previous
//! commit in force, and the parts of an unfinished one are never read (the same shape as
//! the table formats warehouses use, Delta Lake's and Iceberg's: data files first, then
//! one atomic pointer). The files of the replaced commit are deleted after the switch.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use object_store::multipart::MultipartStore;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// The scheme pieval reads and writes.
pub const SCHEME: &str = "s3://";

/// The object that commits a run on object storage.
pub const COMMIT_FILE: &str = "_pieval_commit.json";

/// The largest `_pieval_commit.json` read (a run has a handful of files).
const COMMIT_MAX_BYTES: u64 = 16 << 20;

/// `_pieval_commit.json`'s format.
pub const COMMIT_FORMAT: &str = "pieval.run-commit/1";

/// Files up to this size are one PUT; larger ones a multipart upload of parts this size
/// (S3 takes parts of 5 MiB to 5 GiB, at most 10,000 of them: 80 GiB at 8 MiB).
pub const PART_BYTES: usize = 8 << 20;

/// The smallest part S3 takes in a multipart upload, but for the last.
pub const MIN_PART_BYTES: u64 = 5 << 20;

/// Parts of one file in flight at once.
const PARTS_IN_FLIGHT: usize = 4;

/// Whether a path given on the command line names object storage.
pub fn is_remote(path: &Path) -> bool {
    path.to_str().is_some_and(|s| s.starts_with(SCHEME))
}

/// A location on object storage: a bucket and a key (a prefix, for a folder).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    pub bucket: String,
    pub key: ObjPath,
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.key.as_ref().is_empty() {
            write!(f, "{SCHEME}{}", self.bucket)
        } else {
            write!(f, "{SCHEME}{}/{}", self.bucket, self.key)
        }
    }
}

impl Location {
    /// `s3://bucket[/key]`. Refused: credentials, a port, a query or fragment, an empty
    /// bucket, and `.`/`..` or empty segments (a key means what it says).
    pub fn parse(text: &str) -> Result<Self> {
        let bad =
            |why: &str| Error::Usage(format!("{text}: not an object-storage location: {why}"));
        let rest = text
            .strip_prefix(SCHEME)
            .ok_or_else(|| bad("it must start with s3://"))?;
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(bad("no bucket"));
        }
        if bucket.contains('@') || bucket.contains(':') {
            // Not repeated: what precedes '@' may be a secret.
            return Err(Error::Usage(
                "an s3:// location with credentials or a port is refused (not repeated here): \
                 credentials come from the environment (AWS_ACCESS_KEY_ID, \
                 AWS_SECRET_ACCESS_KEY), the endpoint from AWS_ENDPOINT_URL"
                    .into(),
            ));
        }
        if !bucket
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        {
            return Err(bad(
                "a bucket name is lower-case letters, digits, '-' and '.'",
            ));
        }
        if key.contains('?') || key.contains('#') {
            return Err(bad("a query or fragment"));
        }
        let key = key.strip_suffix('/').unwrap_or(key);
        let mut parts = Vec::new();
        if !key.is_empty() {
            for part in key.split('/') {
                if part.is_empty() || part == "." || part == ".." {
                    return Err(bad("an empty, '.' or '..' segment in the key"));
                }
                if part.chars().any(char::is_control) {
                    return Err(bad("a control character in the key"));
                }
                parts.push(part);
            }
        }
        // The key as given, not percent-encoded (object_store's `From` would turn `~` into
        // `%7E` and ask for another object).
        let key = ObjPath::parse(parts.join("/")).map_err(|e| bad(&e.to_string()))?;
        Ok(Self {
            bucket: bucket.to_owned(),
            key,
        })
    }

    /// `path` as a location, when it names one (`None`: a local path).
    pub fn of(path: &Path) -> Result<Option<Self>> {
        match path.to_str() {
            Some(s) if s.starts_with(SCHEME) => Self::parse(s).map(Some),
            _ => Ok(None),
        }
    }

    /// The location of `name` inside this one (`name` may hold `/`).
    pub fn child(&self, name: &str) -> Self {
        Self {
            bucket: self.bucket.clone(),
            key: child_key(&self.key, name),
        }
    }

    /// The last segment of the key.
    pub fn name(&self) -> &str {
        self.key.filename().unwrap_or("")
    }
}

/// A connection to one bucket.
#[derive(Clone, Debug)]
pub struct Store {
    inner: Arc<dyn ObjectStore>,
    /// The same client, for multipart uploads whose parts several processes put
    /// ([`Store::create_upload`]).
    multipart: Arc<object_store::aws::AmazonS3>,
    bucket: String,
}

/// `PIEVAL_S3_RETRIES`: how often a failed request is retried (object_store's default:
/// 10, with exponential backoff from 100 ms to 15 s, for at most 3 minutes).
pub const RETRIES_ENV: &str = "PIEVAL_S3_RETRIES";

/// `PIEVAL_S3_SILENCE_SECS`: how long a request may stay silent — no answer, no byte of
/// its body — before it is given up and retried (a download resumes where it stopped).
/// No request has a bound on its total time: a slow transfer that keeps moving is never
/// cut.
pub const SILENCE_ENV: &str = "PIEVAL_S3_SILENCE_SECS";
const DEFAULT_SILENCE: Duration = Duration::from_secs(30);

/// `PIEVAL_S3_MAX_FETCH_BYTES`: the largest input fetched from object storage (`512M`,
/// `64G`, …); one past it is an error naming its size.
pub const MAX_FETCH_ENV: &str = "PIEVAL_S3_MAX_FETCH_BYTES";
const DEFAULT_MAX_FETCH: u64 = 16 << 30;

/// The slowest upload kept alive: a request's body may take its size at this rate (plus
/// the silence) before its answer must have begun.
const MIN_UPLOAD_BYTES_PER_SEC: f64 = 64.0 * 1024.0;

/// A download that stops is resumed from the byte it reached this many times without any
/// new byte in between.
const RESUMES: u32 = 5;

/// The silence allowed ([`SILENCE_ENV`]).
fn silence() -> Result<Duration> {
    match std::env::var(SILENCE_ENV) {
        Err(_) => Ok(DEFAULT_SILENCE),
        Ok(v) => v
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s > 0.0 && *s <= 86_400.0)
            .map(Duration::from_secs_f64)
            .ok_or_else(|| {
                Error::Usage(format!(
                    "{SILENCE_ENV}={v}: give the seconds a request may stay silent (up to a day)"
                ))
            }),
    }
}

/// The largest input fetched ([`MAX_FETCH_ENV`]).
pub fn max_fetch_bytes() -> Result<u64> {
    match std::env::var(MAX_FETCH_ENV) {
        Err(_) => Ok(DEFAULT_MAX_FETCH),
        Ok(v) => crate::rundir::bounds::parse_bytes(&v).ok_or_else(|| {
            Error::Usage(format!(
                "{MAX_FETCH_ENV}={v}: give a size (`512M`, `64G`, or bytes)"
            ))
        }),
    }
}

/// The HTTP client of a store: object_store's own (its proxies, certificates and
/// settings from the environment), with no bound on a request's total time, watched for
/// silence instead: a request whose answer does not begin within the silence (plus its
/// body's upload at [`MIN_UPLOAD_BYTES_PER_SEC`]), or whose answer's body stays silent
/// that long, fails as a timeout — which object_store retries, resuming a download by
/// range (checked against the object's entity tag).
#[derive(Debug)]
struct Watched {
    silence: Duration,
}

impl object_store::client::HttpConnector for Watched {
    fn connect(
        &self,
        options: &object_store::ClientOptions,
    ) -> object_store::Result<object_store::client::HttpClient> {
        let inner = object_store::client::ReqwestConnector::default().connect(options)?;
        Ok(object_store::client::HttpClient::new(WatchedClient {
            inner,
            silence: self.silence,
        }))
    }
}

#[derive(Debug)]
struct WatchedClient {
    inner: object_store::client::HttpClient,
    silence: Duration,
}

/// A request or body that stayed silent past the bound.
#[derive(Debug)]
struct Silent(Duration);

impl std::fmt::Display for Silent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "nothing received for {} s ({SILENCE_ENV})",
            self.0.as_secs_f64()
        )
    }
}

impl std::error::Error for Silent {}

#[async_trait::async_trait]
impl object_store::client::HttpService for WatchedClient {
    async fn call(
        &self,
        req: object_store::client::HttpRequest,
    ) -> std::result::Result<object_store::client::HttpResponse, object_store::client::HttpError>
    {
        use object_store::client::{HttpError, HttpErrorKind, HttpResponse, HttpResponseBody};
        let sent = req.body().content_length() as f64;
        let wait = self.silence + Duration::from_secs_f64(sent / MIN_UPLOAD_BYTES_PER_SEC);
        let resp = tokio::time::timeout(wait, self.inner.execute(req))
            .await
            .map_err(|_| HttpError::new(HttpErrorKind::Timeout, Silent(wait)))??;
        let (parts, body) = resp.into_parts();
        let body = Quiet {
            inner: body,
            silence: self.silence,
            deadline: Box::pin(tokio::time::sleep(self.silence)),
        };
        Ok(HttpResponse::from_parts(parts, HttpResponseBody::new(body)))
    }
}

/// A response body that fails as a timeout once no frame has come for the silence.
struct Quiet {
    inner: object_store::client::HttpResponseBody,
    silence: Duration,
    deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl http_body::Body for Quiet {
    type Data = bytes::Bytes;
    type Error = object_store::client::HttpError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<std::result::Result<http_body::Frame<bytes::Bytes>, Self::Error>>>
    {
        use std::future::Future;
        use std::task::Poll;
        let this = self.get_mut();
        match std::pin::Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                // Only bytes are news: empty frames (or trailers) keep nothing alive.
                let bytes =
                    matches!(&frame, Some(Ok(f)) if f.data_ref().is_some_and(|d| !d.is_empty()));
                if bytes || !matches!(frame, Some(Ok(_))) {
                    let next = tokio::time::Instant::now() + this.silence;
                    this.deadline.as_mut().reset(next);
                }
                Poll::Ready(frame)
            }
            Poll::Pending => match this.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(object_store::client::HttpError::new(
                    object_store::client::HttpErrorKind::Timeout,
                    Silent(this.silence),
                )))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Store {
    /// The bucket of `loc`, with everything else from the environment.
    pub fn open(loc: &Location) -> Result<Self> {
        register_credentials();
        let mut retry = object_store::RetryConfig::default();
        if let Ok(v) = std::env::var(RETRIES_ENV) {
            retry.max_retries = v.trim().parse().map_err(|_| {
                Error::Usage(format!("{RETRIES_ENV}={v}: not a whole number of retries"))
            })?;
        }
        retry.retry_timeout = Duration::from_secs(180);
        let silence = silence()?;
        // No bound on a request's total time (a day, object_store's setting): the client
        // is watched for silence instead.
        let store = object_store::aws::AmazonS3Builder::from_env()
            .with_bucket_name(&loc.bucket)
            .with_retry(retry)
            .with_config(
                object_store::aws::AmazonS3ConfigKey::Client(
                    object_store::ClientConfigKey::Timeout,
                ),
                "1day",
            )
            .with_http_connector(Watched { silence })
            .build()
            .map_err(|e| Error::Usage(format!("{loc}: cannot open the bucket: {}", redact(&e))))?;
        let store = Arc::new(store);
        Ok(Self {
            inner: Arc::clone(&store) as Arc<dyn ObjectStore>,
            multipart: store,
            bucket: loc.bucket.clone(),
        })
    }

    /// Start a multipart upload to `key` whose parts are put by any process with the
    /// upload's id ([`Store::put_part`]), the executors of a cluster: nothing appears at
    /// `key` until [`Store::complete_upload`], and nothing ever after
    /// [`Store::abort_upload`].
    pub async fn create_upload(&self, key: &ObjPath) -> Result<String> {
        self.multipart
            .create_multipart(key)
            .await
            .map_err(|e| self.err(key, "start a multipart upload of", e))
    }

    /// Put part `index` (from 0) of the upload `id`: its entity tag. Every part but the
    /// last must be at least [`MIN_PART_BYTES`]. Put again, it replaces the part.
    pub async fn put_part(
        &self,
        key: &ObjPath,
        id: &str,
        index: usize,
        bytes: bytes::Bytes,
    ) -> Result<String> {
        self.multipart
            .put_part(key, &id.to_owned(), index, PutPayload::from(bytes))
            .await
            .map(|p| p.content_id)
            .map_err(|e| self.err(key, &format!("write part {} of", index + 1), e))
    }

    /// Complete the upload `id` from its parts' entity tags, in order: the object
    /// appears whole. Its entity tag.
    pub async fn complete_upload(
        &self,
        key: &ObjPath,
        id: &str,
        tags: Vec<String>,
    ) -> Result<Option<String>> {
        let parts = tags
            .into_iter()
            .map(|content_id| object_store::multipart::PartId { content_id })
            .collect();
        self.multipart
            .complete_multipart(key, &id.to_owned(), parts)
            .await
            .map(|r| r.e_tag)
            .map_err(|e| self.err(key, "complete the multipart upload of", e))
    }

    /// Abort the upload `id` (its parts are discarded; best effort).
    pub async fn abort_upload(&self, key: &ObjPath, id: &str) {
        let _ = self.multipart.abort_multipart(key, &id.to_owned()).await;
    }

    /// The store, for a DataFusion session's registry.
    pub fn object_store(&self) -> Arc<dyn ObjectStore> {
        Arc::clone(&self.inner)
    }

    fn at(&self, key: &ObjPath) -> Location {
        Location {
            bucket: self.bucket.clone(),
            key: key.clone(),
        }
    }

    fn err(&self, key: &ObjPath, action: &str, e: object_store::Error) -> Error {
        let loc = self.at(key);
        match e {
            object_store::Error::NotFound { .. } => {
                Error::NotFound(format!("{loc}: no such object"))
            }
            e => Error::Process(format!("{loc}: cannot {action}: {}", redact(&e))),
        }
    }

    /// The object's bytes (for small objects: a commit, a summary).
    pub async fn get_bytes(&self, key: &ObjPath, limit: u64) -> Result<Option<Vec<u8>>> {
        match self.inner.get(key).await {
            Ok(r) if r.meta.size > limit => Err(Error::State(format!(
                "{}: {} bytes, more than the {limit} this file may have",
                self.at(key),
                r.meta.size
            ))),
            Ok(r) => Ok(Some(
                r.bytes()
                    .await
                    .map_err(|e| self.err(key, "read", e))?
                    .to_vec(),
            )),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.err(key, "read", e)),
        }
    }

    /// Stream an object — an input, at most [`MAX_FETCH_ENV`] bytes — into a local
    /// file, written under a temporary name and renamed when whole: its size and SHA-256.
    pub async fn download(&self, key: &ObjPath, to: &Path) -> Result<(u64, String)> {
        let cap = max_fetch_bytes()?;
        self.fetch_into(key, to, cap, &|size| match size {
            Some(n) => format!(
                "{}: {n} bytes, more than the {cap} bytes an input fetched from object storage may be ({MAX_FETCH_ENV} raises it)",
                self.at(key)
            ),
            None => format!(
                "{}: more than the {cap} bytes an input fetched from object storage may be ({MAX_FETCH_ENV} raises it)",
                self.at(key)
            ),
        })
        .await
    }

    /// [`Store::download`], stopped (nothing kept) once more than `limit` bytes arrive: a
    /// committed file is read no further than the size its commit gives it.
    pub async fn download_at_most(
        &self,
        key: &ObjPath,
        to: &Path,
        limit: u64,
    ) -> Result<(u64, String)> {
        self.fetch_into(key, to, limit, &|size| match size {
            Some(n) => format!(
                "{}: {n} bytes, more than the {limit} bytes its commit gives it",
                self.at(key)
            ),
            None => format!(
                "{}: more than the {limit} bytes its commit gives it",
                self.at(key)
            ),
        })
        .await
    }

    /// Stream `key` into `to`, at most `limit` bytes (`too_big`: the error past it, given
    /// the object's size when it says one). A transfer that stops — an error, or silence
    /// past [`SILENCE_ENV`] — is resumed from the byte it reached, by range, on the same
    /// object (its entity tag: an object replaced meanwhile is an error, never a file of
    /// two objects), as long as each attempt brings new bytes ([`RESUMES`] that bring
    /// none end it).
    async fn fetch_into(
        &self,
        key: &ObjPath,
        to: &Path,
        limit: u64,
        too_big: &dyn Fn(Option<u64>) -> String,
    ) -> Result<(u64, String)> {
        use std::io::Write;
        let mut file = crate::atomic::TempFile::create(to)?;
        let mut hash = Sha256::new();
        let mut bytes = 0u64;
        let mut etag: Option<String> = None;
        let mut size = 0u64;
        let mut idle = 0u32;
        loop {
            let options = object_store::GetOptions {
                range: (bytes > 0).then_some(object_store::GetRange::Offset(bytes)),
                if_match: etag.clone(),
                ..Default::default()
            };
            let got = match self.inner.get_opts(key, options).await {
                Ok(g) => g,
                Err(object_store::Error::Precondition { .. }) => {
                    return Err(Error::State(format!(
                        "{}: replaced while it was read; read it again",
                        self.at(key)
                    )));
                }
                Err(e) => return Err(self.err(key, "read", e)),
            };
            if bytes == 0 {
                if got.meta.size > limit {
                    return Err(Error::State(too_big(Some(got.meta.size))));
                }
                etag = got.meta.e_tag.clone();
                size = got.meta.size;
            } else if got.meta.e_tag != etag || got.meta.size != size {
                // The server did not keep to If-Match: another object, not to be spliced.
                return Err(Error::State(format!(
                    "{}: replaced while it was read; read it again",
                    self.at(key)
                )));
            }
            let mut stream = got.into_stream();
            let mut progressed = false;
            let mut stopped = None;
            while let Some(chunk) = stream.next().await {
                match chunk {
                    Ok(chunk) => {
                        bytes += chunk.len() as u64;
                        if bytes > limit {
                            return Err(Error::State(too_big(None)));
                        }
                        hash.update(&chunk);
                        file.write_all(&chunk)
                            .map_err(|e| Error::io(to, "cannot write", e))?;
                        progressed |= !chunk.is_empty();
                    }
                    Err(e) => {
                        stopped = Some(e);
                        break;
                    }
                }
            }
            let Some(e) = stopped else {
                break;
            };
            // Every byte arrived before the stream stopped: whole.
            if bytes == size {
                break;
            }
            idle = if progressed { 0 } else { idle + 1 };
            // Without an entity tag, another object could be read on: no resume.
            if etag.is_none() || idle > RESUMES {
                return Err(self.err(key, "read", e));
            }
        }
        if bytes != size {
            return Err(Error::State(format!(
                "{}: {bytes} bytes arrived of the {size} it has; read it again",
                self.at(key)
            )));
        }
        file.commit()?;
        Ok((bytes, hex::encode(hash.finalize())))
    }

    /// Upload a local file: one PUT up to [`PART_BYTES`], a multipart upload above (aborted
    /// on failure, so no part of it becomes an object). Either way the object appears
    /// whole or not at all.
    pub async fn upload(&self, from: &Path, key: &ObjPath) -> Result<FileEntry> {
        let mut file = std::fs::File::open(from).map_err(|e| Error::io(from, "cannot open", e))?;
        let size = file
            .metadata()
            .map_err(|e| Error::io(from, "cannot read", e))?
            .len();
        let mut hash = Sha256::new();
        let mut read = 0u64;
        let mut read_chunk = |buf: &mut Vec<u8>| -> Result<usize> {
            buf.clear();
            let n = (&mut file)
                .take(PART_BYTES as u64)
                .read_to_end(buf)
                .map_err(|e| Error::io(from, "cannot read", e))?;
            hash.update(&buf[..n]);
            read += n as u64;
            Ok(n)
        };
        let mut buf = Vec::with_capacity(PART_BYTES.min(size as usize + 1));
        let multipart = size > PART_BYTES as u64;
        if !multipart {
            read_chunk(&mut buf)?;
            if read_chunk(&mut Vec::new())? != 0 {
                return Err(Error::State(format!(
                    "{}: grew while it was being uploaded",
                    from.display()
                )));
            }
            let payload = PutPayload::from(std::mem::take(&mut buf));
            self.inner
                .put(key, payload)
                .await
                .map_err(|e| self.err(key, "write", e))?;
        } else {
            let upload = self
                .inner
                .put_multipart(key)
                .await
                .map_err(|e| self.err(key, "start a multipart upload of", e))?;
            let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
            let written: Result<()> = async {
                loop {
                    writer
                        .wait_for_capacity(PARTS_IN_FLIGHT)
                        .await
                        .map_err(|e| self.err(key, "write a part of", e))?;
                    if read_chunk(&mut buf)? == 0 {
                        break;
                    }
                    writer.write(&buf);
                }
                // The last parts too, here: `finish` would return their error without
                // aborting the upload.
                writer
                    .wait_for_capacity(0)
                    .await
                    .map_err(|e| self.err(key, "write a part of", e))
            }
            .await;
            match written {
                Ok(()) => {
                    writer
                        .finish()
                        .await
                        .map_err(|e| self.err(key, "complete the multipart upload of", e))?;
                }
                Err(e) => {
                    let _ = writer.abort().await;
                    return Err(e);
                }
            }
        }
        Ok(FileEntry {
            name: String::new(),
            bytes: read,
            sha256: hex::encode(hash.finalize()),
            multipart,
        })
    }

    /// Object keys directly under `prefix` (its "subfolders").
    pub async fn subfolders(&self, prefix: &ObjPath) -> Result<Vec<ObjPath>> {
        let prefix = (!prefix.as_ref().is_empty()).then_some(prefix);
        let listed = self.inner.list_with_delimiter(prefix).await.map_err(|e| {
            self.err(
                prefix.cloned().as_ref().unwrap_or(&ObjPath::default()),
                "list",
                e,
            )
        })?;
        let mut out = listed.common_prefixes;
        out.sort();
        Ok(out)
    }

    /// The object's size and entity tag (`None`: no such object).
    pub async fn head(&self, key: &ObjPath) -> Result<Option<(u64, Option<String>)>> {
        match self.inner.head(key).await {
            Ok(meta) => Ok(Some((meta.size, meta.e_tag))),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.err(key, "read", e)),
        }
    }

    /// Delete every object under `prefix` (best effort).
    async fn delete_prefix(&self, prefix: &ObjPath) {
        let mut listed = self.inner.list(Some(prefix));
        while let Some(meta) = listed.next().await {
            if let Ok(meta) = meta {
                let _ = self.inner.delete(&meta.location).await;
            }
        }
    }

    /// Delete every object under `prefix`, or say what could not be.
    pub async fn remove_prefix(&self, prefix: &ObjPath) -> Result<()> {
        let mut listed = self.inner.list(Some(prefix));
        while let Some(meta) = listed.next().await {
            let meta = meta.map_err(|e| self.err(prefix, "list", e))?;
            self.inner
                .delete(&meta.location)
                .await
                .map_err(|e| self.err(&meta.location, "delete", e))?;
        }
        Ok(())
    }

    async fn delete_files(&self, dir: &ObjPath, files: &[FileEntry]) {
        for f in files {
            let _ = self.inner.delete(&child_key(dir, &f.name)).await;
        }
    }
}

/// An object read from a blocking thread of a tokio runtime (a reader task's, or a
/// `spawn_blocking` closure): bytes fetched by range on demand, each request made only
/// if the object is still the one first seen (its size, and its entity tag through
/// `If-Match` where the store gives one), so an object replaced while it is read fails
/// the read rather than mix two versions. It is a Parquet `ChunkReader` (the footer and
/// the row groups a reader selects are all that is fetched) and reads forward from any
/// offset ([`BlockingObject::read_from`]: a JSONL slice).
#[derive(Clone)]
pub struct BlockingObject {
    store: Store,
    key: ObjPath,
    len: u64,
    e_tag: Option<String>,
    handle: tokio::runtime::Handle,
    /// Byte ranges fetched whole by the first request inside one (a Parquet row group),
    /// sorted; the latest fetched are held, up to [`HELD_BYTES`] (at least one).
    spans: Arc<Vec<(u64, u64)>>,
    held: Arc<std::sync::Mutex<std::collections::VecDeque<(u64, bytes::Bytes)>>>,
    /// The object's last [`TAIL_BYTES`], fetched by the first request inside them and
    /// kept: a Parquet footer (and the page index before it) is read several times.
    tail: Arc<std::sync::OnceLock<bytes::Bytes>>,
}

/// How much of an object's end is fetched, and kept, by the first request inside it.
const TAIL_BYTES: u64 = 64 << 10;

/// How many bytes of spans are held at most (the latest fetched; one span at least,
/// whatever its size). A Parquet reader reads a batch column by column, each column
/// through every row group the batch spans: with the groups of a batch held, each is
/// fetched once.
const HELD_BYTES: usize = 64 << 20;

/// Bytes fetched by the first request when an object is read forward; each next request
/// asks for twice as many, up to [`READ_WINDOW`] (a short read costs a short request).
const FIRST_WINDOW: u64 = 64 << 10;

/// The most bytes fetched per request when an object is read forward.
const READ_WINDOW: u64 = 8 << 20;

impl BlockingObject {
    /// The object at `loc`, which must still have the size and entity tag `expect`
    /// records (the client's view when it cut the object into slices), when given.
    /// Called on a blocking thread of a tokio runtime (`spawn_blocking`): its requests
    /// block that thread, which an async worker thread must never do.
    pub fn open(loc: &Location, expect: Option<(u64, Option<&str>)>) -> Result<Self> {
        Self::open_in(Store::open(loc)?, loc, expect)
    }

    /// [`BlockingObject::open`] through `store`, a connection to `loc`'s bucket already
    /// open: a task reading many objects reuses its connections.
    pub fn open_in(
        store: Store,
        loc: &Location,
        expect: Option<(u64, Option<&str>)>,
    ) -> Result<Self> {
        if store.bucket != loc.bucket {
            return Err(Error::Internal(format!(
                "{loc}: read through a connection to bucket {}",
                store.bucket
            )));
        }
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|_| Error::Internal(format!("{loc}: read outside an async runtime")))?;
        let (len, e_tag) = handle
            .block_on(store.head(&loc.key))?
            .ok_or_else(|| Error::NotFound(format!("{loc}: no such object")))?;
        if let Some((size, tag)) = expect
            && (size != len || tag.is_some_and(|t| e_tag.as_deref() != Some(t)))
        {
            return Err(Error::State(format!(
                "{loc}: the object changed while it was scored ({size} bytes when it was \
                 cut, {len} now, or another entity tag): score again once nothing writes to it"
            )));
        }
        Ok(Self {
            store,
            key: loc.key.clone(),
            len,
            e_tag,
            handle,
            spans: Arc::new(Vec::new()),
            held: Arc::default(),
            tail: Arc::default(),
        })
    }

    /// This object, with `spans` (byte ranges) each fetched whole by the first request
    /// inside it and held while the latest spans fetched add up to at most
    /// [`HELD_BYTES`]: a Parquet reader's many small reads of a row group (page headers,
    /// then each column's pages) cost one request.
    pub fn holding(mut self, mut spans: Vec<(u64, u64)>) -> Self {
        spans.retain(|&(s, e)| s < e && e <= self.len);
        spans.sort_unstable();
        self.spans = Arc::new(spans);
        self.held = Arc::default();
        self
    }

    /// The span holding `start..end`, if one does.
    fn span_of(&self, start: u64, end: u64) -> Option<(u64, u64)> {
        let i = self.spans.partition_point(|&(s, _)| s <= start);
        let (s, e) = *self.spans.get(i.checked_sub(1)?)?;
        (end <= e).then_some((s, e))
    }

    /// Its size and entity tag.
    pub fn stamp(&self) -> (u64, Option<String>) {
        (self.len, self.e_tag.clone())
    }

    /// The location, for messages.
    pub fn location(&self) -> Location {
        self.store.at(&self.key)
    }

    /// Bytes `start..end` (inside the object), from the span held or fetched now.
    pub fn range(&self, start: u64, end: u64) -> Result<bytes::Bytes> {
        if start > end || end > self.len {
            return Err(Error::State(format!(
                "{}: bytes {start} to {end} asked of an object of {} bytes",
                self.location(),
                self.len
            )));
        }
        if start == end {
            return Ok(bytes::Bytes::new());
        }
        let tail_start = self.len.saturating_sub(TAIL_BYTES);
        if start >= tail_start {
            let tail = match self.tail.get() {
                Some(t) => t.clone(),
                None => {
                    let t = self.fetch(tail_start, self.len)?;
                    self.tail.get_or_init(|| t).clone()
                }
            };
            return Ok(tail.slice((start - tail_start) as usize..(end - tail_start) as usize));
        }
        let Some((s, e)) = self.span_of(start, end) else {
            return self.fetch(start, end);
        };
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let bytes = match held.iter().find(|(at, _)| *at == s) {
            Some((_, bytes)) => bytes.clone(),
            None => {
                let bytes = self.fetch(s, e)?;
                let mut total: usize = held.iter().map(|(_, b)| b.len()).sum();
                while total + bytes.len() > HELD_BYTES
                    && let Some((_, old)) = held.pop_front()
                {
                    total -= old.len();
                }
                held.push_back((s, bytes.clone()));
                bytes
            }
        };
        Ok(bytes.slice((start - s) as usize..(end - s) as usize))
    }

    /// Bytes `start..end`, fetched now: one request, made only if the object is still
    /// the one first seen.
    fn fetch(&self, start: u64, end: u64) -> Result<bytes::Bytes> {
        let opts = object_store::GetOptions {
            range: Some(object_store::GetRange::Bounded(start..end)),
            if_match: self.e_tag.clone(),
            ..Default::default()
        };
        let got = self.handle.block_on(async {
            let got = self.store.inner.get_opts(&self.key, opts).await?;
            if got.meta.size != self.len {
                return Ok(None);
            }
            got.bytes().await.map(Some)
        });
        match got {
            Ok(Some(b)) if b.len() as u64 == end - start => Ok(b),
            Ok(_) | Err(object_store::Error::Precondition { .. }) => Err(Error::State(format!(
                "{}: the object changed while it was read: score again once nothing writes to it",
                self.location()
            ))),
            Err(e) => Err(self.store.err(&self.key, "read", e)),
        }
    }

    /// A reader of the object from `start` to its end, fetching a window at a time (only
    /// what is read is fetched, give or take one window: 64 KiB first, doubling to 8 MiB).
    pub fn read_from(&self, start: u64) -> ObjectRead {
        ObjectRead {
            object: self.clone(),
            at: start.min(self.len),
            buf: bytes::Bytes::new(),
            window: FIRST_WINDOW,
        }
    }
}

/// [`BlockingObject::read_from`].
pub struct ObjectRead {
    object: BlockingObject,
    at: u64,
    buf: bytes::Bytes,
    window: u64,
}

impl Read for ObjectRead {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.buf.is_empty() {
            if self.at >= self.object.len {
                return Ok(0);
            }
            // The rest of a span held (or fetched whole), or the next window.
            let end = match self.object.span_of(self.at, self.at + 1) {
                Some((_, span_end)) => span_end,
                None => {
                    let end = self.at.saturating_add(self.window).min(self.object.len);
                    self.window = (self.window * 2).min(READ_WINDOW);
                    end
                }
            };
            self.buf = self
                .object
                .range(self.at, end)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            self.at = end;
        }
        let n = out.len().min(self.buf.len());
        out[..n].copy_from_slice(&self.buf[..n]);
        bytes::Buf::advance(&mut self.buf, n);
        Ok(n)
    }
}

impl datafusion::parquet::file::reader::Length for BlockingObject {
    fn len(&self) -> u64 {
        self.len
    }
}

impl datafusion::parquet::file::reader::ChunkReader for BlockingObject {
    type T = ObjectRead;

    fn get_read(&self, start: u64) -> datafusion::parquet::errors::Result<Self::T> {
        Ok(self.read_from(start))
    }

    fn get_bytes(
        &self,
        start: u64,
        length: usize,
    ) -> datafusion::parquet::errors::Result<bytes::Bytes> {
        let end = start.saturating_add(length as u64);
        if end > self.len {
            return Err(datafusion::parquet::errors::ParquetError::EOF(format!(
                "bytes {start} to {end} of an object of {} bytes",
                self.len
            )));
        }
        self.range(start, end)
            .map_err(|e| datafusion::parquet::errors::ParquetError::External(Box::new(e)))
    }
}

/// The object stores of a DataFusion runtime: `s3://BUCKET` opened on first use with
/// everything from this process's environment ([`Store::open`]: credentials never travel
/// in a plan), any other URL as DataFusion's default registry has it. An executor's
/// runtime holds one, so a plan that reads a staged `s3://` file finds its store there.
#[derive(Debug, Default)]
pub struct EnvRegistry {
    others: datafusion::execution::object_store::DefaultObjectStoreRegistry,
    opened: std::sync::Mutex<std::collections::HashMap<String, Arc<dyn ObjectStore>>>,
}

impl datafusion::execution::object_store::ObjectStoreRegistry for EnvRegistry {
    fn register_store(
        &self,
        url: &url::Url,
        store: Arc<dyn ObjectStore>,
    ) -> Option<Arc<dyn ObjectStore>> {
        if url.scheme() != "s3" {
            return self.others.register_store(url, store);
        }
        let bucket = url.host_str().unwrap_or_default().to_owned();
        self.opened
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(bucket, store)
    }

    fn get_store(&self, url: &url::Url) -> datafusion::error::Result<Arc<dyn ObjectStore>> {
        if url.scheme() != "s3" {
            return self.others.get_store(url);
        }
        let bucket = url.host_str().unwrap_or_default().to_owned();
        let mut opened = self.opened.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(store) = opened.get(&bucket) {
            return Ok(Arc::clone(store));
        }
        let loc = Location::parse(&format!("{SCHEME}{bucket}"))
            .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?;
        let store = Store::open(&loc)
            .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?
            .object_store();
        opened.insert(bucket, Arc::clone(&store));
        Ok(store)
    }

    fn deregister_store(&self, url: &url::Url) -> datafusion::error::Result<Arc<dyn ObjectStore>> {
        self.others.deregister_store(url)
    }
}

/// `name` (which may hold `/`) under `dir`, as raw key text: a Hive partition folder
/// `model_name=a%2Fb` stays that key (object_store's `join` would encode the `%` again).
/// A segment object_store refuses raw (a control character) is encoded instead.
fn child_key(dir: &ObjPath, name: &str) -> ObjPath {
    let parts: Vec<&str> = name.split('/').filter(|p| !p.is_empty()).collect();
    let text = if dir.as_ref().is_empty() {
        parts.join("/")
    } else {
        format!("{}/{}", dir.as_ref(), parts.join("/"))
    };
    ObjPath::parse(&text).unwrap_or_else(|_| {
        let mut key = dir.clone();
        for part in parts {
            key = key.join(part);
        }
        key
    })
}

/// The credentials of the environment, registered as secrets: redacted, in any
/// spelling, from every text pieval writes or prints (`crate::secrets`).
fn register_credentials() {
    for var in [
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_ACCESS_KEY_ID",
    ] {
        if let Ok(secret) = std::env::var(var) {
            crate::secrets::register(secret.trim());
        }
    }
}

/// An error of the S3 client as text, with the credentials removed in any spelling (the
/// client's messages name URLs and headers, never a secret as far as its source shows;
/// a server's error body is quoted in them, and may echo anything).
fn redact(e: &object_store::Error) -> String {
    register_credentials();
    crate::secrets::redact(&e.to_string()).0.into_owned()
}

/// One file of a commit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Its name in the run folder.
    pub name: String,
    pub bytes: u64,
    pub sha256: String,
    /// Uploaded in parts (not recorded: how, not what).
    #[serde(skip)]
    pub multipart: bool,
}

/// `_pieval_commit.json`: which files make the run, and where they are.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Commit {
    pub format: String,
    pub run_id: String,
    pub commit_id: String,
    /// The commit this one replaced: its files are kept until the next commit, so a
    /// reader that read it is not cut off mid-fetch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_commit_id: Option<String>,
    pub committed_at: String,
    pub files: Vec<FileEntry>,
}

impl Commit {
    /// The folder of this commit's files.
    pub fn dir(&self, run: &Location) -> Location {
        run.child(&format!("v/{}", self.commit_id))
    }
}

/// A fresh commit id: the UTC time and 64 random bits (sorts by time; two writers never
/// share one).
pub fn new_commit_id() -> String {
    format!(
        "{}-{:016x}",
        crate::text::utc_compact_now(),
        fastrand::u64(..)
    )
}

/// The commit in force for the run at `run`, if any. One that does not parse is an
/// error naming it (a run folder received from someone else is checked, not trusted).
pub async fn read_commit(store: &Store, run: &Location) -> Result<Option<Commit>> {
    let at = run.child(COMMIT_FILE);
    let Some(bytes) = store.get_bytes(&at.key, COMMIT_MAX_BYTES).await? else {
        return Ok(None);
    };
    let commit: Commit = serde_json::from_slice(&bytes)
        .map_err(|e| Error::State(format!("{at}: not a pieval run commit: {e}")))?;
    if commit.format != COMMIT_FORMAT {
        return Err(Error::State(format!(
            "{at}: format {:?}, this pieval reads {COMMIT_FORMAT:?}",
            commit.format
        )));
    }
    let id_ok = valid_commit_id(&commit.commit_id)
        && commit
            .previous_commit_id
            .as_deref()
            .is_none_or(valid_commit_id);
    if !id_ok {
        return Err(Error::State(format!(
            "{at}: commit_id {:?} is not one pieval writes",
            commit.commit_id
        )));
    }
    for f in &commit.files {
        check_file_name(&f.name)
            .map_err(|why| Error::State(format!("{at}: file {:?}: {why}", f.name)))?;
        if f.sha256.len() != 64 || !f.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::State(format!(
                "{at}: file {:?}: sha256 {:?} is not a SHA-256 digest",
                f.name, f.sha256
            )));
        }
    }
    Ok(Some(commit))
}

/// A commit id as pieval writes them: letters, digits and '-'.
fn valid_commit_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// A run folder's file name: one plain segment (no folder, no path tricks).
fn check_file_name(name: &str) -> std::result::Result<(), &'static str> {
    if name.is_empty()
        || name == "."
        || name == ".."
        || name.contains('/')
        || name.contains('\\')
        || name.chars().any(char::is_control)
    {
        return Err("not a plain file name");
    }
    Ok(())
}

/// Publish the local run folder `local` as the run at `run`: every regular file under
/// a fresh `v/COMMIT_ID/`, then `_pieval_commit.json` in one PUT, then the previous
/// commit's files deleted. Refused: anything in `local` that is not a regular file (a
/// symbolic link, a folder). On any error before the commit object is written the run
/// keeps its previous commit; the new files already uploaded are deleted (best effort;
/// they are never read either way).
pub async fn publish_run(
    store: &Store,
    run: &Location,
    local: &Path,
    run_id: &str,
    commit_id: &str,
    uploaded: Vec<FileEntry>,
) -> Result<Commit> {
    let previous = read_commit(store, run).await?;
    // A scoring killed while it committed into the local folder is completed first.
    crate::atomic::finish_commit(local)?;
    let mut names = Vec::new();
    let entries = std::fs::read_dir(local).map_err(|e| Error::io(local, "cannot list", e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(local, "cannot list", e))?;
        let path = entry.path();
        let kind = entry
            .file_type()
            .map_err(|e| Error::io(&path, "cannot read", e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if crate::atomic::is_temporary(&name) {
            continue;
        }
        if !kind.is_file() {
            return Err(Error::State(format!(
                "{}: not a regular file (a run published to object storage is plain files)",
                path.display()
            )));
        }
        check_file_name(&name).map_err(|why| Error::State(format!("{}: {why}", path.display())))?;
        names.push(name);
    }
    names.sort();
    let commit = Commit {
        format: COMMIT_FORMAT.into(),
        run_id: run_id.into(),
        commit_id: commit_id.into(),
        previous_commit_id: previous.as_ref().map(|p| p.commit_id.clone()),
        committed_at: crate::text::utc_rfc3339_millis(),
        files: Vec::new(),
    };
    let dir = commit.dir(run);
    // Files the cluster's executors already put into the commit's folder: the folder
    // here must not hold a copy of its own.
    for f in &uploaded {
        check_file_name(&f.name).map_err(|why| Error::State(format!("{}: {why}", f.name)))?;
        if names.contains(&f.name) {
            return Err(Error::Internal(format!(
                "{}: both uploaded by the cluster and in {}",
                f.name,
                local.display()
            )));
        }
    }
    let mut files = uploaded;
    let uploaded: Result<()> = async {
        for name in &names {
            let mut entry = store
                .upload(&local.join(name), &dir.child(name).key)
                .await?;
            entry.name = name.clone();
            files.push(entry);
        }
        Ok(())
    }
    .await;
    if let Err(e) = uploaded {
        store.delete_files(&dir.key, &files).await;
        return Err(e);
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    let commit = Commit { files, ..commit };
    let text = serde_json::to_vec_pretty(&commit)
        .map_err(|e| Error::Internal(format!("cannot encode the commit: {e}")))?;
    let at = run.child(COMMIT_FILE);
    if let Err(e) = store.inner.put(&at.key, PutPayload::from(text)).await {
        // The PUT may have landed with its answer lost: then this commit is in force,
        // and its files must stay.
        match read_commit(store, run).await {
            Ok(Some(now)) if now.commit_id == commit.commit_id => {}
            Ok(_) => {
                store.delete_files(&dir.key, &commit.files).await;
                return Err(store.err(&at.key, "write", e));
            }
            // Whether the PUT landed is unknown: its files stay (a commit in force must
            // not lose them; if it did not land, they are never read).
            Err(read) => {
                return Err(Error::State(format!(
                    "{}; and reading it back failed ({read}): the commit {} may or may not \
                     be in force, and its files are kept",
                    store.err(&at.key, "write", e),
                    commit.commit_id
                )));
            }
        }
    }
    // The files of the commit before the one replaced (kept one generation, see above).
    if let Some(old) = previous
        .and_then(|p| p.previous_commit_id)
        .filter(|id| *id != commit.commit_id && valid_commit_id(id))
    {
        store
            .delete_prefix(&run.child(&format!("v/{old}")).key)
            .await;
    }
    Ok(commit)
}

/// Download the files of `commit` into `to` (a folder), each checked against its size
/// and SHA-256: a file that differs is an error naming it, and nothing of it is kept.
pub async fn fetch_run(store: &Store, run: &Location, commit: &Commit, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).map_err(|e| Error::io(to, "cannot create folder", e))?;
    let dir = commit.dir(run);
    for f in &commit.files {
        let local = to.join(&f.name);
        let (bytes, sha) = store
            .download_at_most(&dir.child(&f.name).key, &local, f.bytes)
            .await?;
        if bytes != f.bytes || sha != f.sha256 {
            let _ = std::fs::remove_file(&local);
            return Err(Error::State(format!(
                "{}: {} bytes, sha256 {sha}; the commit {} names {} bytes, sha256 {}",
                dir.child(&f.name),
                bytes,
                run.child(COMMIT_FILE),
                f.bytes,
                f.sha256
            )));
        }
    }
    Ok(())
}

/// The committed runs directly under `results` (those with a `_pieval_commit.json`),
/// by name.
pub async fn list_runs(store: &Store, results: &Location) -> Result<Vec<(Location, Commit)>> {
    let mut runs = Vec::new();
    for key in store.subfolders(&results.key).await? {
        let run = store.at(&key);
        if let Some(commit) = read_commit(store, &run).await? {
            runs.push((run, commit));
        }
    }
    Ok(runs)
}

/// A private local folder for what is fetched from or published to object storage,
/// removed with everything in it when dropped (its temporary name lets the next pieval
/// remove one a killed process left: `crate::atomic::clean_stale`).
pub struct Scratch {
    pub dir: PathBuf,
}

impl Scratch {
    pub fn create() -> Result<Self> {
        let parent = std::env::temp_dir();
        crate::atomic::clean_stale(&parent);
        let dir = parent.join(format!(
            ".pieval-objstore.tmp-{}-{:016x}",
            std::process::id(),
            fastrand::u64(..)
        ));
        let mut builder = std::fs::DirBuilder::new();
        #[cfg(unix)]
        {
            use std::os::unix::fs::DirBuilderExt;
            builder.mode(0o700);
        }
        builder
            .create(&dir)
            .map_err(|e| Error::io(&dir, "cannot create folder", e))?;
        Ok(Self { dir })
    }
}

impl Scratch {
    /// The folder of `scratch`, created on first use.
    pub fn dir_of(scratch: &mut Option<Scratch>) -> Result<PathBuf> {
        let created = match scratch.take() {
            Some(s) => s,
            None => Scratch::create()?,
        };
        let dir = created.dir.clone();
        *scratch = Some(created);
        Ok(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// An input given as `s3://…`, downloaded into `scratch` (under its own name) so the
/// validating readers stream it as they stream a local file; a local path is returned
/// as it is.
pub fn local_input(
    path: &Path,
    scratch: &mut Option<Scratch>,
    rt: &tokio::runtime::Runtime,
) -> Result<PathBuf> {
    let Some(loc) = Location::of(path)? else {
        return Ok(path.to_path_buf());
    };
    if loc.name().is_empty() {
        return Err(Error::Usage(format!("{loc}: names a bucket, not a file")));
    }
    let dir = Scratch::dir_of(scratch)?;
    let sub = dir.join(format!("input-{:016x}", fastrand::u64(..)));
    std::fs::create_dir(&sub).map_err(|e| Error::io(&sub, "cannot create folder", e))?;
    let local = sub.join(loc.name());
    let store = Store::open(&loc)?;
    rt.block_on(store.download(&loc.key, &local))?;
    Ok(local)
}

/// Upload every file under the local folder `local` to the same relative keys under
/// `to` (a warehouse export: each object is written whole by its PUT or multipart
/// upload), the files under `last/` after all others (the export's `runs` table: a run
/// listed there has its other tables in place). Symbolic links are refused.
pub fn upload_tree(
    to: &Location,
    local: &Path,
    last: &str,
    rt: &tokio::runtime::Runtime,
) -> Result<Vec<FileEntry>> {
    fn walk(dir: &Path, rel: &str, out: &mut Vec<(String, PathBuf)>) -> Result<()> {
        let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, "cannot list", e))?;
        for entry in entries {
            let entry = entry.map_err(|e| Error::io(dir, "cannot list", e))?;
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if crate::atomic::is_temporary(&name) {
                continue;
            }
            let kind = entry
                .file_type()
                .map_err(|e| Error::io(&path, "cannot read", e))?;
            let rel = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            if kind.is_dir() {
                walk(&path, &rel, out)?;
            } else if kind.is_file() {
                out.push((rel, path));
            } else {
                return Err(Error::State(format!(
                    "{}: not a regular file or folder",
                    path.display()
                )));
            }
        }
        Ok(())
    }
    let mut files = Vec::new();
    walk(local, "", &mut files)?;
    let last_prefix = format!("{last}/");
    files.sort_by(|a, b| {
        (a.0.starts_with(&last_prefix), &a.0).cmp(&(b.0.starts_with(&last_prefix), &b.0))
    });
    let store = Store::open(to)?;
    rt.block_on(async {
        let mut done = Vec::new();
        for (rel, path) in &files {
            let mut entry = store.upload(path, &to.child(rel).key).await?;
            entry.name = rel.clone();
            done.push(entry);
        }
        Ok(done)
    })
}

/// A `--results` given as `s3://…`: every committed run under it fetched (each file
/// checked against its commit) into `scratch`, as the folder of run folders the local
/// readers take; a local path is returned as it is.
pub fn local_results(
    results: &Path,
    scratch: &mut Option<Scratch>,
    rt: &tokio::runtime::Runtime,
) -> Result<PathBuf> {
    let Some(loc) = Location::of(results)? else {
        return Ok(results.to_path_buf());
    };
    let to = Scratch::dir_of(scratch)?.join("results");
    std::fs::create_dir(&to).map_err(|e| Error::io(&to, "cannot create folder", e))?;
    let store = Store::open(&loc)?;
    rt.block_on(async {
        for (run, commit) in list_runs(&store, &loc).await? {
            let name = run.name().to_owned();
            if crate::rundir::check_run_id(&name).is_err() {
                return Err(Error::State(format!(
                    "{run}: not a run name pieval accepts (letters, digits, '.', '_', '-')"
                )));
            }
            fetch_run(&store, &run, &commit, &to.join(&name)).await?;
        }
        Ok(())
    })?;
    Ok(to)
}

/// A run folder on object storage being rewritten: its committed files fetched into a
/// local working folder (so a rescoring keeps what it keeps locally: the judge's
/// verdicts, a run's other files), the work done there, then published as one new
/// commit ([`publish_run`]).
pub struct RemoteRun {
    pub store: Store,
    pub run: Location,
    /// The local working folder.
    pub work: PathBuf,
    pub commit_id: String,
}

impl RemoteRun {
    /// `None` for a local path. The run's name (its last key segment) must be a valid
    /// folder name; its committed files (if any) are fetched and checked, but for those
    /// named in `replaced` (which the caller writes anew: scoring's results).
    pub fn open(
        output: &Path,
        replaced: &[&str],
        scratch: &mut Option<Scratch>,
        rt: &tokio::runtime::Runtime,
    ) -> Result<Option<Self>> {
        let Some(run) = Location::of(output)? else {
            return Ok(None);
        };
        if run.key.as_ref().is_empty() {
            return Err(Error::Usage(format!(
                "{run}: give a run's prefix inside the bucket (s3://BUCKET/results/RUN)"
            )));
        }
        crate::rundir::check_run_id(run.name())
            .map_err(|e| Error::Usage(format!("{run}: the run's folder name: {e}")))?;
        let work = Scratch::dir_of(scratch)?.join("run");
        std::fs::create_dir(&work).map_err(|e| Error::io(&work, "cannot create folder", e))?;
        let store = Store::open(&run)?;
        rt.block_on(async {
            if let Some(mut commit) = read_commit(&store, &run).await? {
                commit
                    .files
                    .retain(|f| !replaced.contains(&f.name.as_str()));
                fetch_run(&store, &run, &commit, &work).await?;
            }
            Ok::<_, Error>(())
        })?;
        Ok(Some(Self {
            store,
            run,
            work,
            commit_id: new_commit_id(),
        }))
    }

    /// Where a file of the working folder will be once published.
    pub fn url_of(&self, local: &Path) -> PathBuf {
        match local.strip_prefix(&self.work) {
            Ok(rel) => PathBuf::from(
                self.run
                    .child(&format!("v/{}/{}", self.commit_id, rel.to_string_lossy()))
                    .to_string(),
            ),
            Err(_) => local.to_path_buf(),
        }
    }

    /// Where this scoring's commit puts its files (`v/COMMIT_ID/` of the run): a
    /// cluster's executors put the run's large files there themselves.
    pub fn commit_dir(&self) -> Location {
        self.run.child(&format!("v/{}", self.commit_id))
    }

    /// Remove what this scoring put into its commit's folder before the commit (the
    /// executors' files of a scoring that failed; best effort: unreferenced, never read).
    pub fn discard(&self, rt: &tokio::runtime::Runtime) {
        rt.block_on(async {
            // Only when the commit is known not to be in force.
            match read_commit(&self.store, &self.run).await {
                Ok(Some(now)) if now.commit_id == self.commit_id => {}
                Ok(_) => self.store.delete_prefix(&self.commit_dir().key).await,
                Err(_) => {}
            }
        });
    }

    /// Publish the working folder as the run's new commit, with `uploaded`: files
    /// already in the commit's folder ([`RemoteRun::commit_dir`]). `summary.json`'s
    /// `result_paths` are rewritten to where the files now live.
    pub fn publish(
        &self,
        run_id: &str,
        uploaded: Vec<FileEntry>,
        rt: &tokio::runtime::Runtime,
    ) -> Result<Commit> {
        let summary = self.work.join(crate::rundir::SUMMARY_FILE);
        if summary.is_file() {
            let text = std::fs::read_to_string(&summary)
                .map_err(|e| Error::io(&summary, "cannot read", e))?;
            let mut v: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| Error::config(&summary, format!("not JSON: {e}")))?;
            if let Some(paths) = v.get_mut("result_paths").and_then(|p| p.as_object_mut()) {
                for value in paths.values_mut() {
                    if let Some(p) = value.as_str() {
                        *value = serde_json::Value::String(
                            self.url_of(Path::new(p)).to_string_lossy().into_owned(),
                        );
                    }
                }
            }
            let text = serde_json::to_string_pretty(&v)
                .map_err(|e| Error::Internal(format!("cannot encode summary: {e}")))?;
            crate::atomic::write_lines(&summary, std::iter::once(text))?;
        }
        rt.block_on(publish_run(
            &self.store,
            &self.run,
            &self.work,
            run_id,
            &self.commit_id,
            uploaded,
        ))
    }
}

/// An error about the local copy `local` of `remote` (a file, or a folder and what is in
/// it), told about `remote` (a problem on line 7 of a downloaded file is `s3://…:7`).
pub fn relocate(e: Error, local: &Path, remote: &Path) -> Error {
    if local == remote {
        return e;
    }
    // The copy itself, or a file inside a copied folder (a fetched run's file is named
    // `s3://…/results/RUN/FILE`: the run and the file, its commit folder left out).
    let swap = |p: PathBuf| match p.strip_prefix(local) {
        Ok(rel) if rel.as_os_str().is_empty() => remote.to_path_buf(),
        Ok(rel) => remote.join(rel),
        Err(_) => p,
    };
    match e {
        Error::Io {
            path,
            action,
            source,
        } => Error::Io {
            path: swap(path),
            action,
            source,
        },
        Error::Input {
            path,
            line,
            field,
            message,
        } => Error::Input {
            path: swap(path),
            line,
            field,
            message,
        },
        Error::Config { path, message } => Error::Config {
            path: swap(path),
            message,
        },
        Error::Invalid { path, count, first } => Error::Invalid {
            path: swap(path),
            count,
            first,
        },
        other => {
            let (l, r) = (local.display().to_string(), remote.display().to_string());
            match other {
                Error::Usage(m) => Error::Usage(m.replace(&l, &r)),
                Error::NotFound(m) => Error::NotFound(m.replace(&l, &r)),
                Error::State(m) => Error::State(m.replace(&l, &r)),
                Error::Query(m) => Error::Query(m.replace(&l, &r)),
                // A reader's error carried through DataFusion (a stream's `file:line`):
                // the same exit status, told about the object.
                other if other.exit_code() == 2 && other.to_string().contains(&l) => {
                    Error::Query(other.to_string().replace(&l, &r))
                }
                other => other,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_parse_and_refuse_what_they_should() {
        let l = Location::parse("s3://bucket-1/results/r1/").unwrap();
        assert_eq!(l.bucket, "bucket-1");
        assert_eq!(l.key.as_ref(), "results/r1");
        assert_eq!(l.to_string(), "s3://bucket-1/results/r1");
        assert_eq!(
            l.child("v/x/a.parquet").to_string(),
            "s3://bucket-1/results/r1/v/x/a.parquet"
        );
        assert_eq!(l.name(), "r1");
        assert_eq!(Location::parse("s3://b").unwrap().to_string(), "s3://b");
        for bad in [
            "s3://",
            "s3:///key",
            "s3://KEY:SECRET@bucket/x",
            "s3://bucket:9000/x",
            "s3://Bucket/x",
            "s3://b/a/../c",
            "s3://b/a//c",
            "s3://b/a?x=1",
            "s3://b/a\nb",
            "http://b/x",
        ] {
            assert!(Location::parse(bad).is_err(), "{bad} was accepted");
        }
        assert!(Location::of(Path::new("results/r1")).unwrap().is_none());
        // Keys as written: not percent-encoded by object_store, and a Hive partition's own
        // escape kept (a second encoding would make Spark read `%2F` as the value).
        let l = Location::parse("s3://b/in/preds~v2 [x].jsonl").unwrap();
        assert_eq!(l.key.as_ref(), "in/preds~v2 [x].jsonl");
        assert_eq!(l.to_string(), "s3://b/in/preds~v2 [x].jsonl");
        let w = Location::parse("s3://b/w").unwrap();
        assert_eq!(
            w.child("case_results/model_name=meta-llama%2FLlama-3/part-r1.parquet")
                .to_string(),
            "s3://b/w/case_results/model_name=meta-llama%2FLlama-3/part-r1.parquet"
        );
        let e = Location::parse("s3://AKIAX:wJalrSecret@b/x")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("wJalrSecret") && !e.contains("AKIAX"), "{e}");
        assert!(is_remote(Path::new("s3://b/x")));
    }

    #[test]
    fn commit_file_names_are_plain() {
        for bad in ["", ".", "..", "a/b", "a\\b", "a\u{7}"] {
            assert!(check_file_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_file_name("case_results.parquet").is_ok());
    }

    #[test]
    fn an_error_about_a_downloaded_copy_names_the_object() {
        let e = Error::Input {
            path: PathBuf::from("/tmp/x/preds.jsonl"),
            line: 7,
            field: Some("case_id".into()),
            message: "missing".into(),
        };
        let e = relocate(
            e,
            Path::new("/tmp/x/preds.jsonl"),
            Path::new("s3://b/in/preds.jsonl"),
        );
        assert_eq!(e.to_string(), "s3://b/in/preds.jsonl:7: case_id: missing");
        let e = Error::config(Path::new("/tmp/x/results/r1/summary.json"), "not JSON");
        let e = relocate(e, Path::new("/tmp/x/results"), Path::new("s3://b/results"));
        assert_eq!(e.to_string(), "s3://b/results/r1/summary.json: not JSON");
        let e = Error::Query("/tmp/x/results/r1/case_results.parquet: damaged".into());
        let e = relocate(e, Path::new("/tmp/x/results"), Path::new("s3://b/results"));
        assert_eq!(
            e.to_string(),
            "s3://b/results/r1/case_results.parquet: damaged"
        );
    }
}
