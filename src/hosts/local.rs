//! This machine (`address = "local"`): processes and the local Docker socket, no SSH.

use std::path::Path;

use async_trait::async_trait;
use tokio::sync::Mutex;

use super::{docker_on_socket, Cmd, Counter, Endpoint, Host, HostError, Output, RoundTrips};

pub struct LocalHost {
    node: String,
    docker: Mutex<Option<bollard::Docker>>,
    trips: Counter,
}

impl LocalHost {
    pub fn new(node: &str) -> Self {
        LocalHost {
            node: node.to_string(),
            docker: Mutex::new(None),
            trips: Counter::default(),
        }
    }
}

#[async_trait]
impl Host for LocalHost {
    fn node(&self) -> &str {
        &self.node
    }

    fn round_trips(&self) -> RoundTrips {
        self.trips.get()
    }

    async fn exec(&self, cmd: &Cmd) -> Result<Output, HostError> {
        super::logged_exec(&self.node, cmd, self.run_command(cmd)).await
    }

    async fn docker(&self) -> Result<bollard::Docker, HostError> {
        let mut cached = self.docker.lock().await;
        if let Some(d) = cached.as_ref() {
            return Ok(d.clone());
        }
        let d =
            docker_on_socket(&self.node, Path::new("/var/run/docker.sock"), &self.trips).await?;
        *cached = Some(d.clone());
        Ok(d)
    }

    async fn forward(&self, host: &str, port: u16) -> Result<Endpoint, HostError> {
        Ok(Endpoint::Tcp(host.to_string(), port))
    }

    async fn close(&self) {
        self.docker.lock().await.take();
    }
}
impl LocalHost {
    /// Run `cmd` on the machine (its log is `Host::exec`'s).
    async fn run_command(&self, cmd: &Cmd) -> Result<Output, HostError> {
        self.trips.exec();
        let mut c = tokio::process::Command::new(&cmd.program);
        c.args(&cmd.args)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        match tokio::time::timeout(cmd.timeout, c.output()).await {
            Err(_) => Err(HostError::Timeout {
                node: self.node.clone(),
                command: cmd.display(),
                seconds: cmd.timeout.as_secs(),
            }),
            // A missing program is what a remote shell reports as exit 127.
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => Ok(Output {
                code: Some(127),
                stdout: String::new(),
                stderr: format!("{}: command not found", cmd.program),
            }),
            Ok(Err(e)) => Err(HostError::Other {
                node: self.node.clone(),
                message: format!("cannot run `{}`: {e}", cmd.display()),
            }),
            Ok(Ok(o)) => Ok(Output {
                code: o.status.code(),
                stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
            }),
        }
    }
}
