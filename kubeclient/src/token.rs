//! A kubeconfig's `tokenFile`, read again whenever the file changes.
//!
//! kube-rs reads it once a minute (client-go too): a sidecar that rotates the token and has the
//! old one revoked at once (a hosted control plane's token minter, a TokenRequest bound to an
//! object that is deleted) would leave up to a minute of refused requests. A `stat` per request
//! is cheap next to the request itself, so the file is read when its identity, size or time
//! changes, and at least once a minute in case a rewrite kept all three.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use http::{HeaderValue, Request, header::AUTHORIZATION};
use std::task::{Context, Poll};

use tower::{Layer, Service};

/// Read the file again after this long even when it looks unchanged.
const REREAD_AFTER: Duration = Duration::from_secs(60);

/// What identifies one version of the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    device: u64,
    inode: u64,
    len: u64,
    modified: Option<SystemTime>,
}

impl Stamp {
    fn of(metadata: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt as _;
        Self {
            device: metadata.dev(),
            inode: metadata.ino(),
            len: metadata.len(),
            modified: metadata.modified().ok(),
        }
    }
}

#[derive(Debug, Default)]
struct Cached {
    stamp: Option<Stamp>,
    read_at: Option<Instant>,
    header: Option<HeaderValue>,
}

/// The token file and the `Authorization` value last read from it.
#[derive(Debug)]
pub(crate) struct TokenFile {
    path: PathBuf,
    cached: Mutex<Cached>,
}

impl TokenFile {
    pub(crate) fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            cached: Mutex::default(),
        }
    }

    /// The current `Bearer` value: the file's content when it changed, else the last one read.
    /// A file that vanished or is empty for a moment (a rotation that writes in place) leaves the
    /// last token in use, as kube-rs and client-go do.
    pub(crate) fn header(&self) -> Option<HeaderValue> {
        let mut cached = self.cached.lock().unwrap_or_else(PoisonError::into_inner);
        let stamp = std::fs::metadata(&self.path).ok().map(|m| Stamp::of(&m));
        let stale = cached.read_at.is_none_or(|at| at.elapsed() >= REREAD_AFTER);
        if stamp.is_some() && (stamp != cached.stamp || stale) {
            let read = std::fs::read_to_string(&self.path)
                .ok()
                .map(|token| token.trim().to_owned())
                .filter(|token| !token.is_empty())
                .and_then(|token| HeaderValue::from_str(&format!("Bearer {token}")).ok());
            if let Some(mut header) = read {
                header.set_sensitive(true);
                if cached.header.is_some() && cached.header.as_ref() != Some(&header) {
                    tracing::info!(path = %self.path.display(), "the token file changed: using the new token");
                }
                cached.header = Some(header);
                cached.stamp = stamp;
                cached.read_at = Some(Instant::now());
            }
        }
        cached.header.clone()
    }
}

/// Adds [`WithToken`].
#[derive(Clone, Debug)]
pub(crate) struct TokenFileLayer(Arc<TokenFile>);

impl TokenFileLayer {
    pub(crate) fn new(path: String) -> Self {
        Self(Arc::new(TokenFile::new(path)))
    }
}

impl<S> Layer<S> for TokenFileLayer {
    type Service = WithToken<S>;

    fn layer(&self, inner: S) -> Self::Service {
        WithToken {
            inner,
            token: Arc::clone(&self.0),
        }
    }
}

/// Sets `Authorization` from a [`TokenFile`] on every request.
#[derive(Clone, Debug)]
pub(crate) struct WithToken<S> {
    inner: S,
    token: Arc<TokenFile>,
}

impl<S, B> Service<Request<B>> for WithToken<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> S::Future {
        if let Some(header) = self.token.header() {
            request.headers_mut().insert(AUTHORIZATION, header);
        }
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn rename_into(path: &std::path::Path, content: &str) {
        let tmp = path.with_extension("new");
        std::fs::write(&tmp, content).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    #[test]
    fn a_rotated_token_is_used_from_the_next_request_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        let file = TokenFile::new(&path);
        assert_eq!(file.header(), None, "no file yet");
        std::fs::write(&path, "old\n").unwrap();
        assert_eq!(file.header().unwrap(), "Bearer old");
        rename_into(&path, "new");
        assert_eq!(file.header().unwrap(), "Bearer new");
        // Rewritten in place with the same length: a new modification time.
        std::thread::sleep(Duration::from_millis(20));
        std::fs::write(&path, "neu").unwrap();
        assert_eq!(file.header().unwrap(), "Bearer neu");
        // Emptied mid-write, then gone: the last token stays.
        std::fs::write(&path, "").unwrap();
        assert_eq!(file.header().unwrap(), "Bearer neu");
        std::fs::remove_file(&path).unwrap();
        assert_eq!(file.header().unwrap(), "Bearer neu");
    }
}
