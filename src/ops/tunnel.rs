//! Tunnel: a deployment's endpoint on a local port, through the node's master connection.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::hosts::{Endpoint, Host, HostOptions, HostPool};
use crate::kind::{Reaches, Registered};

/// What a tunnel reaches: a URL as a node sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TunnelTarget {
    /// What it was found from (`output.endpoint`, `probe.hello`).
    pub from: String,
    /// The node it goes through (`node.spark1`).
    pub node: String,
    pub url: String,
    pub host: String,
    pub port: u16,
    /// Path and query of the URL (`/v1/chat/completions`).
    pub path: String,
    /// The `Authorization` header the definitions' probes send to this endpoint (its API key),
    /// for `--exec`'s command: sensitive, passed in its environment only.
    pub authorization: Option<String>,
}

/// An output or probe by name, or the deployment's only HTTP endpoint when `what` is `None`.
pub fn resolve(config: &Config, what: Option<&str>) -> Result<TunnelTarget, String> {
    let mut t = resolve_url(config, what)?;
    t.authorization = authorization_for(config, &t);
    Ok(t)
}

/// The `Authorization` header of an http probe of the definitions that goes to `t`'s host
/// and port.
fn authorization_for(config: &Config, t: &TunnelTarget) -> Option<String> {
    let base = format!("http://{}:{}", t.host, t.port);
    reached(config)
        .filter(|(_, r)| r.url == base || r.url.starts_with(&format!("{base}/")))
        .find_map(|(_, r)| r.authorization)
}

/// The HTTP endpoints the definitions' resources reach (their probes'), by address.
fn reached(config: &Config) -> impl Iterator<Item = (&str, Reaches)> {
    config.resources.iter().filter_map(|r| {
        Some((
            r.address.as_str(),
            r.kind.kind().placement(&r.config).reaches?,
        ))
    })
}

fn resolve_url(config: &Config, what: Option<&str>) -> Result<TunnelTarget, String> {
    let url_outputs: Vec<(&str, &str)> = config
        .outputs
        .iter()
        .filter(|o| !o.sensitive)
        .filter_map(|o| Some((o.name.as_str(), o.value.as_str()?)))
        .filter(|(_, v)| v.starts_with("http://"))
        .collect();
    let probes: Vec<(&str, String, String)> =
        reached(config).map(|(a, r)| (a, r.via, r.url)).collect();
    let candidates = || {
        let mut c: Vec<String> = url_outputs
            .iter()
            .map(|(n, _)| format!("output {n}"))
            .collect();
        c.extend(probes.iter().map(|(a, _, _)| a.to_string()));
        if c.is_empty() {
            "the definitions have no output that is an http:// URL and no http probe".to_string()
        } else {
            format!("choose one of: {}", c.join(", "))
        }
    };
    let from_output = |name: &str, url: &str| -> Result<TunnelTarget, String> {
        let node = node_for_url(config, url, &probes).ok_or_else(|| {
            format!(
                "output {name} ({url}): no node of the definitions has this address, and no \
                 probe goes to it\n  help: name a probe whose `via` node reaches it"
            )
        })?;
        target(format!("output.{name}"), node, url)
    };
    match what {
        Some(w) => {
            let name = w.strip_prefix("output.").unwrap_or(w);
            if let Some((n, url)) = url_outputs.iter().find(|(n, _)| *n == name) {
                return from_output(n, url);
            }
            if let Some((a, via, url)) = probes.iter().find(|(a, _, _)| *a == w) {
                return target(a.to_string(), via.to_string(), url);
            }
            Err(format!(
                "{w}: no output that is an http:// URL and no http probe has this name\n  help: {}",
                candidates()
            ))
        }
        None => match (url_outputs.as_slice(), probes.as_slice()) {
            ([(n, url)], _) => from_output(n, url),
            ([], [(a, via, url)]) => target(a.to_string(), via.to_string(), url),
            _ => Err(format!(
                "which endpoint? name an output or a probe\n  help: {}",
                candidates()
            )),
        },
    }
}

