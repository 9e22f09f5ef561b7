//! The HTTP/1.1 client of probes and ready checks, over a forwarded unix socket or TCP: hyper's
//! client connection, so request and header validation, response framing (chunked bodies,
//! content length) and keep-alive come from a well-kept library. Plain HTTP only: requests
//! travel inside the SSH tunnel of a node.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::header::{HeaderName, HeaderValue, HOST, USER_AGENT};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::hosts::Endpoint;

#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    /// Host header and path come from the URL.
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: Option<Vec<u8>>,
    pub timeout: Duration,
}

#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    /// Names in lower case, values as sent (not UTF-8 bytes replaced).
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// At most this much of a body is read: probes look at answers, not downloads.
const MAX_BODY: usize = 16 * 1024 * 1024;

/// A URL as messages show it: bounded, control characters escaped.
fn shown(url: &str) -> String {
    crate::diag::clip(url, 120)
}

// Pure, so that `validate` refuses the URLs a request would refuse.
pub use crate::schema::parse_url;

pub async fn send(endpoint: &Endpoint, req: &Request) -> Result<Response, String> {
    let work = async {
        match endpoint {
            Endpoint::Unix(p) => {
                let s = tokio::net::UnixStream::connect(p)
                    .await
                    .map_err(|e| format!("cannot connect through the tunnel: {e}"))?;
                exchange(s, req).await
            }
            Endpoint::Tcp(h, port) => {
                let s = tokio::net::TcpStream::connect((h.as_str(), *port))
                    .await
                    .map_err(|e| format!("cannot connect to {h}:{port}: {e}"))?;
                exchange(s, req).await
            }
        }
    };
    let started = std::time::Instant::now();
    let result = tokio::time::timeout(req.timeout, work)
        .await
        .map_err(|_| format!("no answer within {} s", req.timeout.as_secs()))
        .and_then(|r| r);
    tracing::debug!(
        target: "sparkform::http",
        method = %req.method,
        url = %req.url,
        through = %endpoint,
        status = result.as_ref().map_or(0, |r| r.status),
        error = result.as_ref().err().map_or("", |e| e.as_str()),
        ms = started.elapsed().as_millis() as u64,
        "HTTP request"
    );
    result
}

