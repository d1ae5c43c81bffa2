//! A real OpenSSH server for the e2e tests of ssh sessions into jobs: Debian's sshd with
//! Slurm's pam_slurm_adopt in the account phase and `tenancyctl adopt` (pam_exec) in the
//! session phase, as docs/admin-guide.md tells an admin to set it up.
//!
//! It runs from the cluster folder on a free port of 127.0.0.1 with its own host key and
//! authorized keys, under a PAM service of its own: OpenSSH names its PAM service after the
//! program it was started as, so it is started through a symlink named like a service file
//! it writes in /etc/pam.d (removed again on Drop, when the server is stopped by pid).

use crate::daemons::{free_port, spawn_daemon, write_file};
use crate::{Cluster, TestUser};
use anyhow::{bail, Context, Result};
use std::fs;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Output};
use std::time::{Duration, Instant};

const SSHD: &str = "/usr/sbin/sshd";
/// Where Debian's libpam-slurm-adopt and other distributions put the module.
const PAM_DIRS: [&str; 4] = [
    "/lib/security",
    "/lib/x86_64-linux-gnu/security",
    "/usr/lib/x86_64-linux-gnu/security",
    "/usr/lib64/security",
];

/// What the PAM service runs in the session phase, after pam_slurm_adopt.
pub enum SessionHook {
    /// `pam_exec.so PROGRAM ARGS...` (tenancyctl adopt).
    Exec(Vec<String>),
    /// A PAM module (pam_tenancy.so) with its arguments.
    Module(PathBuf, Vec<String>),
}

pub struct Sshd {
    dir: PathBuf,
    port: u16,
    pam_service: PathBuf,
    made_privsep_dir: bool,
    child: Option<Child>,
}

/// pam_slurm_adopt.so, when installed.
fn pam_slurm_adopt() -> Option<PathBuf> {
    PAM_DIRS
        .iter()
        .map(|d| Path::new(d).join("pam_slurm_adopt.so"))
        .find(|p| p.is_file())
}