fn target(from: String, node: String, url: &str) -> Result<TunnelTarget, String> {
    let (host, port, path) = crate::http::parse_url(url).map_err(|e| format!("{from}: {e}"))?;
    Ok(TunnelTarget {
        from,
        node,
        url: url.to_string(),
        host,
        port,
        path,
        authorization: None,
    })
}

/// The node an output's URL is reached through: a probe's `via` for the same URL, the node
/// with a fabric address equal to the URL's host, or the node of that host name.
fn node_for_url(config: &Config, url: &str, probes: &[(&str, String, String)]) -> Option<String> {
    if let Some((_, via, _)) = probes.iter().find(|(_, _, u)| u.starts_with(url)) {
        return Some(via.to_string());
    }
    let (host, _, _) = crate::http::parse_url(url).ok()?;
    config
        .resources
        .iter()
        .find(|r| r.kind.kind().placement(&r.config).node_address.as_deref() == Some(host.as_str()))
        .and_then(|r| r.node.clone())
        .or_else(|| {
            config
                .nodes
                .values()
                .find(|n| n.host == host)
                .map(|n| n.address.clone())
        })
}

/// `[BIND:]PORT` → the local address; a non-loopback bind only with `allow_remote`.
pub fn bind_address(
    spec: Option<&str>,
    default_port: u16,
    allow_remote: bool,
) -> Result<SocketAddr, String> {
    let (ip, port) = match spec {
        None => ("127.0.0.1", default_port.to_string()),
        Some(s) => match s.rsplit_once(':') {
            Some((b, p)) => (b.trim_matches(['[', ']']), p.to_string()),
            None => ("127.0.0.1", s.to_string()),
        },
    };
    let ip: IpAddr = if ip == "localhost" {
        IpAddr::from([127, 0, 0, 1])
    } else {
        ip.parse().map_err(|_| {
            format!(
                "-L {}: {ip:?} is not an IP address",
                spec.unwrap_or_default()
            )
        })?
    };
    let port: u16 = port
        .parse()
        .map_err(|_| format!("-L {}: {port:?} is not a port", spec.unwrap_or_default()))?;
    if !ip.is_loopback() && !allow_remote {
        return Err(format!(
            "-L {}: {ip} is reachable from other machines, and so would the endpoint be\n  help: \
             add --allow-remote-bind if that is what you want",
            spec.unwrap_or_default()
        ));
    }
    Ok(SocketAddr::new(ip, port))
}

/// What follows the authority in a URL, as written: `http://h:1` → ``, `http://h:1/x` → `/x`.
fn path_as_written(url: &str) -> &str {
    let rest = url.strip_prefix("http://").unwrap_or(url);
    rest.find(['/', '?']).map_or("", |i| &rest[i..])
}

/// An open tunnel: a local listener in front of a node's forward.
pub struct Tunnel {
    listener: TcpListener,
    endpoint: Endpoint,
    pub local: SocketAddr,
    pub url: String,
}

impl Tunnel {
    /// Forward the target through `host` and listen on `bind`. When no port was asked for and
    /// the remote port is taken here, any free port.
    pub async fn open(
        host: &dyn Host,
        target: &TunnelTarget,
        bind: SocketAddr,
        port_given: bool,
    ) -> Result<Tunnel, String> {
        let endpoint = host
            .forward(&target.host, target.port)
            .await
            .map_err(|e| e.to_string())?;
        let listener = match TcpListener::bind(bind).await {
            Ok(l) => l,
            Err(_) if !port_given => TcpListener::bind(SocketAddr::new(bind.ip(), 0))
                .await
                .map_err(|e| format!("cannot listen on {}: {e}", bind.ip()))?,
            Err(e) => return Err(format!("cannot listen on {bind}: {e}")),
        };
        let local = listener.local_addr().map_err(|e| e.to_string())?;
        let url = format!("http://{local}{}", path_as_written(&target.url));
        Ok(Tunnel {
            listener,
            endpoint,
            local,
            url,
        })
    }

