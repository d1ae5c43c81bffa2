//! What a user does to aim Slurm's daemons at another tenant's job, and where the job's owner
//! runs Slurm's clients from (the e2e tests of slurm_daemons.rs, multi_node.rs and
//! pure_cgroup_v2.rs; ARCHITECTURE.md, "What Slurm's daemons do for a job"):
//!
//! * [`port_rewrite`]: the LD_PRELOAD library (port_rewrite.c) that makes srun, sattach or
//!   salloc report the port of the user's choice, built with gcc in the user's folder;
//! * [`LoginNs`]: a second "login" host, a network namespace joined to the node by a veth
//!   pair, where the node's name resolves to the node's end of the pair;
//! * [`without_infrastructure`]: the config edit (`Options::config`) that lists no
//!   infrastructure, so nothing but the product's own rules lets Slurm's connections through.

use crate::daemons::write_file;
use crate::multi_node::ip;
use crate::{Cluster, TenancyToml, TestUser};
use anyhow::{bail, Context, Result};
use std::ffi::{CString, OsStr};
use std::fs;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// The variable port_rewrite.c reads.
pub const REWRITE_PORT_ENV: &str = "TENANCY_REWRITE_PORT";

/// Builds port_rewrite.c into `dir` (a folder `user` can read) with gcc: the path to give
/// `LD_PRELOAD`, with [`REWRITE_PORT_ENV`] set to the port.
pub fn port_rewrite(dir: &Path, user: &TestUser) -> Result<PathBuf> {
    let so = port_rewrite_in(dir)?;
    nix::unistd::chown(
        &so,
        Some(nix::unistd::Uid::from_raw(user.uid)),
        Some(nix::unistd::Gid::from_raw(user.gid)),
    )?;
    Ok(so)
}

/// [`port_rewrite`] owned by root (a node's copy: the UML node's `/tenancy-uml/bin`).
pub fn port_rewrite_in(dir: &Path) -> Result<PathBuf> {
    let src = dir.join("port_rewrite.c");
    fs::write(&src, include_str!("port_rewrite.c"))?;
    let so = dir.join("port_rewrite.so");
    let o = Command::new("gcc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&so)
        .arg(&src)
        .arg("-ldl")
        .output()
        .context("gcc (apt-get install gcc)")?;
    if !o.status.success() {
        bail!(
            "gcc {}: {}",
            src.display(),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(so)
}

/// No `[network] infrastructure` entry (`Options::default().config(without_infrastructure)`):
/// what Slurm needs must pass by the product's own rules.
pub fn without_infrastructure(c: &mut TenancyToml) {
    c.network().infrastructure(Vec::<&str>::new());
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A login host beside the node: a network namespace joined to the node's by a veth pair
/// (`10.243.<n>.1` on the node's side, `.2` on the login side), whose commands see the node's
/// name resolve to the node's side (a mount namespace with its own /etc/hosts). Removed on drop.
pub struct LoginNs {
    pub name: String,
    /// The node's address as the login host reaches it.
    pub node_addr: String,
    /// The login host's own address (what slurmd sees as the client's).
    pub addr: String,
    hosts: PathBuf,
}

impl LoginNs {
    /// A login host for `cluster`, its hosts file in the cluster's folder.
    pub fn new(cluster: &Cluster) -> Result<LoginNs> {
        let n = (std::process::id() * 4 + SEQ.fetch_add(1, Ordering::SeqCst)) % 250 + 1;
        let name = format!("tnlogin{}x{n}", std::process::id() % 100_000);
        let (node_addr, addr) = (format!("10.243.{n}.1"), format!("10.243.{n}.2"));
        let (host_end, login_end) = (format!("tnl{n}a"), format!("tnl{n}b"));
        ip(&["netns", "add", &name])?;
        let ns = LoginNs {
            name,
            node_addr,
            addr,
            hosts: cluster.path(&format!("etc/hosts-{n}")),
        };
        ip(&["-n", &ns.name, "link", "set", "lo", "up"])?;
        ip(&[
            "link", "add", &host_end, "type", "veth", "peer", "name", &login_end, "netns", &ns.name,
        ])?;
        ip(&[
            "addr",
            "add",
            &format!("{}/30", ns.node_addr),
            "dev",
            &host_end,
        ])?;
        ip(&["link", "set", &host_end, "up"])?;
        ip(&[
            "-n",
            &ns.name,
            "addr",
            "add",
            &format!("{}/30", ns.addr),
            "dev",
            &login_end,
        ])?;
        ip(&["-n", &ns.name, "link", "set", &login_end, "up"])?;
        write_file(
            &ns.hosts,
            &format!("127.0.0.1 localhost\n{} {}\n", ns.node_addr, cluster.node),
            0o644,
        )?;
        Ok(ns)
    }

    /// `program` as `user` on the login host: [`crate::Client::cmd_as`]'s environment, in the login
    /// namespace, with its /etc/hosts (the release root's, when the cluster runs in one).
    pub fn cmd_as(
        &self,
        cluster: &Cluster,
        user: &TestUser,
        program: impl AsRef<OsStr>,
    ) -> Command {
        let mut c = Command::new(program);
        let netns: OwnedFd = fs::File::open(format!("/run/netns/{}", self.name))
            .expect("the login namespace")
            .into();
        let hosts = CString::new(self.hosts.as_os_str().as_encoded_bytes()).expect("path");
        let target = match cluster.slurm_root() {
            Some(root) => root.dir.join("etc/hosts"),
            None => PathBuf::from("/etc/hosts"),
        };
        let target = CString::new(target.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: setns, unshare and mount are async-signal-safe; the strings and the fd were
        // made before the fork. This runs before the cluster's chroot and the drop to the user.
        unsafe {
            c.pre_exec(move || {
                if libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) != 0
                    || libc::unshare(libc::CLONE_NEWNS) != 0
                    || libc::mount(
                        std::ptr::null(),
                        c"/".as_ptr(),
                        std::ptr::null(),
                        libc::MS_REC | libc::MS_PRIVATE,
                        std::ptr::null(),
                    ) != 0
                    || libc::mount(
                        hosts.as_ptr(),
                        target.as_ptr(),
                        std::ptr::null(),
                        libc::MS_BIND,
                        std::ptr::null(),
                    ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cluster.as_user(c, user)
    }
}

impl Drop for LoginNs {
    fn drop(&mut self) {
        // The veth pair goes with the namespace.
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
        let _ = fs::remove_file(&self.hosts);
    }
}