impl Sshd {
    /// Starts sshd for `users` (their key is the server's client key), with `hook` in the
    /// session phase. None, with a SKIP line, when openssh-server or libpam-slurm-adopt is not
    /// installed (scripts/install-deps installs both; under CI their absence is an error).
    pub fn start(
        cluster: &Cluster,
        hook: &SessionHook,
        users: &[&TestUser],
    ) -> Result<Option<Sshd>> {
        let Some(adopt_module) = pam_slurm_adopt() else {
            return missing("pam_slurm_adopt.so (Debian package libpam-slurm-adopt)");
        };
        if !Path::new(SSHD).is_file() {
            return missing("/usr/sbin/sshd (Debian package openssh-server)");
        }
        let port = free_port()?;
        let dir = cluster.path(&format!("sshd-{port}"));
        write_keys(&dir, users)?;
        let service = format!("tenancy-e2e-sshd-{}", std::process::id());
        let pam_service = Path::new("/etc/pam.d").join(&service);
        write_pam_service(&pam_service, &service, &adopt_module, hook, &dir)?;
        let mut sshd = Sshd {
            dir: dir.clone(),
            port,
            pam_service,
            made_privsep_dir: false,
            child: None,
        };
        // Privilege separation's empty chroot (systemd's tmpfiles makes it on a booted host).
        let privsep = Path::new("/run/sshd");
        if !privsep.exists() {
            fs::create_dir_all(privsep)?;
            sshd.made_privsep_dir = true;
        }
        let config = write_config(&dir, port)?;
        let program = dir.join(&service);
        std::os::unix::fs::symlink(SSHD, &program)?;
        let mut cmd = cluster.cmd(&program);
        // -D: stay in the foreground (stopped by pid); -e: log to stderr (the log file).
        cmd.arg("-D").arg("-e").arg("-f").arg(&config);
        sshd.child = Some(spawn_daemon("sshd", &mut cmd, &dir.join("sshd.log"))?);
        let t = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if t.elapsed() > Duration::from_secs(10) {
                bail!(
                    "sshd did not listen on port {port} within 10 s: {}",
                    sshd.log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Some(sshd))
    }

    /// `ssh user@127.0.0.1 command` with the client key, as root's ssh client.
    pub fn ssh(&self, cluster: &Cluster, user: &TestUser, command: &str) -> Result<Output> {
        let mut c = cluster.cmd("ssh");
        c.args(["-F", "/dev/null", "-p", &self.port.to_string(), "-i"])
            .arg(self.dir.join("client_ed25519"))
            .args([
                "-o",
                "IdentitiesOnly=yes",
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
                "-o",
                "BatchMode=yes",
                "-o",
                "ConnectTimeout=10",
                "-o",
                "LogLevel=ERROR",
                "-l",
                &user.name,
                "127.0.0.1",
                command,
            ]);
        cluster.run(c)
    }

    /// The server's log and the pam_exec log, for failure messages.
    pub fn log(&self) -> String {
        let read = |f: &str| fs::read_to_string(self.dir.join(f)).unwrap_or_default();
        format!(
            "sshd.log:\n{}\npam_exec.log:\n{}",
            read("sshd.log"),
            read("pam_exec.log")
        )
    }
}

/// The host key, the client key, and the client key authorized for each of `users`.
fn write_keys(dir: &Path, users: &[&TestUser]) -> Result<()> {
    fs::create_dir_all(dir.join("keys"))?;
    let keygen = |file: &Path| -> Result<()> {
        let o = std::process::Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", "tenancy-e2e", "-f"])
            .arg(file)
            .output()
            .context("run ssh-keygen")?;
        if !o.status.success() {
            bail!("ssh-keygen: {}", String::from_utf8_lossy(&o.stderr));
        }
        Ok(())
    };
    keygen(&dir.join("host_ed25519"))?;
    keygen(&dir.join("client_ed25519"))?;
    let public = fs::read_to_string(dir.join("client_ed25519.pub"))?;
    for u in users {
        write_file(&dir.join("keys").join(&u.name), &public, 0o644)?;
    }
    Ok(())
}

/// The PAM service `service`: pam_slurm_adopt in the account phase, `hook` in the session.
fn write_pam_service(
    path: &Path,
    service: &str,
    adopt_module: &Path,
    hook: &SessionHook,
    dir: &Path,
) -> Result<()> {
    let session = match hook {
        SessionHook::Exec(argv) => format!(
            "pam_exec.so log={} {}",
            dir.join("pam_exec.log").display(),
            argv.join(" ")
        ),
        SessionHook::Module(module, args) => {
            format!("{} {}", module.display(), args.join(" "))
        }
    };
    // Public key logins only: sshd asks PAM for the account and the session, not auth.
    write_file(
        path,
        &format!(
            "# slurm-tenancy e2e test (removed when the test's sshd stops)\n\
             auth     required pam_deny.so\n\
             account  required {} action_no_jobs=deny action_unknown=deny \
             action_adopt_failure=deny action_generic_failure=deny service={service}\n\
             password required pam_deny.so\n\
             session  required {session}\n",
            adopt_module.display(),
        ),
        0o644,
    )
}

/// sshd_config: port `port` of 127.0.0.1, the folder's keys, public key logins through PAM.
fn write_config(dir: &Path, port: u16) -> Result<PathBuf> {
    let config = dir.join("sshd_config");
    write_file(
        &config,
        &format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {host}\nPidFile {pid}\n\
             UsePAM yes\nPubkeyAuthentication yes\nPasswordAuthentication no\n\
             KbdInteractiveAuthentication no\nAuthorizedKeysFile {keys}/%u\nStrictModes no\n\
             PermitRootLogin no\nUseDNS no\nPrintMotd no\nPrintLastLog no\n\
             AllowTcpForwarding no\nX11Forwarding no\nLogLevel VERBOSE\n",
            host = dir.join("host_ed25519").display(),
            pid = dir.join("sshd.pid").display(),
            keys = dir.join("keys").display(),
        ),
        0o600,
    )?;
    Ok(config)
}

fn missing(what: &str) -> Result<Option<Sshd>> {
    tenancy_test_support::skip(
        &format!("not installed: {what}"),
        "ssh sessions through a real sshd (scripts/install-deps installs it)",
    );
    Ok(None)
}

impl Drop for Sshd {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = child.wait();
        }
        let _ = fs::remove_file(&self.pam_service);
        if self.made_privsep_dir {
            let _ = fs::remove_dir(Path::new("/run/sshd"));
        }
    }
}
