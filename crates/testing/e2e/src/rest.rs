//! slurmrestd for the e2e tests: Debian's `slurmrestd` with `rest_auth/jwt`, listening on a
//! free port of 127.0.0.1, started by the test and stopped by pid; the JWT key is one the test
//! makes (slurm.conf `AuthAltTypes=auth/jwt`, `AuthAltParameters=jwt_key=`), the users' tokens
//! come from `scontrol token`.

use crate::daemons::{free_port, spawn_daemon, stop_child};
use crate::{Cluster, TestUser};
use anyhow::{anyhow, bail, Context, Result};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// Writes a random JWT key (root's alone) into `dir`; returns the slurm.conf lines that use it.
pub fn jwt_conf(dir: &Path) -> Result<Vec<String>> {
    std::fs::create_dir_all(dir)?;
    let key = dir.join("jwt.key");
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    std::fs::write(&key, bytes)?;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))?;
    Ok(vec![
        "AuthAltTypes=auth/jwt".into(),
        format!("AuthAltParameters=jwt_key={}", key.display()),
    ])
}

/// A running slurmrestd.
pub struct Rest {
    pub port: u16,
    pub log: PathBuf,
    child: Child,
}

impl Rest {
    /// Starts slurmrestd for `cluster` as user nobody, with the OpenAPI plugins `specs`
    /// (e.g. `openapi/v0.0.38`: slurmctld's alone; the slurmdbd ones need accounting), and
    /// waits until it answers. The host's Slurm only: Debian's slurmrestd speaks its own release's protocol.
    pub fn start(cluster: &Cluster, specs: &str) -> Result<Rest> {
        if let Some(root) = cluster.slurm_root() {
            bail!(
                "slurmrestd runs on the host's Slurm only, not on Slurm {}",
                root.release
            );
        }
        let port = free_port()?;
        let log = cluster.path("log/slurmrestd.log");
        let mut cmd = Command::new("slurmrestd");
        // SLURM_JWT=daemon: slurmrestd talks to slurmctld with each request's token (auth/jwt)
        // instead of its own munge credential (Slurm's jwt.shtml).
        cmd.env("SLURM_CONF", &cluster.conf)
            .env("SLURM_JWT", "daemon")
            .args(["-a", "rest_auth/jwt", "-s", specs, "-u", "nobody", "-vv"])
            .arg(format!("127.0.0.1:{port}"));
        let child = spawn_daemon("slurmrestd", &mut cmd, &log)
            .context("slurmrestd (apt-get install slurmrestd)")?;
        let mut rest = Rest { port, log, child };
        let t = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(s) = rest.child.try_wait()? {
                bail!(
                    "slurmrestd exited ({s}): {}",
                    std::fs::read_to_string(&rest.log).unwrap_or_default()
                );
            }
            if t.elapsed() > Duration::from_secs(20) {
                bail!("slurmrestd did not listen on 127.0.0.1:{port} within 20 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(rest)
    }

    /// A JWT for `user` from slurmctld (`scontrol token`, as root).
    pub fn token(cluster: &Cluster, user: &TestUser) -> Result<String> {
        let mut c = cluster.cmd("scontrol");
        c.args(["token", &format!("username={}", user.name), "lifespan=3600"]);
        let o = cluster.run(c)?;
        let out = String::from_utf8_lossy(&o.stdout);
        out.trim()
            .strip_prefix("SLURM_JWT=")
            .map(String::from)
            .ok_or_else(|| {
                anyhow!(
                    "scontrol token: {out}{}",
                    String::from_utf8_lossy(&o.stderr)
                )
            })
    }

    /// `POST path` with `body` as `user` (their token); the HTTP status and the JSON answer.
    pub fn post(
        &self,
        path: &str,
        user: &TestUser,
        token: &str,
        body: &serde_json::Value,
    ) -> Result<(u16, serde_json::Value)> {
        let body = body.to_string();
        let mut s = TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(60)))?;
        // One write: slurmrestd 22.05 fails a request whose URL arrives split across reads
        // ("Invalid non-null terminated URL").
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-SLURM-USER-NAME: {}\r\n\
             X-SLURM-USER-TOKEN: {token}\r\nContent-Type: application/json\r\n\
             Accept: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            user.name,
            body.len()
        );
        s.write_all(request.as_bytes())?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw)?;
        let text = String::from_utf8_lossy(&raw).to_string();
        let (head, rest) = text
            .split_once("\r\n\r\n")
            .ok_or_else(|| anyhow!("no HTTP answer: {text:?}"))?;
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| anyhow!("no HTTP status: {head:?}"))?;
        let chunked = head.lines().any(|l| {
            l.to_ascii_lowercase()
                .starts_with("transfer-encoding: chunked")
        });
        let body = if chunked {
            dechunk(rest)
        } else {
            rest.to_string()
        };
        // slurmrestd 22.05 may write a stray header line after the body, without a
        // Content-Length: the answer is the first JSON value.
        let json = serde_json::Deserializer::from_str(&body)
            .into_iter::<serde_json::Value>()
            .next()
            .ok_or_else(|| anyhow!("empty answer"))
            .and_then(|v| v.map_err(anyhow::Error::from))
            .with_context(|| format!("slurmrestd's answer ({status}): {body:?}"))?;
        Ok((status, json))
    }

    /// Stops slurmrestd (by pid). Idempotent.
    pub fn stop(&mut self) -> Result<()> {
        stop_child(&mut self.child)
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

impl Drop for Rest {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}
