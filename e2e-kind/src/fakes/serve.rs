//! The one HTTP accept loop of the fakes (the fault proxy, the GCE and ARM fakes): each connection
//! served by hyper in a task of its own, over TLS when an acceptor is given. The connections end
//! with the loop (aborting the fake's task closes them); one ending in error (a client gone, an
//! injected drop) concerns nobody else. Answers may stream (the API fault proxy passes watches
//! through), so the body type is the handler's.

use std::future::Future;

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::{Body, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

/// Serves every connection `listener` accepts with `handler`, until the task is aborted.
pub async fn accept_loop<H, F, B, E>(listener: TcpListener, tls: Option<TlsAcceptor>, handler: H)
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Result<Response<B>, E>> + Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    E: Into<Box<dyn std::error::Error + Send + Sync>> + 'static,
{
    let mut connections = JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let handler = handler.clone();
        let tls = tls.clone();
        connections.spawn(async move {
            let _ = stream.set_nodelay(true);
            let service = service_fn(handler);
            let builder = auto::Builder::new(TokioExecutor::new());
            match tls {
                Some(acceptor) => {
                    if let Ok(tls) = acceptor.accept(stream).await {
                        let _ = builder.serve_connection(TokioIo::new(tls), service).await;
                    }
                }
                None => {
                    let _ = builder
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                }
            }
        });
    }
}