/// The hyper request for `req`; every part is validated by the `http` crate's types.
fn build(req: &Request) -> Result<hyper::Request<Full<Bytes>>, String> {
    let (host, port, path) = parse_url(&req.url)?;
    let method = hyper::Method::from_bytes(req.method.as_bytes())
        .map_err(|_| format!("\"{}\" is not an HTTP method", shown(&req.method)))?;
    let uri: hyper::Uri = path
        .parse()
        .map_err(|e| format!("bad path in \"{}\": {e}", shown(&req.url)))?;
    let authority = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let mut r = hyper::Request::builder()
        .method(method)
        .uri(uri)
        .header(
            HOST,
            HeaderValue::from_str(&authority)
                .map_err(|_| format!("bad host in \"{}\"", shown(&req.url)))?,
        )
        .header(USER_AGENT, HeaderValue::from_static("sparkform"));
    for (k, v) in &req.headers {
        let name = HeaderName::from_bytes(k.as_bytes())
            .map_err(|_| format!("\"{}\" is not a valid header name", shown(k)))?;
        // `HeaderValue` refuses CR, LF and other control bytes (a tab is allowed).
        let value = HeaderValue::from_str(v).map_err(|_| {
            format!(
                "the value of header \"{}\" contains a control character",
                shown(k)
            )
        })?;
        r = r.header(name, value);
    }
    let body = Full::new(Bytes::from(req.body.clone().unwrap_or_default()));
    r.body(body).map_err(|e| format!("invalid request: {e}"))
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    s: S,
    req: &Request,
) -> Result<Response, String> {
    let request = build(req)?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(s))
        .await
        .map_err(|e| format!("cannot start the HTTP exchange: {e}"))?;
    let work = async {
        let resp = sender
            .send_request(request)
            .await
            .map_err(|e| format!("the request failed: {e}"))?;
        let (parts, mut body) = resp.into_parts();
        let mut data = Vec::new();
        while data.len() < MAX_BODY {
            let Some(frame) = body.frame().await else {
                break;
            };
            let frame = frame.map_err(|e| format!("reading the answer: {e}"))?;
            if let Ok(chunk) = frame.into_data() {
                data.extend_from_slice(&chunk);
            }
        }
        data.truncate(MAX_BODY);
        let headers = parts
            .headers
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).trim().to_string(),
                )
            })
            .collect();
        Ok(Response {
            status: parts.status.as_u16(),
            headers,
            body: data,
        })
    };
    // The connection is driven here, not spawned, so it ends with the exchange (the stream is
    // dropped on return, keep-alive or not).
    let mut conn = std::pin::pin!(conn);
    let mut work = std::pin::pin!(work);
    tokio::select! {
        r = &mut work => r,
        c = &mut conn => match c {
            Ok(()) => work.await,
            Err(e) => Err(format!("the HTTP connection failed: {e}")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn urls() {
        assert_eq!(
            parse_url("http://127.0.0.1:8000/health").unwrap(),
            ("127.0.0.1".into(), 8000, "/health".into())
        );
        assert_eq!(
            parse_url("http://node").unwrap(),
            ("node".into(), 80, "/".into())
        );
        assert_eq!(
            parse_url("http://[::1]:81?q=1").unwrap(),
            ("::1".into(), 81, "/?q=1".into())
        );
        assert!(parse_url("https://x").is_err());
        assert!(parse_url("http://x:0/").is_err());
        assert!(parse_url("http://x:99999/").is_err());
    }

    #[test]
    fn control_characters_are_refused_in_urls_methods_and_headers() {
        let base = Request {
            method: "GET".into(),
            url: "http://127.0.0.1:8000/v1".into(),
            headers: vec![],
            body: None,
            timeout: Duration::from_secs(1),
        };
        for url in [
            "http://127.0.0.1:8000/v1\r\nX-Injected: 1",
            "http://127.0.0.1:8000/v1 HTTP/1.0",
            "http://127.0.0.1:8000/\u{1b}[31m",
        ] {
            let e = build(&Request {
                url: url.into(),
                ..base.clone()
            })
            .unwrap_err();
            assert!(e.contains("control character or a space"), "{e}");
            assert!(!e.contains('\r') && !e.contains('\u{1b}'), "{e:?}");
        }
        let e = build(&Request {
            method: "GET /x HTTP/1.1\r\n".into(),
            ..base.clone()
        })
        .unwrap_err();
        assert!(e.contains("not an HTTP method"), "{e}");
        let e = build(&Request {
            headers: vec![("X-A".into(), "v\r\nX-Injected: 1".into())],
            ..base.clone()
        })
        .unwrap_err();
        assert!(
            e.contains("header \"X-A\" contains a control character"),
            "{e}"
        );
        let e = build(&Request {
            headers: vec![("X A\r\n".into(), "v".into())],
            ..base.clone()
        })
        .unwrap_err();
        assert!(e.contains("not a valid header name"), "{e}");
        assert!(build(&base).is_ok());
    }

    /// A one-connection server that reads one request and writes `answer`, keeping the
    /// connection open afterwards (as a keep-alive server does). Returns the port and the
    /// request it saw.
    async fn serve(
        answer: &'static [u8],
    ) -> (
        u16,
        tokio::task::JoinHandle<()>,
        tokio::sync::oneshot::Receiver<Vec<u8>>,
    ) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            let mut buf = vec![0u8; 4096];
            // Until the end of the head and a body of the length it announces.
            loop {
                let n = s.read(&mut buf).await.unwrap_or(0);
                if n == 0 {
                    break;
                }
                seen.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&seen).to_string();
                if let Some(end) = text.find("\r\n\r\n") {
                    let len = text
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length: ")
                                .map(str::to_string)
                        })
                        .and_then(|v| v.trim().parse::<usize>().ok())
                        .unwrap_or(0);
                    if seen.len() >= end + 4 + len {
                        break;
                    }
                }
            }
            let _ = s.write_all(answer).await;
            let _ = tx.send(seen);
            // Keep the connection open a while: the client must not wait for it to close.
            tokio::time::sleep(Duration::from_secs(5)).await;
        });
        (port, task, rx)
    }

    #[tokio::test]
    async fn round_trip_with_a_body_over_tcp() {
        let (port, task, seen) =
            serve(b"HTTP/1.1 201 Created\r\nContent-Length: 3\r\nX-Y:  z \r\n\r\nyes").await;
        let r = send(
            &Endpoint::Tcp("127.0.0.1".into(), port),
            &Request {
                method: "POST".into(),
                url: format!("http://127.0.0.1:{port}/v1"),
                headers: vec![("Content-Type".into(), "application/json".into())],
                body: Some(b"{\"a\":1}".to_vec()),
                timeout: Duration::from_secs(3),
            },
        )
        .await
        .unwrap();
        assert_eq!((r.status, r.body.as_slice()), (201, &b"yes"[..]));
        assert!(
            r.headers.contains(&("x-y".into(), "z".into())),
            "{:?}",
            r.headers
        );
        task.abort();
        let seen = String::from_utf8_lossy(&seen.await.unwrap_or_default()).to_string();
        assert!(seen.starts_with("POST /v1 HTTP/1.1\r\n"), "{seen}");
        let lower = seen.to_ascii_lowercase();
        assert!(
            lower.contains(&format!("host: 127.0.0.1:{port}\r\n")),
            "{seen}"
        );
        assert!(
            lower.contains("content-length: 7\r\n") && seen.ends_with("{\"a\":1}"),
            "{seen}"
        );
    }

    #[tokio::test]
    async fn chunked_answers_are_decoded() {
        let (port, task, _) = serve(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        )
        .await;
        let r = send(
            &Endpoint::Tcp("127.0.0.1".into(), port),
            &Request {
                method: "GET".into(),
                url: format!("http://127.0.0.1:{port}/"),
                headers: vec![],
                body: None,
                timeout: Duration::from_secs(3),
            },
        )
        .await
        .unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"abcde"[..]));
        task.abort();
    }

    #[tokio::test]
    async fn a_garbage_answer_is_an_error() {
        let (port, task, _) = serve(b"garbage\r\n\r\n").await;
        let e = send(
            &Endpoint::Tcp("127.0.0.1".into(), port),
            &Request {
                method: "GET".into(),
                url: format!("http://127.0.0.1:{port}/"),
                headers: vec![],
                body: None,
                timeout: Duration::from_secs(3),
            },
        )
        .await
        .unwrap_err();
        assert!(e.contains("failed"), "{e}");
        task.abort();
    }
}