    /// Serve connections until `cancel`; say on `notes` when the remote side stops answering
    /// (checked every `every`, and on each connection that fails) and when it answers again.
    pub async fn serve(
        self,
        every: Duration,
        notes: mpsc::UnboundedSender<String>,
        cancel: CancellationToken,
    ) {
        let (down_tx, mut down_rx) = mpsc::unbounded_channel::<Result<(), String>>();
        let mut conns = tokio::task::JoinSet::new();
        let mut tick = tokio::time::interval(every);
        let mut down: Option<String> = None;
        let report = |r: Result<(), String>, down: &mut Option<String>| match (r, &*down) {
            (Err(e), None) => {
                let _ = notes.send(format!("the remote side stopped answering: {e}"));
                *down = Some(e);
            }
            (Ok(()), Some(_)) => {
                let _ = notes.send("the remote side answers again".to_string());
                *down = None;
            }
            _ => {}
        };
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                accepted = self.listener.accept() => {
                    let Ok((client, _)) = accepted else { continue };
                    let ep = self.endpoint.clone();
                    let tx = down_tx.clone();
                    conns.spawn(async move {
                        let _ = tx.send(relay(client, &ep).await);
                    });
                }
                _ = tick.tick() => {
                    let ep = self.endpoint.clone();
                    let tx = down_tx.clone();
                    conns.spawn(async move {
                        let _ = tx.send(ep.answers().await);
                    });
                }
                Some(r) = down_rx.recv() => report(r, &mut down),
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        }
        conns.shutdown().await;
    }
}

/// Carry one local connection to the node's side; Err when the remote end refused it (the
/// forward closed it before a byte came back).
async fn relay(mut client: tokio::net::TcpStream, ep: &Endpoint) -> Result<(), String> {
    let result = match ep {
        Endpoint::Unix(p) => {
            let mut remote = tokio::net::UnixStream::connect(p)
                .await
                .map_err(|e| format!("the forward is gone: {e}"))?;
            tokio::io::copy_bidirectional(&mut client, &mut remote).await
        }
        Endpoint::Tcp(h, port) => {
            let mut remote = tokio::net::TcpStream::connect((h.as_str(), *port))
                .await
                .map_err(|e| format!("{h}:{port}: {e}"))?;
            tokio::io::copy_bidirectional(&mut client, &mut remote).await
        }
    };
    match result {
        Ok((sent, 0)) if sent > 0 => Err("the connection closed without an answer".into()),
        Ok(_) => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

/// What `sparkform tunnel` is asked: which endpoint, where to listen, and what to do with it.
pub struct TunnelRequest<'a> {
    pub config: &'a Config,
    /// An output's name or a probe's address; `None`: the only http:// output.
    pub endpoint: Option<&'a str>,
    /// `-L [BIND:]PORT`.
    pub local: Option<&'a str>,
    pub allow_remote_bind: bool,
    pub hosts: HostOptions,
    /// `--exec`: a command run against the tunnel (`sh -c`, `{url}` replaced), after which it
    /// closes; `None`: open until Ctrl-C.
    pub exec: Option<&'a str>,
}

/// How a tunnel ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TunnelEnd {
    /// Closed at Ctrl-C, as asked.
    Closed,
    /// The `--exec` command exited with this code.
    CommandExited(i32),
    /// Ctrl-C while the `--exec` command ran (it was killed).
    Interrupted,
}

