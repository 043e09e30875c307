//! The deadline of every request but a watch, over its whole exchange: the response's head and
//! its body. tower's `Timeout` covers only the head, and a list whose body stops halfway on a
//! dead connection would otherwise wait for the pings alone.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt as _;
use tokio::time::{Instant, Sleep};
use tower::{BoxError, Layer, Service};

/// A request ran past its deadline.
#[derive(Debug, thiserror::Error)]
#[error("no complete answer from kube-apiserver within {0:?} (--api-request-timeout)")]
pub struct TimedOut(pub Duration);

/// Whether `uri` opens a watch (`?watch=true`, `?watch=1`): a long poll, never cut by a deadline.
pub(crate) fn is_watch(uri: &http::Uri) -> bool {
    uri.query().is_some_and(|query| {
        query
            .split('&')
            .any(|pair| matches!(pair, "watch=true" | "watch=1"))
    })
}

/// Adds [`RequestTimeout`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct RequestTimeoutLayer {
    timeout: Duration,
}

impl RequestTimeoutLayer {
    pub(crate) fn new(timeout: Duration) -> Self {
        Self { timeout }
    }
}

impl<S> Layer<S> for RequestTimeoutLayer {
    type Service = RequestTimeout<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequestTimeout {
            inner,
            timeout: self.timeout,
        }
    }
}

/// Fails a request other than a watch whose response has not fully arrived within the timeout.
#[derive(Clone, Debug)]
pub(crate) struct RequestTimeout<S> {
    inner: S,
    timeout: Duration,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RequestTimeout<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let deadline =
            (!is_watch(request.uri())).then(|| (Instant::now() + self.timeout, self.timeout));
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = match deadline {
                Some((at, timeout)) => tokio::time::timeout_at(at, response)
                    .await
                    .map_err(|_| TimedOut(timeout))?,
                None => response.await,
            }
            .map_err(Into::into)?;
            Ok(response.map(|body| ResponseBody::new(body, deadline)))
        })
    }
}

/// A response body that fails once the request's deadline passes.
pub struct ResponseBody {
    inner: Pin<Box<dyn Body<Data = Bytes, Error = BoxError> + Send>>,
    deadline: Option<(Pin<Box<Sleep>>, Duration)>,
}

impl ResponseBody {
    fn new<B>(body: B, deadline: Option<(Instant, Duration)>) -> Self
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        Self {
            inner: Box::pin(body.map_err(Into::into)),
            deadline: deadline
                .map(|(at, timeout)| (Box::pin(tokio::time::sleep_until(at)), timeout)),
        }
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Some((sleep, timeout)) = &mut this.deadline
            && sleep.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(Some(Err(TimedOut(*timeout).into())));
        }
        this.inner.as_mut().poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use tower::ServiceExt as _;

    #[test]
    fn only_watches_are_long_polls() {
        let uri = |s: &str| s.parse::<http::Uri>().unwrap();
        assert!(is_watch(&uri("/api/v1/nodes?watch=true&resourceVersion=1")));
        assert!(is_watch(&uri(
            "/api/v1/nodes?allowWatchBookmarks=true&watch=1"
        )));
        assert!(!is_watch(&uri("/api/v1/nodes?limit=500")));
        assert!(!is_watch(&uri("/api/v1/nodes?watch=false")));
        assert!(!is_watch(&uri("/api/v1/nodes")));
    }

    /// A body that never yields a frame, as one on a connection that stopped answering.
    struct Stalled;

    impl Body for Stalled {
        type Data = Bytes;
        type Error = BoxError;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            Poll::Pending
        }
    }

    /// A service whose answers' heads arrive at once and whose bodies stall.
    fn stalling() -> impl Service<
        Request<()>,
        Response = Response<Stalled>,
        Error = BoxError,
        Future = std::future::Ready<Result<Response<Stalled>, BoxError>>,
    > + Clone {
        tower::service_fn(|_: Request<()>| std::future::ready(Ok(Response::new(Stalled))))
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stops_fails_at_the_deadline_but_a_watch_does_not() {
        let service = RequestTimeoutLayer::new(Duration::from_secs(30)).layer(stalling());
        let list = Request::get("/api/v1/nodes").body(()).unwrap();
        let body = service.clone().oneshot(list).await.unwrap().into_body();
        let err = body.collect().await.err().unwrap();
        assert!(err.is::<TimedOut>(), "{err}");
        let watch = Request::get("/api/v1/nodes?watch=true").body(()).unwrap();
        let body = service.oneshot(watch).await.unwrap().into_body();
        let waited = tokio::time::timeout(Duration::from_secs(3600), body.collect()).await;
        assert!(waited.is_err(), "the watch's body was cut");
    }
}
