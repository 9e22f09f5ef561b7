//! A small HTTP/1.1 client for probes and ready checks, over a forwarded unix socket or TCP.
//! Plain HTTP only: requests travel inside the SSH tunnel of a node.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

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
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// At most this much of a body is read: probes look at answers, not downloads.
const MAX_BODY: usize = 16 * 1024 * 1024;

/// `http://host:port/path` → (host, port, path).
pub fn parse_url(url: &str) -> Result<(String, u16, String), String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{url:?} is not an http:// URL"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => (
            h.trim_matches(['[', ']']).to_string(),
            p.parse().map_err(|_| format!("bad port in {url:?}"))?,
        ),
        _ => (authority.to_string(), 80),
    };
    if host.is_empty() {
        return Err(format!("no host in {url:?}"));
    }
    Ok((host, port, path.to_string()))
}

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
    tokio::time::timeout(req.timeout, work)
        .await
        .map_err(|_| format!("no answer within {} s", req.timeout.as_secs()))?
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    req: &Request,
) -> Result<Response, String> {
    let (host, port, path) = parse_url(&req.url)?;
    let mut head = format!(
        "{} {} HTTP/1.1\r\nHost: {}:{}\r\nConnection: close\r\nUser-Agent: sparkform\r\n",
        req.method, path, host, port
    );
    for (k, v) in &req.headers {
        if k.contains(['\r', '\n']) || v.contains(['\r', '\n']) {
            return Err(format!("header {k:?} contains a line break"));
        }
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(b) = &req.body {
        head.push_str(&format!("Content-Length: {}\r\n", b.len()));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes())
        .await
        .map_err(|e| format!("cannot send the request: {e}"))?;
    if let Some(b) = &req.body {
        s.write_all(b)
            .await
            .map_err(|e| format!("cannot send the body: {e}"))?;
    }
    s.flush().await.map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 16384];
    loop {
        let n = s
            .read(&mut buf)
            .await
            .map_err(|e| format!("reading the answer: {e}"))?;
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
        if raw.len() > MAX_BODY {
            break;
        }
    }
    parse_response(&raw)
}

pub fn parse_response(raw: &[u8]) -> Result<Response, String> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("the answer is not HTTP (no header end)")?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("the answer is not HTTP: {status_line:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    if headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked"))
    {
        body = dechunk(&body)?;
    } else if let Some(len) = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse::<usize>().ok())
    {
        body.truncate(len);
    }
    Ok(Response {
        status,
        headers,
        body,
    })
}

fn dechunk(mut data: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let line_end = data
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("a chunked body ends early")?;
        let size_text = String::from_utf8_lossy(&data[..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| format!("bad chunk size {size_text:?}"))?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        if data.len() < size {
            return Err("a chunked body ends early".into());
        }
        out.extend_from_slice(&data[..size]);
        data = data.get(size + 2..).unwrap_or(&[]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(parse_url("https://x").is_err());
    }

    #[test]
    fn responses() {
        let r = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA").unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"ok"[..]));
        let c = parse_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n").unwrap();
        assert_eq!(c.body, b"abcde");
        assert!(parse_response(b"garbage").is_err());
    }

    #[tokio::test]
    async fn round_trip_over_tcp() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let n = s.read(&mut buf).await.unwrap();
            let req = String::from_utf8_lossy(&buf[..n]).to_string();
            let body = if req.starts_with("POST /v1 ") && req.ends_with("{\"a\":1}") {
                "yes"
            } else {
                "no"
            };
            let _ = s
                .write_all(
                    format!(
                        "HTTP/1.1 201 Created\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                )
                .await;
        });
        let r = send(
            &Endpoint::Tcp("127.0.0.1".into(), port),
            &Request {
                method: "POST".into(),
                url: format!("http://127.0.0.1:{port}/v1"),
                headers: vec![("Content-Type".into(), "application/json".into())],
                body: Some(b"{\"a\":1}".to_vec()),
                timeout: Duration::from_secs(5),
            },
        )
        .await
        .unwrap();
        assert_eq!((r.status, r.body.as_slice()), (201, &b"yes"[..]));
    }
}