/// `sparkform tunnel`: resolve the endpoint, connect to its node, listen locally, tell
/// `opened` (the target and the local URL), then serve until Ctrl-C or until the `--exec`
/// command ends; what the tunnel notices on the way (the remote side stopped answering)
/// goes to `notes`. Nothing it started outlives it: the command is killed with it.
pub async fn tunnel(
    req: TunnelRequest<'_>,
    opened: impl FnOnce(&TunnelTarget, &str),
    notes: mpsc::UnboundedSender<String>,
) -> Result<TunnelEnd, String> {
    let target = resolve(req.config, req.endpoint)?;
    let bind = bind_address(req.local, target.port, req.allow_remote_bind)?;
    let pool = connect(req.config, &target, &req.hosts).await;
    let end = match pool.get(&target.node) {
        Err(e) => Err(e.to_string()),
        Ok(host) => match Tunnel::open(host.as_ref(), &target, bind, req.local.is_some()).await {
            Err(e) => Err(format!("{}: {e}", target.from)),
            Ok(tunnel) => {
                let url = tunnel.url.clone();
                let cancel = CancellationToken::new();
                let serving =
                    tokio::spawn(tunnel.serve(Duration::from_secs(5), notes, cancel.clone()));
                opened(&target, &url);
                let end = match req.exec {
                    None => {
                        let _ = tokio::signal::ctrl_c().await;
                        Ok(TunnelEnd::Closed)
                    }
                    Some(cmd) => run_against(cmd, &url, target.authorization.as_deref()).await,
                };
                cancel.cancel();
                let _ = serving.await;
                end
            }
        },
    };
    pool.close().await;
    end
}

/// The command line for `--exec`: `{url}` replaced by the local URL.
pub fn exec_script(cmd: &str, url: &str) -> String {
    cmd.replace("{url}", url)
}

/// Run `cmd` through `sh -c` against the tunnel at `url` until it exits or Ctrl-C (which kills
/// it). The endpoint's key, when its probes send one, is in its environment only, never in an
/// argument another user could read.
async fn run_against(
    cmd: &str,
    url: &str,
    authorization: Option<&str>,
) -> Result<TunnelEnd, String> {
    let mut command = tokio::process::Command::new("sh");
    if let Some(auth) = authorization {
        command.env("SPARKFORM_TUNNEL_AUTHORIZATION", auth);
        if let Some(key) = auth.strip_prefix("Bearer ") {
            command.env("OPENAI_API_KEY", key);
        }
    }
    let child = command
        .arg("-c")
        .arg(exec_script(cmd, url))
        .env("SPARKFORM_TUNNEL_URL", url)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .status();
    tokio::select! {
        st = child => match st {
            Ok(st) => Ok(TunnelEnd::CommandExited(st.code().unwrap_or(1))),
            Err(e) => Err(format!("cannot run sh -c: {e}")),
        },
        _ = tokio::signal::ctrl_c() => Ok(TunnelEnd::Interrupted),
    }
}

/// The target's node connected for a tunnel (close the pool when the tunnel is done).
pub async fn connect(config: &Config, target: &TunnelTarget, opts: &HostOptions) -> HostPool {
    HostPool::connect(config, std::slice::from_ref(&target.node), opts).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_substitutes_the_url() {
        assert_eq!(
            exec_script("curl -s {url} && echo {url}", "http://127.0.0.1:5/x"),
            "curl -s http://127.0.0.1:5/x && echo http://127.0.0.1:5/x"
        );
    }

    fn config() -> Config {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("main.hcl"),
            r#"
node "a" { address = "sf-a" }
node "b" { address = "sf-b" }
network "fab" {
  subnet = "10.9.0.0/24"
  attach "a" {
    node      = node.a
    interface = "eth1"
    address   = "10.9.0.1"
  }
  attach "b" {
    node      = node.b
    interface = "eth1"
    address   = "10.9.0.2"
  }
}
probe "hello" {
  http {
    via = node.b
    url = "http://127.0.0.1:8000/v1/models"
  }
}
output "endpoint" { value = "http://10.9.0.1:30000" }
output "other" { value = "not a url" }
"#,
        )
        .unwrap();
        let ws = crate::workspace::Workspace::new(dir.path(), None);
        ws.load(&Default::default()).unwrap().0
    }

    #[test]
    fn an_output_url_goes_through_the_node_with_that_fabric_address() {
        let c = config();
        let t = resolve(&c, Some("endpoint")).unwrap();
        assert_eq!(
            (t.node.as_str(), t.port, t.path.as_str()),
            ("node.a", 30000, "/")
        );
        assert_eq!(resolve(&c, Some("output.endpoint")).unwrap(), t);
        // The only URL output is the default.
        assert_eq!(resolve(&c, None).unwrap(), t);
    }

    #[test]
    fn a_probe_goes_through_its_via_node_with_its_path() {
        let t = resolve(&config(), Some("probe.hello")).unwrap();
        assert_eq!(t.node, "node.b");
        assert_eq!((t.host.as_str(), t.port), ("127.0.0.1", 8000));
        assert_eq!(t.path, "/v1/models");
    }

    #[test]
    fn an_unknown_name_lists_the_candidates() {
        let e = resolve(&config(), Some("other")).unwrap_err();
        assert!(
            e.contains("output endpoint") && e.contains("probe.hello"),
            "{e}"
        );
    }

    #[test]
    fn the_local_url_keeps_the_path_as_written() {
        assert_eq!(path_as_written("http://10.0.0.1:30000"), "");
        assert_eq!(
            path_as_written("http://10.0.0.1:30000/v1/x?a=1"),
            "/v1/x?a=1"
        );
        assert_eq!(path_as_written("http://h?q"), "?q");
    }

    #[test]
    fn binds_default_to_loopback_and_refuse_others_unless_asked() {
        assert_eq!(
            bind_address(None, 30000, false).unwrap().to_string(),
            "127.0.0.1:30000"
        );
        assert_eq!(
            bind_address(Some("8080"), 1, false).unwrap().to_string(),
            "127.0.0.1:8080"
        );
        assert_eq!(
            bind_address(Some("[::1]:81"), 1, false)
                .unwrap()
                .to_string(),
            "[::1]:81"
        );
        let e = bind_address(Some("0.0.0.0:8080"), 1, false).unwrap_err();
        assert!(e.contains("--allow-remote-bind"), "{e}");
        assert!(bind_address(Some("0.0.0.0:8080"), 1, true).is_ok());
        assert!(bind_address(Some("x:80"), 1, false).is_err());
        assert!(bind_address(Some("127.0.0.1:http"), 1, false).is_err());
    }

    #[tokio::test]
    async fn connections_are_relayed_and_a_dead_remote_is_reported_once() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("f.sock");
        let remote = tokio::net::UnixListener::bind(&sock).unwrap();
        let server = tokio::spawn(async move {
            // The tunnel's liveness check (every 50 ms here) connects and closes without a
            // byte: only the relayed connection brings the ping, whichever is accepted first.
            loop {
                let (mut s, _) = remote.accept().await.unwrap();
                let mut b = [0u8; 4];
                if s.read_exact(&mut b).await.is_err() {
                    continue;
                }
                s.write_all(b"pong").await.unwrap();
                break;
            }
            // Then the remote side goes away: nothing listens on the socket any more.
            drop(remote);
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let local = listener.local_addr().unwrap();
        let t = Tunnel {
            listener,
            endpoint: Endpoint::Unix(sock.clone()),
            local,
            url: String::new(),
        };
        let (tx, mut notes) = mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        let serving = tokio::spawn(t.serve(Duration::from_millis(50), tx, cancel.clone()));
        let mut c = tokio::net::TcpStream::connect(local).await.unwrap();
        c.write_all(b"ping").await.unwrap();
        let mut b = [0u8; 4];
        c.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"pong");
        server.await.unwrap();
        let _ = std::fs::remove_file(&sock);
        let n = tokio::time::timeout(Duration::from_secs(5), notes.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(n.contains("stopped answering"), "{n}");
        // Said once, not at every check.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(notes.try_recv().is_err());
        cancel.cancel();
        serving.await.unwrap();
    }
}
